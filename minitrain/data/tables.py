"""In-memory tables a pass reads from: named equal-length columns, or a sequence of rows.

`ColumnTable` holds numpy arrays (what `from_numpy`, `from_pandas`, the file readers and a dict of
arrays give). `RowTable` wraps anything with `__len__` and `__getitem__` (a list of rows, a map-style
torch Dataset) and fetches rows one by one; `wrap_key` turns each row that is not a dict into
`{wrap_key: row}`, as Ray's `from_items`/`from_torch` do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional, Sequence

import numpy as np

from minitrain.errors import ConfigError


def as_column(values: Any, where: str) -> np.ndarray:
    """`values` (numpy array, torch tensor, list) as a numpy array of at least one dimension.

    Tensors are copied to host memory; lists of strings become a fixed-width string array.
    ConfigError naming `where` when the value is a scalar or a tensor numpy cannot hold.
    """
    if hasattr(values, "detach") and hasattr(values, "cpu"):  # a torch tensor, without importing torch
        try:
            values = values.detach().cpu().numpy()
        except (TypeError, RuntimeError) as exc:
            raise ConfigError(f"{where} is a tensor of dtype {values.dtype}, which numpy cannot hold ({exc}). "
                              "Convert it first, e.g. tensor.float().") from None
    array = np.asarray(values)
    if array.ndim == 0:
        raise ConfigError(f"{where} is a scalar ({type(values).__name__}); a column needs one value per row, "
                          "e.g. a list, a numpy array or a tensor.")
    if array.dtype == object and array.ndim == 1 and len(array) and all(isinstance(v, str) for v in array):
        array = array.astype(str)
    return array


def stack_values(values: Sequence[Any]) -> Optional[np.ndarray]:
    """Array-valued cells (lists, tuples, numpy arrays of numbers or bools) as one column, as Ray Data
    stores them: a `[rows, ...]` array when every cell has the same shape, else (ragged cells, e.g.
    variable-length token lists) a 1-D object array holding one array per row. None when a cell is not
    numeric (strings, mixed or nested objects): such values are not columns."""
    try:
        cells = [np.asarray(value) for value in values]
    except (ValueError, OverflowError):  # nested lists of unequal lengths
        return None
    if not cells or any(cell.ndim == 0 or cell.dtype.kind not in "biufc" for cell in cells):
        return None
    if len({cell.shape for cell in cells}) == 1:
        return np.stack(cells)
    ragged = np.empty(len(cells), dtype=object)
    for position, cell in enumerate(cells):  # one by one: assigning the list could broadcast
        ragged[position] = cell
    return ragged


class ColumnTable:
    """Named columns of equal length. `take(indices)` -> dict of column -> numpy array."""

    __slots__ = ("columns", "num_rows")

    def __init__(self, columns: Mapping[str, np.ndarray], where: str = "the dataset"):
        if not columns:
            raise ConfigError(f"{where} has no columns; give at least one, e.g. {{'x': array}}.")
        lengths = {name: len(array) for name, array in columns.items()}
        if len(set(lengths.values())) > 1:
            described = ", ".join(f"{name!r} has {n}" for name, n in lengths.items())
            raise ConfigError(f"{where} has columns of unequal lengths ({described} rows). Every column must "
                              "have one value per row.")
        self.columns = dict(columns)
        self.num_rows = next(iter(lengths.values()))

    def __len__(self) -> int:
        return self.num_rows

    def take(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        """The rows at `indices` as a dict of column -> array (copies, never views), in that order."""
        if len(indices) and indices[-1] - indices[0] == len(indices) - 1 and _is_range(indices):
            start, stop = int(indices[0]), int(indices[-1]) + 1  # a contiguous run: copy a slice, no gather
            return {name: np.array(array[start:stop]) for name, array in self.columns.items()}
        return {name: np.asarray(array[indices]) for name, array in self.columns.items()}

    def row(self, index: int) -> dict[str, Any]:
        """Row `index` as a dict of column -> value."""
        return {name: array[index] for name, array in self.columns.items()}


def _is_range(indices: np.ndarray) -> bool:
    return bool(np.all(np.diff(indices) == 1))


class RowTable:
    """Rows fetched by index from a sequence or a map-style dataset. `take(indices)` -> list of rows."""

    __slots__ = ("rows", "wrap_key")

    def __init__(self, rows: Sequence, wrap_key: Optional[str] = None):
        self.rows = rows
        self.wrap_key = wrap_key

    @property
    def num_rows(self) -> int:
        """Number of rows (`len` of the underlying sequence or dataset)."""
        return len(self.rows)

    def __len__(self) -> int:
        return self.num_rows

    def take(self, indices: np.ndarray) -> list:
        """The rows at `indices`, in that order."""
        return [self.row(index) for index in indices.tolist()]

    def row(self, index: int) -> Any:
        """Row `index`; with a wrap key, a row that is not a dict is returned as `{wrap_key: row}`."""
        value = self.rows[index]
        if self.wrap_key is None or isinstance(value, Mapping):
            return value
        return {self.wrap_key: value}


def concat_columns(tables: list[dict[str, np.ndarray]], names: list[str]) -> dict[str, np.ndarray]:
    """Column dicts concatenated row-wise; ConfigError naming the part (from `names`) whose columns differ."""
    if not tables:
        return {}
    first = list(tables[0])
    for table, name in zip(tables[1:], names[1:]):
        if list(table) != first:
            raise ConfigError(f"{name} has columns {list(table)}, but {names[0]} has {first}; every part of a "
                              "dataset must have the same columns.")
    if len(tables) == 1:
        return dict(tables[0])
    return {column: np.concatenate([table[column] for table in tables]) for column in first}


def pandas_table(dfs: Any) -> ColumnTable:
    """The rows of a pandas DataFrame (or a list of them, concatenated) as columns, one per DataFrame
    column (the index is dropped); the error of a column that is not rows names it."""
    frames = dfs if isinstance(dfs, (list, tuple)) else [dfs]
    parts, names = [], []
    for i, frame in enumerate(frames):
        where = f"from_pandas(dfs[{i}])" if isinstance(dfs, (list, tuple)) else "from_pandas(df)"
        parts.append({str(c): as_column(frame[c].to_numpy(), f"column {c!r} of {where}") for c in frame.columns})
        names.append(where)
    return ColumnTable(concat_columns(parts, names), "from_pandas(...)")
