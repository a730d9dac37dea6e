"""The constructors Ray Data scripts use, so they port by changing imports (`ray.data` -> `minitrain.data`).

They build a `Dataset` that `TorchTrainer(datasets=...)` accepts; nothing is distributed or lazy
beyond that. Ray's execution arguments (`parallelism`, `override_num_blocks`, `concurrency`,
`ray_remote_args`, ...) are accepted and ignored. Readers take a path, a directory (searched
recursively), a glob pattern or a list of them, on any fsspec filesystem ("s3://...", or
`filesystem=`); their other keyword arguments go to pandas' reader (CSV, JSON) or to
`pyarrow.parquet.read_table` (Parquet).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import numpy as np

from minitrain.data.dataset import Dataset, rows_dataset
from minitrain.data.readers import expand_paths
from minitrain.data.sources import Files, InMemory
from minitrain.data.tables import ColumnTable, RowTable, as_column, concat_columns, pandas_table

# Ray Data arguments that only steer its distributed execution: accepted, no effect here.
_EXECUTION_ARGS = {"parallelism", "override_num_blocks", "concurrency", "ray_remote_args", "meta_provider",
                   "partition_filter", "partitioning", "shuffle", "arrow_open_stream_args", "num_cpus",
                   "num_gpus", "memory", "local_read", "ignore_missing_paths"}


def _reader_options(kwargs: dict) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((k, v) for k, v in kwargs.items() if k not in _EXECUTION_ARGS))


def from_items(items: Sequence[Any], **ray_args: Any) -> Dataset:
    """A dataset of `items`: dict items are rows as they are, any other item `x` becomes `{"item": x}`
    (Ray's rule). Items that stack into arrays are stored as columns."""
    if isinstance(items, (str, bytes)) or not isinstance(items, Sequence):
        raise TypeError(f"from_items(items=...) takes a list of rows, got {type(items).__name__}.")
    return rows_dataset(list(items), "from_items(...)", wrap_key="item")


def from_numpy(ndarrays: Union[np.ndarray, Sequence[np.ndarray]]) -> Dataset:
    """A dataset with one column "data": the rows of `ndarrays` (one array, or several concatenated)."""
    arrays = [ndarrays] if isinstance(ndarrays, np.ndarray) else list(ndarrays)
    parts = [{"data": as_column(array, f"from_numpy(ndarrays[{i}])")} for i, array in enumerate(arrays)]
    names = [f"from_numpy(ndarrays[{i}])" for i in range(len(parts))]
    return Dataset(InMemory(ColumnTable(concat_columns(parts, names), "from_numpy(...)")))


def from_pandas(dfs: Any, **ray_args: Any) -> Dataset:
    """A dataset of the rows of a pandas DataFrame (or a list of them, concatenated); one column per
    DataFrame column (the index is dropped)."""
    return Dataset(InMemory(pandas_table(dfs)))


def from_torch(dataset: Any, **ray_args: Any) -> Dataset:
    """A dataset of a map-style torch Dataset's rows as `{"item": dataset[i]}` (Ray's layout), read by
    index where needed. To get the rows as they are, as a DataLoader does, pass the torch Dataset
    itself to `TorchTrainer(datasets=...)`."""
    if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
        raise TypeError(f"from_torch(dataset=...) needs a map-style dataset (__len__ and __getitem__), got "
                        f"{type(dataset).__name__}.")
    return Dataset(InMemory(RowTable(dataset, wrap_key="item")))


def _read(fmt: str, paths: Union[str, Sequence[str]], filesystem: Any, include_paths: bool,
          file_extensions: Optional[Sequence[str]], options: dict) -> Dataset:
    fs, found = expand_paths(paths, filesystem, fmt, file_extensions)
    return Dataset(Files(fs, tuple(found), fmt, _reader_options(options), include_paths))


def read_csv(paths: Union[str, Sequence[str]], *, filesystem: Any = None, include_paths: bool = False,
             file_extensions: Optional[Sequence[str]] = None, **reader_args: Any) -> Dataset:
    """A dataset of the rows of CSV files (header row = column names). Extra keyword arguments go to
    `pandas.read_csv`; without pandas, the standard library reads them and infers int/float columns.
    `include_paths=True` adds a "path" column. FileNotFoundError here when a path matches nothing."""
    return _read("csv", paths, filesystem, include_paths, file_extensions, reader_args)


def read_json(paths: Union[str, Sequence[str]], *, lines: Optional[bool] = None, filesystem: Any = None,
              include_paths: bool = False, file_extensions: Optional[Sequence[str]] = None,
              **reader_args: Any) -> Dataset:
    """A dataset of the records of JSON files: JSON Lines, or one array of objects per file (`lines`
    None: decided per file by its first character). Extra keyword arguments go to `pandas.read_json`."""
    if lines is not None:
        reader_args["lines"] = lines
    return _read("json", paths, filesystem, include_paths, file_extensions, reader_args)


def read_parquet(paths: Union[str, Sequence[str]], *, filesystem: Any = None, columns: Optional[list] = None,
                 include_paths: bool = False, file_extensions: Optional[Sequence[str]] = None,
                 **reader_args: Any) -> Dataset:
    """A dataset of the rows of Parquet files (needs pyarrow); `columns` selects columns. Extra keyword
    arguments go to `pyarrow.parquet.read_table`."""
    if columns is not None:
        reader_args["columns"] = list(columns)
    return _read("parquet", paths, filesystem, include_paths, file_extensions, reader_args)
