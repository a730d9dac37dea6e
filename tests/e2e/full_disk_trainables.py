"""The trial function of tests/e2e/test_tune_full_disk.py, in a module of its own (trial processes import it)."""

from __future__ import annotations

import os
import tempfile

import minitrain
from minitrain import tune


def heavy(config):
    """20 iterations, each with a 256 KiB checkpoint: a small filesystem fills up mid-sweep."""
    start = 0
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as path:
            start = int(open(os.path.join(path, "step")).read()) + 1
    for step in range(start, 20):
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "w.bin"), "wb") as handle:
                handle.write(os.urandom(256 * 1024))
            with open(os.path.join(tmp, "step"), "w") as handle:
                handle.write(str(step))
            tune.report({"loss": 1.0 / (step + 1), "step": step}, checkpoint=minitrain.Checkpoint.from_directory(tmp))
