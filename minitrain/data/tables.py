"""In-memory tables a pass reads from: named equal-length columns, or a sequence of rows.

`ColumnTable` holds numpy arrays (what `from_numpy`, `from_pandas`, the file readers and a dict of
arrays give), and keeps pandas extension arrays (categorical, timezone-aware datetimes, nullable
ints/floats/bools) as they are, so a `from_pandas` column reaches a pandas batch with its dtype, as in
Ray; numpy-format batches get them converted (`numpy_columns`). `RowTable` wraps anything with
`__len__` and `__getitem__` (a list of rows, a map-style torch Dataset) and fetches rows one by one;
`wrap_key` turns each row that is not a dict into `{wrap_key: row}`, as Ray's `from_items`/`from_torch` do.
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


def rows_to_columns(rows: Sequence[Any], wrap_key: Optional[str] = None) -> Optional[dict[str, np.ndarray]]:
    """A non-empty list of rows as columns when that loses nothing, else None. Dicts sharing their
    (str) keys become one column per key; with `wrap_key`, plain values become the column `wrap_key`.
    Every column must stack (`stacked_values`)."""
    if not rows:
        return None
    if all(isinstance(row, Mapping) for row in rows):
        keys = list(rows[0])
        if not keys or any(list(row) != keys for row in rows) or not all(isinstance(k, str) for k in keys):
            return None
        raw = {key: [row[key] for row in rows] for key in keys}
    elif wrap_key is not None and not any(isinstance(row, Mapping) for row in rows):
        raw = {wrap_key: list(rows)}
    else:
        return None
    columns = {}
    for key, values in raw.items():
        array = stacked_values(values)
        if array is None:
            return None
        columns[key] = array
    return columns


def stacked_values(values: list) -> Optional[np.ndarray]:
    """`values` as one array when that loses nothing: scalars of one kind (numbers or strings), or
    list/array cells of numbers (`stack_values`: `[rows, ...]`, or one array per row when ragged, as Ray
    Data stores list columns). None otherwise (tensors, strings in lists, mixed values)."""
    if all(isinstance(v, (list, tuple, np.ndarray)) for v in values):
        return stack_values(values)
    if all(isinstance(v, str) for v in values):
        return np.asarray(values)
    if all(isinstance(v, (bool, int, float, np.bool_, np.number)) for v in values):
        try:
            return np.asarray(values)
        except OverflowError:
            return None
    if all(isinstance(v, np.datetime64) for v in values) or all(isinstance(v, np.timedelta64) for v in values):
        return np.asarray(values)
    return None


def is_extension(array: Any) -> bool:
    """Whether a column is a pandas extension array (kept as it is) rather than a numpy array."""
    return not isinstance(array, np.ndarray) and hasattr(array, "to_numpy") and hasattr(array, "dtype")


def pandas_column(series: Any, where: str) -> Any:
    """A pandas Series (or a pandas array) as a column. Extension dtypes other than strings
    (categorical, timezone-aware datetimes, nullable numbers, periods, intervals) are kept as pandas
    arrays, so pandas batches get them back with their dtype; everything else (strings included) is
    a numpy array (`as_column`)."""
    import pandas as pd

    array = series.array if isinstance(series, pd.Series) else series
    if isinstance(array.dtype, pd.api.extensions.ExtensionDtype) and not isinstance(array.dtype, pd.StringDtype):
        return array.copy()
    return as_column(series.to_numpy() if hasattr(series, "to_numpy") else np.asarray(series), where)


def numpy_columns(columns: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """`columns` with every pandas extension array converted to numpy (its values: strings for a
    categorical of strings, object for values numpy has no type for), as a numpy-format batch needs."""
    return {name: as_column(array.to_numpy(), f"column {name!r}") if is_extension(array) else array
            for name, array in columns.items()}


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
        """The rows at `indices` as a dict of column -> array (copies, never views), in that order.
        Pandas extension columns stay pandas arrays of the same dtype."""
        if len(indices) and indices[-1] - indices[0] == len(indices) - 1 and _is_range(indices):
            start, stop = int(indices[0]), int(indices[-1]) + 1  # a contiguous run: copy a slice, no gather
            return {name: array[start:stop].copy() if is_extension(array) else np.array(array[start:stop])
                    for name, array in self.columns.items()}
        return {name: array.take(indices) if is_extension(array) else np.asarray(array[indices])
                for name, array in self.columns.items()}

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
    return {column: _concat([table[column] for table in tables]) for column in first}


def _concat(parts: list) -> Any:
    if not any(is_extension(part) for part in parts):
        return np.concatenate(parts)
    import pandas as pd  # an extension column: pandas keeps the dtype when the parts share it

    return pd.concat([pd.Series(part) for part in parts], ignore_index=True).array


def pandas_table(dfs: Any) -> ColumnTable:
    """The rows of a pandas DataFrame (or a list of them, concatenated) as columns, one per DataFrame
    column (the index is dropped), extension dtypes kept (`pandas_column`); the error of a column that
    is not rows names it."""
    frames = dfs if isinstance(dfs, (list, tuple)) else [dfs]
    parts, names = [], []
    for i, frame in enumerate(frames):
        where = f"from_pandas(dfs[{i}])" if isinstance(dfs, (list, tuple)) else "from_pandas(df)"
        parts.append({str(c): pandas_column(frame[c], f"column {c!r} of {where}") for c in frame.columns})
        names.append(where)
    return ColumnTable(concat_columns(parts, names), "from_pandas(...)")
