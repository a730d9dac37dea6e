"""The constructors Ray Data scripts use, so they port by changing imports (`ray.data` -> `minitrain.data`).

They build a `Dataset` that `TorchTrainer(datasets=...)` accepts; nothing is distributed. Sources are
read where the rows are used (files by each worker), once; transforms on them are lazy (see `Dataset`). Ray's execution arguments either work or raise (`minitrain.data.execution`):
`override_num_blocks`/`parallelism` set the number of blocks, the readers' `concurrency` reads that many
files at once, `shuffle="files"` shuffles the file order, `partition_filter` filters the file list and
`ignore_missing_paths` skips missing paths; Ray's task options and Ray objects (`ray_remote_args`,
`num_cpus`, `meta_provider`, `partitioning`, ...) raise `ConfigError` unless left at their defaults.
Readers take a path, a directory (searched recursively), a glob pattern or a list of them, on any
fsspec or pyarrow filesystem ("s3://...", or `filesystem=`); their other keyword arguments go to
pandas' reader (CSV, JSON) or to `pyarrow.parquet.read_table` (Parquet).
"""

from __future__ import annotations

import builtins
import random
from typing import Any, Optional, Sequence, Union

import numpy as np

from minitrain.data.dataset import Dataset, rows_dataset
from minitrain.data.execution import REFUSED, num_blocks, refuse_unsupported
from minitrain.data.mapping import pool_size
from minitrain.data.readers import expand_paths
from minitrain.data.sources import Files, InMemory
from minitrain.data.tables import ColumnTable, RowTable, as_column, concat_columns, pandas_table
from minitrain.errors import ConfigError

# Ray Data's reader arguments minitrain handles itself (everything else goes to pandas / pyarrow).
_EXECUTION_ARGS = {"parallelism", "override_num_blocks", "concurrency", "partition_filter", "shuffle",
                   "ignore_missing_paths"} | set(REFUSED)


def _blocked(dataset: Dataset, where: str, parallelism: Any, override_num_blocks: Any) -> Dataset:
    return Dataset(dataset.source, blocks=num_blocks(where, parallelism, override_num_blocks))


def range(n: int, *, parallelism: int = -1, concurrency: Optional[int] = None,  # noqa: A001 - Ray's name
          override_num_blocks: Optional[int] = None) -> Dataset:
    """A dataset of the integers 0..n-1 in one int64 column "id", as `ray.data.range`.

    `override_num_blocks` (or its older name `parallelism`) sets the number of blocks; `concurrency`
    (Ray's cap on parallel read tasks) must be None or an int >= 1: the column is built at once, so
    any cap holds. The column is held in memory (8 bytes per row)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"range(n={n!r}): n must be a non-negative int.")
    if concurrency is not None and (isinstance(concurrency, bool) or not isinstance(concurrency, int)
                                    or concurrency < 1):
        raise ConfigError(f"range(concurrency={concurrency!r}) must be None or an int >= 1.")
    dataset = Dataset(InMemory(ColumnTable({"id": np.arange(n, dtype=np.int64)}, "range(...)")))
    return _blocked(dataset, "range(...)", parallelism, override_num_blocks)


def from_items(items: Sequence[Any], *, parallelism: int = -1,
               override_num_blocks: Optional[int] = None) -> Dataset:
    """A dataset of `items`: dict items are rows as they are, any other item `x` becomes `{"item": x}`
    (Ray's rule). Items that stack into arrays are stored as columns: numbers, strings, and list or
    array cells of numbers (`[rows, ...]`; ragged cells as one array per row), as Ray Data stores them.
    `override_num_blocks`/`parallelism` set the number of blocks."""
    if isinstance(items, (str, bytes)) or not isinstance(items, Sequence):
        raise TypeError(f"from_items(items=...) takes a list of rows, got {type(items).__name__}.")
    dataset = rows_dataset(list(items), "from_items(...)", wrap_key="item")
    return _blocked(dataset, "from_items(...)", parallelism, override_num_blocks)


def from_numpy(ndarrays: Union[np.ndarray, Sequence[np.ndarray]]) -> Dataset:
    """A dataset with one column "data": the rows of `ndarrays` (one array, or several concatenated)."""
    arrays = [ndarrays] if isinstance(ndarrays, np.ndarray) else list(ndarrays)
    parts = [{"data": as_column(array, f"from_numpy(ndarrays[{i}])")} for i, array in enumerate(arrays)]
    names = [f"from_numpy(ndarrays[{i}])" for i in builtins.range(len(parts))]
    return Dataset(InMemory(ColumnTable(concat_columns(parts, names), "from_numpy(...)")))


def from_pandas(dfs: Any, *, override_num_blocks: Optional[int] = None) -> Dataset:
    """A dataset of the rows of a pandas DataFrame (or a list of them, concatenated); one column per
    DataFrame column (the index is dropped). `override_num_blocks` sets the number of blocks."""
    return _blocked(Dataset(InMemory(pandas_table(dfs))), "from_pandas(...)", -1, override_num_blocks)


def from_torch(dataset: Any, local_read: bool = False) -> Dataset:
    """A dataset of a map-style torch Dataset's rows as `{"item": dataset[i]}` (Ray's layout), read by
    index where needed. To get the rows as they are, as a DataLoader does, pass the torch Dataset
    itself to `TorchTrainer(datasets=...)`. `local_read=True` raises ConfigError: the rows are always
    read where they are used."""
    refuse_unsupported("from_torch(...)", {"local_read": local_read})
    if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
        raise TypeError(f"from_torch(dataset=...) needs a map-style dataset (__len__ and __getitem__), got "
                        f"{type(dataset).__name__}.")
    return Dataset(InMemory(RowTable(dataset, wrap_key="item")))


def _read(fmt: str, paths: Union[str, Sequence[str]], filesystem: Any, include_paths: bool,
          file_extensions: Optional[Sequence[str]], options: dict) -> Dataset:
    where = f"read_{fmt}(...)"
    ray_args = {name: options.pop(name) for name in list(options) if name in _EXECUTION_ARGS}
    refuse_unsupported(where, {name: value for name, value in ray_args.items() if name in REFUSED})
    blocks = num_blocks(where, ray_args.get("parallelism", -1), ray_args.get("override_num_blocks"))
    threads = pool_size(ray_args.get("concurrency"))
    ignore_missing = ray_args.get("ignore_missing_paths", False)
    if not isinstance(ignore_missing, bool):
        raise ConfigError(f"{where}: ignore_missing_paths={ignore_missing!r} must be a bool.")
    fs, found = expand_paths(paths, filesystem, fmt, file_extensions, ignore_missing=ignore_missing)
    partition_filter = ray_args.get("partition_filter")
    if partition_filter is not None:  # Ray's PathPartitionFilter: paths -> the paths to read
        if not callable(partition_filter):
            raise ConfigError(f"{where}: partition_filter={partition_filter!r} must be a callable taking the list "
                              "of file paths and returning the ones to read.")
        found = list(partition_filter(list(found)))
    shuffle = ray_args.get("shuffle")
    if shuffle == "files":  # Ray: read the files in a random order
        random.SystemRandom().shuffle(found)
    elif shuffle is not None:
        raise ConfigError(f"{where}: shuffle={shuffle!r} must be None or 'files' (Ray's FileShuffleConfig is not "
                          "supported; use Dataset.random_shuffle(seed=...) for a seeded order of the rows).")
    options = tuple(sorted(options.items()))
    return Dataset(Files(fs, tuple(found), fmt, options, include_paths, threads), blocks=blocks)


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
