"""`TensorflowCheckpoint`: a checkpoint holding one saved Keras model, as Ray's (L3; tensorflow imported on use)."""

from __future__ import annotations

import os
import tempfile
from typing import Any

from minitrain.checkpoint import Checkpoint


class TensorflowCheckpoint(Checkpoint):
    """A `minitrain.Checkpoint` whose directory holds a Keras model saved whole by `from_model`
    (`model.keras`, Keras' own format), named in its metadata under `MODEL_FILENAME_KEY`, as Ray's.

    Open a reported checkpoint with `TensorflowCheckpoint(checkpoint.path,
    filesystem=checkpoint.filesystem).get_model()`, or load `model.keras` from `checkpoint.as_directory()`.
    """

    MODEL_FILENAME_KEY = "_model_filename"
    MODEL_FILENAME = "model.keras"

    @classmethod
    def from_model(cls, model: Any, *, preprocessor: Any = None) -> "TensorflowCheckpoint":
        """A checkpoint in a new temporary directory holding `model.save(<dir>/model.keras)`; the caller
        owns the directory (`ReportCheckpointCallback` deletes it after reporting). Under a
        distribution strategy every worker must call this together (saving reads the model's
        variables, and reading some of them is a collective). `preprocessor` (Ray AIR's) is refused:
        save it into the directory yourself."""
        if preprocessor is not None:
            raise ValueError("TensorflowCheckpoint.from_model(preprocessor=...) is not supported (Ray removed "
                             "checkpoint preprocessors): save it as a file in the checkpoint directory instead.")
        directory = tempfile.mkdtemp(prefix="minitrain_keras_")
        model.save(os.path.join(directory, cls.MODEL_FILENAME))
        checkpoint = cls.from_directory(directory)
        checkpoint.update_metadata({cls.MODEL_FILENAME_KEY: cls.MODEL_FILENAME})
        return checkpoint

    def get_model(self) -> Any:
        """The Keras model saved in this checkpoint (`tf.keras.models.load_model`, so the Keras that
        `tf.keras` resolves to). ValueError when the checkpoint was not made by `from_model`."""
        filename = self.get_metadata().get(self.MODEL_FILENAME_KEY)
        if not filename:
            raise ValueError(f"{self!r} names no model file in its metadata ({self.MODEL_FILENAME_KEY!r}); it was "
                             "not made by TensorflowCheckpoint.from_model. Load your files from "
                             "checkpoint.as_directory() yourself.")
        import tensorflow as tf

        with self.as_directory() as directory:
            return tf.keras.models.load_model(os.path.join(directory, filename))
