"""Where a dataset's rows come from, and how each source turns into a table where it is read.

- `InMemory`: a table built on the driver; it travels to the workers inside the run's payload, or,
  when large and numeric, is staged as `.npy` files (see `minitrain.data.staging`).
- `Factory`: a zero-argument function, pickled (small) and called in each worker; it returns
  anything `TorchTrainer(datasets=...)` accepts.
- `Files`: CSV, JSON or Parquet files on an fsspec filesystem, read by each worker.
- `Staged`: columns the driver wrote as `.npy` files (numpy's format, never unpickled); local files
  are memory-mapped, so workers on one host share one copy through the page cache.
"""

from __future__ import annotations

import io
from concurrent.futures import ThreadPoolExecutor
import posixpath
from dataclasses import dataclass
from typing import Any, Callable, Union

import numpy as np
from fsspec.implementations.local import LocalFileSystem

from minitrain.data.readers import read_file
from minitrain.data.tables import ColumnTable, RowTable, concat_columns

Table = Union[ColumnTable, RowTable]


@dataclass(frozen=True)
class InMemory:
    """A table held in memory."""

    table: Table

    def load(self) -> Table:
        """The table itself."""
        return self.table


@dataclass(frozen=True)
class Factory:
    """A zero-argument function that builds the dataset where it is called (each worker)."""

    fn: Callable[[], Any]
    where: str

    def call(self) -> Any:
        """Call the function; TypeError naming `where` when it needs arguments."""
        try:
            return self.fn()
        except TypeError as exc:
            if "required positional argument" in str(exc):
                raise TypeError(f"{self.where} is a function, so it is called with no arguments in each worker "
                                f"to build the dataset, but: {exc}") from exc
            raise


@dataclass(frozen=True)
class Files:
    """Files of one format (`csv`, `json`, `parquet`) on the fsspec filesystem `fs`, read `threads` at a
    time (Ray's `concurrency`)."""

    fs: Any
    paths: tuple[str, ...]
    fmt: str
    options: tuple[tuple[str, Any], ...] = ()
    include_paths: bool = False
    threads: int = 1

    def load(self) -> ColumnTable:
        """Read every file and concatenate their rows in path order."""
        def read(path: str) -> dict:
            columns = read_file(self.fs, path, self.fmt, dict(self.options))
            if self.include_paths:
                rows = len(next(iter(columns.values()))) if columns else 0
                columns["path"] = np.full(rows, path)
            return columns

        if self.threads > 1 and len(self.paths) > 1:
            with ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="read_files") as pool:
                parts = list(pool.map(read, self.paths))
        else:
            parts = [read(path) for path in self.paths]
        parts = [p for p in parts if p]
        return ColumnTable(concat_columns(parts, list(self.paths)), f"read_{self.fmt}({list(self.paths)!r})")


@dataclass(frozen=True)
class Staged:
    """Columns written by the driver as one `.npy` file each under `root` on `fs`."""

    fs: Any
    root: str
    names: tuple[str, ...]

    def load(self) -> ColumnTable:
        """The columns; memory-mapped when `fs` is local, read into memory otherwise."""
        columns = {}
        for position, name in enumerate(self.names):
            path = posixpath.join(self.root, column_file(position))
            if isinstance(self.fs, LocalFileSystem):
                columns[name] = np.load(path, mmap_mode="r", allow_pickle=False)
            else:
                columns[name] = np.load(io.BytesIO(self.fs.cat_file(path)), allow_pickle=False)
        return ColumnTable(columns, f"the staged dataset in {self.root}")


def column_file(position: int) -> str:
    """File name of the column at `position` (column names may hold any character, so they are not used)."""
    return f"column_{position:04d}.npy"
