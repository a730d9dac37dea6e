"""Reading CSV, JSON and Parquet files from any fsspec filesystem into columns (numpy arrays).

pandas and pyarrow are optional. CSV and JSON use pandas when it is installed and the standard
library otherwise (numbers are inferred per column); Parquet needs pyarrow. Path expansion happens
on the driver, when the dataset is created, so a missing path fails there; the files themselves are
read where the rows are needed (in each worker).
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any, Optional, Sequence, Union

import fsspec
import fsspec.core
import numpy as np

from minitrain.data.tables import as_column, pandas_column
from minitrain.storage.user_filesystems import as_fsspec

EXTENSIONS = {"csv": ("csv", "csv.gz"), "json": ("json", "jsonl", "json.gz", "jsonl.gz"),
              "parquet": ("parquet",)}


def expand_paths(paths: Union[str, Sequence[str]], filesystem: Any, fmt: str,
                 file_extensions: Optional[Sequence[str]], ignore_missing: bool = False) -> tuple[Any, list[str]]:
    """(filesystem, sorted file paths) for files, directories (searched recursively) and glob patterns.

    Files in a directory are kept when their name ends with one of `file_extensions` (default: the
    usual ones for `fmt`). FileNotFoundError naming the path when nothing matches, unless
    `ignore_missing` (Ray's `ignore_missing_paths`): then a path that does not exist is skipped.
    """
    if isinstance(paths, str):
        paths = [paths]
    if not paths:
        raise ValueError(f"read_{fmt}(paths=...) needs at least one path.")
    extensions = tuple(e.lstrip(".").lower() for e in (file_extensions or EXTENSIONS[fmt]))
    if filesystem is not None:  # fsspec or pyarrow.fs (Ray's readers take pyarrow filesystems)
        filesystem = as_fsspec(filesystem, f"read_{fmt}(filesystem=...)")
    fs = filesystem
    found: list[str] = []
    for path in paths:
        if filesystem is None:
            fs, stripped = fsspec.core.url_to_fs(path)
        else:
            stripped = filesystem._strip_protocol(path)
        if ignore_missing and not any(ch in stripped for ch in "*?[") and not fs.exists(stripped):
            continue
        found.extend(_expand_one(fs, stripped, path, extensions, fmt))
    return fs, found


def _expand_one(fs: Any, path: str, original: str, extensions: tuple[str, ...], fmt: str) -> list[str]:
    if any(ch in path for ch in "*?["):
        matches = sorted(p for p in fs.glob(path) if fs.isfile(p))
    elif fs.isdir(path):
        matches = sorted(p for p in fs.find(path) if p.lower().endswith(tuple("." + e for e in extensions)))
    elif fs.isfile(path):
        matches = [path]
    else:
        raise FileNotFoundError(f"read_{fmt}: {original!r} does not exist.")
    if not matches:
        raise FileNotFoundError(f"read_{fmt}: no {'/'.join(extensions)} files found at {original!r}. Pass "
                                "file_extensions=[...] when your files are named otherwise.")
    return matches


def read_file(fs: fsspec.AbstractFileSystem, path: str, fmt: str, options: dict) -> dict[str, np.ndarray]:
    """The columns of one file. `options` go to pandas' reader (or pyarrow's for Parquet)."""
    with fs.open(path, "rb", compression="infer") as handle:
        data = handle.read()
    if fmt == "parquet":
        return _read_parquet(data, options)
    try:
        import pandas as pd
    except ImportError:
        pd = None
    if fmt == "csv":
        if pd is not None:
            return _from_frame(pd.read_csv(io.BytesIO(data), **options), path)
        return _columns_from_records(list(csv.DictReader(io.StringIO(data.decode("utf-8")), **options)),
                                     path, infer_numbers=True)
    if fmt == "json":
        text = data.decode("utf-8")
        options = dict(options)
        lines = options.pop("lines", None)
        if lines is None:  # JSON Lines unless the file is one JSON array
            lines = not text.lstrip().startswith("[")
        if pd is not None:
            return _from_frame(pd.read_json(io.StringIO(text), lines=lines, **options), path)
        records = [json.loads(line) for line in text.splitlines() if line.strip()] if lines else json.loads(text)
        return _columns_from_records(records, path, infer_numbers=False)
    raise ValueError(f"unknown file format {fmt!r}")


def _read_parquet(data: bytes, options: dict) -> dict[str, np.ndarray]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError("minitrain.data.read_parquet needs pyarrow: pip install pyarrow") from None
    table = pq.read_table(io.BytesIO(data), **options)
    return {name: _arrow_to_numpy(table.column(name)) for name in table.column_names}


def _arrow_to_numpy(column: Any) -> np.ndarray:
    values = column.to_numpy()
    if values.dtype == object and len(values) and isinstance(values[0], np.ndarray):
        return np.stack(values)  # a list<...> column of equal-length lists: one 2-D array
    return as_column(values, "a Parquet column")


def _from_frame(frame: Any, path: str) -> dict[str, np.ndarray]:
    # pandas_column keeps extension dtypes a reader was asked for (e.g. dtype={"c": "category"})
    return {str(name): pandas_column(frame[name], f"column {name!r} of {path}") for name in frame.columns}


def _columns_from_records(records: list, path: str, infer_numbers: bool) -> dict[str, np.ndarray]:
    if not records:
        return {}
    names = list(records[0])
    columns = {}
    for name in names:
        values = [record.get(name) for record in records]
        columns[name] = as_column(_infer(values) if infer_numbers else values, f"column {name!r} of {path}")
    return columns


def _infer(values: list) -> list:
    """CSV strings as ints, else floats, else left as strings (the stdlib reader has no types)."""
    for kind in (int, float):
        try:
            return [kind(v) for v in values]
        except (TypeError, ValueError):
            continue
    return values
