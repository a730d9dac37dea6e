"""`Dataset.map_batches`: a user function applied to batches of a dataset's rows, where they are read.

`Mapped` is a source like `Files` or `Factory`: it travels to the workers as the parent dataset plus
the function (cloudpickled in the run's payload), and each worker applies the function to the whole
parent dataset on every pass (epoch), as Ray re-runs a lazy dataset's transforms each epoch
(`Dataset.materialize()` runs them once instead), because which rows a rank reads is decided on the
mapped rows. The function must therefore give the same number of rows on every rank (random values in
them are fine: each rank keeps only its own rows of its own output).

Batches never cross block boundaries: the parent's rows are cut into `num_blocks` near-equal contiguous
blocks (`override_num_blocks`, default 1), `batch_size=None` gives each block as one batch and an int
cuts each block into batches of that size (the last one of a block may be smaller), as Ray does.
`concurrency` runs that many batches at once on a thread pool (a callable class gets one instance per
thread, as Ray gives one per actor); the output keeps the input order.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np

from minitrain.data.batches import check_batch_format, format_batch, numpy_collate
from minitrain.data.tables import ColumnTable, as_column, concat_columns, pandas_column, stack_values
from minitrain.errors import ConfigError


def block_bounds(num_rows: int, num_blocks: int) -> list[tuple[int, int]]:
    """(start, stop) of `num_blocks` contiguous blocks of near-equal size (the first ones one row longer),
    as `numpy.array_split` cuts; empty blocks are dropped."""
    base, extra = divmod(num_rows, num_blocks)
    bounds, start = [], 0
    for block in range(num_blocks):
        stop = start + base + (1 if block < extra else 0)
        if stop > start:
            bounds.append((start, stop))
        start = stop
    return bounds


def pool_size(concurrency: Any, where: str = "map_batches") -> int:
    """The number of threads for Ray's `concurrency` (an int n, or an autoscaling range (min, max) or
    (min, max, initial): its max). ConfigError for anything else."""
    if concurrency is None:
        return 1
    if isinstance(concurrency, int) and not isinstance(concurrency, bool) and concurrency >= 1:
        return concurrency
    if isinstance(concurrency, tuple) and len(concurrency) in (2, 3) and all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in concurrency) \
            and concurrency[0] <= concurrency[1]:
        return concurrency[1]
    raise ConfigError(f"{where}(concurrency={concurrency!r}) must be None, an int >= 1, or a tuple (min, max) "
                      "or (min, max, initial) with 1 <= min <= max. It is how many batches run at once.")


@dataclass(frozen=True)
class MapOptions:
    """What `map_batches` was asked for, validated by `Dataset.map_batches`."""

    batch_size: Optional[int]
    batch_format: str
    fn_args: tuple = ()
    fn_kwargs: dict = field(default_factory=dict)
    fn_constructor_args: tuple = ()
    fn_constructor_kwargs: dict = field(default_factory=dict)
    threads: int = 1
    zero_copy_batch: bool = True


@dataclass(frozen=True)
class Mapped:
    """The rows of `parent` (a `minitrain.data.Dataset`) passed through `fn` in batches."""

    parent: Any
    fn: Callable
    options: MapOptions
    num_blocks: int = 1

    def load(self) -> ColumnTable:
        """Apply the function to every batch of the parent's rows (storage order) and join the outputs."""
        table = self.parent._resolve()[0]
        batches = []
        for start, stop in block_bounds(table.num_rows, self.num_blocks):
            size = self.options.batch_size or (stop - start)
            batches.extend((a, min(a + size, stop)) for a in range(start, stop, size))
        outputs = [out for out in self._run(table, batches) if out]
        where = f"map_batches({_name(self.fn)})"
        if not outputs:  # an empty dataset: no batch, so no columns to learn from
            raise ConfigError(f"{where} was applied to an empty dataset, so it produced no columns.")
        return ColumnTable(concat_columns(outputs, [f"{where} batch {i}" for i in range(len(outputs))]), where)

    def _run(self, table: Any, batches: list[tuple[int, int]]) -> list[dict]:
        local = threading.local()

        def call(bounds: tuple[int, int]) -> dict:
            if not hasattr(local, "fn"):  # a callable class: one instance per thread (Ray: per actor)
                local.fn = self._instance()
            indices = np.arange(bounds[0], bounds[1])
            raw = table.take(indices)
            if self.options.zero_copy_batch and isinstance(raw, dict):
                for array in raw.values():  # Ray's zero-copy batches are read-only views: so are these
                    if isinstance(array, np.ndarray):
                        array.setflags(write=False)
            batch = format_batch(raw if isinstance(table, ColumnTable) else numpy_collate(raw),
                                 self.options.batch_format)
            out = local.fn(batch, *self.options.fn_args, **self.options.fn_kwargs)
            where = f"map_batches({_name(self.fn)})"
            if isinstance(out, Iterator):  # a generator function: each yielded value is a batch
                parts = [output_columns(part, where) for part in out]
                return concat_columns(parts, [where] * len(parts)) if parts else {}
            return output_columns(out, where)

        if self.options.threads <= 1 or len(batches) <= 1:
            return [call(bounds) for bounds in batches]
        with ThreadPoolExecutor(max_workers=self.options.threads, thread_name_prefix="map_batches") as pool:
            return list(pool.map(call, batches))

    def _instance(self) -> Callable:
        if isinstance(self.fn, type):
            return self.fn(*self.options.fn_constructor_args, **self.options.fn_constructor_kwargs)
        return self.fn


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__qualname__


def output_columns(out: Any, where: str) -> dict[str, np.ndarray]:
    """What a map_batches function returned as a dict of columns: a dict of arrays/lists, a pandas
    DataFrame or a pyarrow Table (as Ray accepts). ValueError (Ray's type) naming the type for anything
    else."""
    module = type(out).__module__.split(".")[0]
    if module == "pandas" and hasattr(out, "columns"):
        out = {str(name): pandas_column(out[name], f"column {name!r} of {where}") for name in out.columns}
    elif module == "pyarrow" and hasattr(out, "column_names"):
        out = {name: out.column(name).to_numpy(zero_copy_only=False) for name in out.column_names}
    if not isinstance(out, Mapping):
        raise ValueError(f"{where} returned a {type(out).__module__}.{type(out).__qualname__}; map_batches "
                        "expects fn to return a dict of column name -> numpy array (or list), a pandas "
                        "DataFrame or a pyarrow Table.")
    columns = {}
    for name, values in out.items():
        if not isinstance(name, str):
            raise TypeError(f"{where} returned the column name {name!r}; column names must be str.")
        if isinstance(values, list):
            stacked = stack_values(values) if values and all(
                isinstance(v, (list, tuple, np.ndarray)) for v in values) else None
            columns[name] = stacked if stacked is not None else as_column(values, f"column {name!r} of {where}")
        elif module == "pandas" or type(values).__module__.split(".")[0] == "pandas":
            columns[name] = pandas_column(values, f"column {name!r} of {where}")  # keeps extension dtypes
        else:
            columns[name] = as_column(values, f"column {name!r} of {where}")
    lengths = {len(array) for array in columns.values()}
    if len(lengths) > 1:
        raise ValueError(f"{where} returned columns of unequal lengths "
                         f"({ {name: len(a) for name, a in columns.items()} }); every column needs one value per row.")
    return columns


def check_map_format(batch_format: Optional[str]) -> str:
    """Ray's `batch_format` for map_batches ("default", "numpy", "pandas"; None means "default")."""
    batch_format = "default" if batch_format is None else batch_format
    check_batch_format(batch_format)
    return batch_format
