"""`Dataset.map`, `Dataset.flat_map` and `Dataset.filter`: a user function applied to each row, as Ray's.

`RowMapped` is a source like `Mapped` (`map_batches`): it travels to the workers as the parent dataset
plus the function, and is applied where the rows are read, on every pass (lazy, as Ray re-runs a
dataset's transforms each epoch; `Dataset.materialize()` runs them once and keeps the rows).

Rows are dicts of column -> value, as Ray's: a columnar dataset gives `{column: value}` (a fresh dict
each time, array values copied, so mutating it in place changes nothing else); `map`'s `fn(row)` returns
one dict, `flat_map`'s returns a list (or any iterable) of dicts, `filter`'s returns whether to keep the
row. Anything else raises Ray's `ValueError` naming the value. `filter` keeps the kept rows' columns as
they are (dtypes included); `map`/`flat_map` output rows are stored as columns when they stack (as
`from_items` stores them), else as a list of rows. `concurrency` runs that many contiguous chunks of
rows at once on threads (a callable class gets one instance per thread); the output keeps the input order.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from minitrain.data.mapping import MapOptions
from minitrain.data.tables import ColumnTable, RowTable, rows_to_columns

KINDS = ("map", "flat_map", "filter")


def _truncated(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "..."


def check_row(value: Any, where: str) -> Mapping:
    """`value` when it is a row (a dict); Ray's ValueError otherwise."""
    if not isinstance(value, Mapping):
        raise ValueError(f"Error validating {_truncated(value)}: Standalone Python objects are not allowed. "
                         f"{where} must return rows as dicts of column -> value; wrap a value in a dict, e.g. "
                         "return `{'item': item}` instead of just `item`.")
    return value


def input_row(row: Any, where: str) -> dict:
    """A row as the function receives it: a fresh dict, array values copied. ValueError for a dataset
    whose rows are not dicts (Ray's rows always are)."""
    if not isinstance(row, Mapping):
        raise ValueError(f"{where} needs rows that are dicts of column -> value, but this dataset's rows are "
                         f"{type(row).__name__}. Build it with minitrain.data.from_items / from_torch (rows "
                         "become {'item': value}) or from a dict of columns.")
    return {key: np.array(value) if isinstance(value, np.ndarray) else value for key, value in row.items()}


@dataclass(frozen=True)
class RowMapped:
    """The rows of `parent` (a `minitrain.data.Dataset`) passed one by one through `fn`, as `kind`
    ("map", "flat_map" or "filter") does. `options` is `map_batches`' `MapOptions` (its batch fields
    unused)."""

    parent: Any
    kind: str
    fn: Callable
    options: MapOptions

    def load(self) -> Any:
        """Apply the function to every row of the parent (storage order); the resulting table."""
        table = self.parent._resolve()[0]
        where = f"{self.kind}({_name(self.fn)})"
        outputs = self._run(table, where)
        if self.kind == "filter":
            keep = np.flatnonzero(np.fromiter((bool(k) for k in outputs), dtype=bool, count=len(outputs)))
            kept = table.take(keep.astype(np.int64))
            return ColumnTable(kept, where) if isinstance(table, ColumnTable) else RowTable(kept)
        rows = [check_row(row, where) for row in outputs]
        columns = rows_to_columns(rows)
        return ColumnTable(columns, where) if columns is not None else RowTable(rows)

    def _run(self, table: Any, where: str) -> list:
        local = threading.local()
        args, kwargs = self.options.fn_args, self.options.fn_kwargs

        def call(bounds: tuple[int, int]) -> list:
            if not hasattr(local, "fn"):  # a callable class: one instance per thread (Ray: per actor)
                local.fn = self._instance()
            out: list = []
            for index in range(*bounds):
                result = local.fn(input_row(table.row(index), where), *args, **kwargs)
                if self.kind == "flat_map":
                    if isinstance(result, Mapping) or not isinstance(result, Iterable):
                        raise ValueError(f"{where} returned {_truncated(result)}; flat_map's function returns a "
                                         "list of rows (dicts), e.g. `[row, row]`, or `[]` to drop the row.")
                    out.extend(result)
                else:
                    out.append(result)
            return out

        n = table.num_rows
        threads = max(1, min(self.options.threads, n))
        step = -(-n // threads) if n else 1
        chunks = [(start, min(start + step, n)) for start in range(0, n, step)]
        if threads <= 1:
            return [item for chunk in chunks for item in call(chunk)]
        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix=self.kind) as pool:
            return [item for part in pool.map(call, chunks) for item in part]

    def _instance(self) -> Callable:
        if isinstance(self.fn, type):
            return self.fn(*self.options.fn_constructor_args, **self.options.fn_constructor_kwargs)
        return self.fn


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__qualname__
