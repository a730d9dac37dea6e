"""Turning the rows of one batch into the format a caller asked for (numpy or pandas).

Columnar tables give `{column: array}` batches directly. Row tables give a list of rows, which are
collated: dicts key by key, tuples position by position, leaves stacked into arrays (a list is a
leaf, as in Ray; ragged leaves become an object array). Torch conversion is in `torch_batches`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from minitrain.data.tables import numpy_columns

BATCH_FORMATS = ("default", "numpy", "pandas")


def check_batch_format(batch_format: str) -> None:
    """ValueError naming the supported formats for anything else."""
    if batch_format not in BATCH_FORMATS:
        raise ValueError(f"batch_format={batch_format!r} is not supported; use one of {BATCH_FORMATS} "
                         "('default' and 'numpy' give a dict of numpy arrays).")


def numpy_collate(rows: list) -> Any:
    """A list of rows as one batch: dicts by key, tuples by position, leaves (lists included) as stacked
    arrays (an object array of arrays when they are ragged)."""
    first = rows[0]
    if isinstance(first, Mapping):
        return {key: numpy_collate([row[key] for row in rows]) for key in first}
    if isinstance(first, tuple) and hasattr(first, "_fields"):  # a namedtuple keeps its type
        return type(first)(*(numpy_collate(list(column)) for column in zip(*rows)))
    if isinstance(first, tuple) and all(isinstance(row, tuple) and len(row) == len(first) for row in rows):
        return tuple(numpy_collate(list(column)) for column in zip(*rows))
    return _stack([np.asarray(row) for row in rows])  # lists are values (e.g. token ids), not structure


def _stack(leaves: list[np.ndarray]) -> np.ndarray:
    try:
        return np.stack(leaves)
    except ValueError:  # ragged leaves (e.g. variable-length token lists)
        ragged = np.empty(len(leaves), dtype=object)
        ragged[:] = leaves
        return ragged


def format_batch(batch: Any, batch_format: str) -> Any:
    """`batch` (a dict of arrays, or a collated row structure) in `batch_format`: a pandas DataFrame
    keeps pandas extension columns (categorical, nullable ints, timezone-aware datetimes) as they are;
    "default"/"numpy" give them as numpy arrays of their values."""
    if batch_format == "pandas":
        import pandas as pd

        if not isinstance(batch, Mapping):
            batch = {"item": batch}
        return pd.DataFrame({key: list(value) if getattr(value, "ndim", 1) > 1 else value
                             for key, value in batch.items()})
    if isinstance(batch, dict):
        return numpy_columns(batch)  # pandas extension columns (categorical, ...) as numpy values
    return batch
