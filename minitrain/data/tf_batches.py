"""Batches as TensorFlow tensors for `DataIterator.to_tf` (imports tensorflow inside its functions only).

Used in the training function, never by the driver's own code paths, so `import minitrain.data` and
the trainer stay free of tensorflow. The column checks need no tensorflow, so a wrong column name
fails the same way wherever it is asked.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Optional, Union

import numpy as np

from minitrain.data.batches import numpy_collate
from minitrain.data.tables import ColumnTable

Columns = Union[str, list]


def check_columns(columns: Any, argument: str, available: list[str], optional: bool = False) -> None:
    """ValueError (Ray's wording, plus the argument's name) unless `columns` is a column name or a
    non-empty list of names, each a column of the dataset (`available`); None too when `optional`."""
    if optional and columns is None:
        return
    names = [columns] if isinstance(columns, str) else columns
    if not isinstance(names, list) or not names or not all(isinstance(name, str) for name in names):
        raise ValueError(f"to_tf({argument}={columns!r}): give a column name or a non-empty list of column names.")
    for name in names:
        if name not in available:
            raise ValueError(f"You specified '{name}' in `{argument}`, but there's no column named '{name}' in the "
                             f"dataset. Valid column names are: {sorted(available)}.")


def column_samples(table: Any, where: str) -> dict[str, np.ndarray]:
    """One array per column with the dtype and per-row shape of the column: the columns themselves for a
    columnar table, the first row collated for a row table. ValueError when the rows are not dicts
    (to_tf needs named columns) or a row table is empty (there is nothing to infer a type from)."""
    if isinstance(table, ColumnTable):
        return dict(table.columns)
    if table.num_rows == 0:
        raise ValueError(f"to_tf on {where}: the shard has no rows to infer the columns' types from; pass "
                         "feature_type_spec and label_type_spec (and additional_type_spec).")
    first = numpy_collate([table.row(0)])
    if not isinstance(first, Mapping):
        raise ValueError(f"to_tf on {where}: its rows are {type(table.row(0)).__name__}, not dicts of column -> "
                         "value, so there are no columns to name. Build the dataset with named columns "
                         "(from_items([{'x': ..., 'y': ...}]), from_numpy({'x': ..., 'y': ...}), from_pandas).")
    return dict(first)


def type_spec(sample: np.ndarray, name: str) -> Any:
    """The `tf.TensorSpec` of a batch of column `name` (Ray's inference): `(None, *per-row shape)` and the
    column's dtype (strings: tf.string). ValueError for ragged (object) columns, which Ray refuses too."""
    import tensorflow as tf

    if sample.dtype.kind == "O" and not _all_str(sample):
        raise ValueError(f"to_tf: column {name!r} holds ragged or mixed values (a numpy object column), which "
                         "TensorFlow tensors cannot hold; pad its rows to one shape first.")
    dtype = tf.string if sample.dtype.kind in "USO" else tf.as_dtype(sample.dtype)
    return tf.TensorSpec(shape=(None, *sample.shape[1:]), dtype=dtype, name=name)


def _all_str(values: np.ndarray) -> bool:
    return all(isinstance(value, (str, bytes)) for value in values.ravel())


def type_specs(samples: Mapping[str, np.ndarray], columns: Columns, given: Any, argument: str) -> Any:
    """The spec of `columns`: one `tf.TypeSpec` for a column name, a dict of them for a list. `given`
    (the caller's `<argument>`) is used when not None, after checking its form."""
    import tensorflow as tf

    if given is not None:
        if isinstance(columns, str) and not isinstance(given, tf.TypeSpec):
            raise ValueError(f"to_tf({argument}={given!r}): for the single column {columns!r} give a tf.TypeSpec, "
                             "e.g. tf.TensorSpec(shape=(None,), dtype=tf.float32).")
        if isinstance(columns, list) and (not isinstance(given, Mapping) or set(given) != set(columns)
                                          or not all(isinstance(s, tf.TypeSpec) for s in given.values())):
            raise ValueError(f"to_tf({argument}=...): for the columns {columns} give a dict of column -> tf.TypeSpec "
                             "with exactly those keys.")
        return given
    if isinstance(columns, str):
        return type_spec(np.asarray(samples[columns]), columns)
    return {name: type_spec(np.asarray(samples[name]), name) for name in columns}


def to_tensors(batch: Mapping[str, np.ndarray], columns: Columns, spec: Any) -> Any:
    """The batch's `columns` as tensors of `spec`'s dtypes: one tensor, or a dict of them."""
    import tensorflow as tf

    if isinstance(columns, str):
        return tf.convert_to_tensor(batch[columns], dtype=spec.dtype)
    return {name: tf.convert_to_tensor(batch[name], dtype=spec[name].dtype) for name in columns}


def dataset(batches: Iterable, features: Columns, labels: Columns, additional: Optional[Columns],
            specs: tuple) -> Any:
    """A `tf.data.Dataset` over `batches` (dicts of column -> array; each iteration of the dataset
    iterates `batches` again) yielding `(features, labels)` or `(features, labels, additional)`, with
    auto-sharding off: the rows are already this rank's shard."""
    import tensorflow as tf

    parts = [features, labels] + ([additional] if additional is not None else [])

    def generator():
        for batch in batches:
            yield tuple(to_tensors(batch, columns, spec) for columns, spec in zip(parts, specs))

    result = tf.data.Dataset.from_generator(generator, output_signature=tuple(specs))
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return result.with_options(options)
