"""`Dataset`: rows described on the driver and read where they are needed, and `as_dataset`, which
turns whatever `TorchTrainer(datasets=...)` accepts into one.

Accepted values (`as_dataset`):

| value | rows |
|---|---|
| a `minitrain.data.Dataset` (`from_items`, `from_numpy`, `from_pandas`, `from_torch`, `read_*`) | as built |
| a dict of equal-length arrays, tensors or lists | `{column: value}` |
| a pandas DataFrame / a numpy array | as `from_pandas` / `from_numpy` |
| a sequence of rows (list, tuple) | the rows; a list of dicts is stored as columns |
| a map-style torch Dataset (`__len__` and `__getitem__`) | `dataset[i]`, as a DataLoader reads it |
| a zero-argument function (or class) returning one of the above | built in each worker |
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from typing import Any, Optional

import numpy as np

from minitrain.data.execution import num_blocks as blocks_asked, refuse_unsupported
from minitrain.data.iterator import DataIterator
from minitrain.data.mapping import MapOptions, Mapped, check_map_format, pool_size
from minitrain.data.sources import Factory, InMemory
from minitrain.data.tables import ColumnTable, RowTable, as_column, pandas_table, rows_to_columns
from minitrain.data.transforms import RowMapped
from minitrain.errors import ConfigError

ACCEPTED = ("a minitrain.data.Dataset (minitrain.data.from_items, from_numpy, from_pandas, from_torch, read_csv, "
            "read_json, read_parquet), a dict of equal-length arrays, a pandas DataFrame, a numpy array, a "
            "sequence of rows, a map-style torch Dataset (__len__ and __getitem__), or a zero-argument function "
            "returning one of these (called in each worker)")


class Dataset:
    """A dataset for `TorchTrainer(datasets=...)`: a source of rows plus an optional shuffle.

    Not a distributed data engine: each worker reads the rows it needs itself (see
    `minitrain.data` for how rows reach workers). The `iter_*` methods here read the whole dataset in
    this process, one epoch per pass, like a shard of a world of size 1.
    """

    def __init__(self, source: Any, *, shuffle: bool = False, seed: Optional[int] = None,
                 blocks: Optional[int] = None):
        self._source = source
        self._shuffle = shuffle
        self._seed = seed
        self._blocks = blocks
        self._cache: Optional[tuple[Any, bool, Optional[int]]] = None
        self._iterator: Optional[DataIterator] = None

    def __getstate__(self) -> dict:
        return {"_source": self._source, "_shuffle": self._shuffle, "_seed": self._seed, "_blocks": self._blocks}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["_source"], shuffle=state["_shuffle"], seed=state["_seed"],
                      blocks=state.get("_blocks"))

    def with_source(self, source: Any) -> "Dataset":
        """The same dataset (shuffle, seed, blocks) reading its rows from `source` (e.g. staged files)."""
        return Dataset(source, shuffle=self._shuffle, seed=self._seed, blocks=self._blocks)

    def __repr__(self) -> str:
        shuffle = f", random_shuffle(seed={self._seed})" if self._shuffle else ""
        return f"Dataset({type(self._source).__name__}{shuffle})"

    @property
    def source(self) -> Any:
        """Where the rows come from (`minitrain.data.sources`)."""
        return self._source

    def num_blocks(self) -> int:
        """The number of blocks the rows are cut into (`override_num_blocks`/`parallelism` of the
        constructor or `random_shuffle(num_blocks=...)`; 1 by default). It matters for
        `map_batches(batch_size=None)`, which hands each block to the function as one batch."""
        return self._blocks or 1

    def random_shuffle(self, *, seed: Optional[int] = None, num_blocks: Optional[int] = None,
                       **ray_remote_args: Any) -> "Dataset":
        """A dataset with the same rows in a new random order every epoch, determined by `seed`.

        Without a seed, one is drawn when the run starts (shared by all ranks, so shards stay
        disjoint). Unlike Ray, where a fixed seed repeats one order, the seed fixes the sequence of
        orders and every epoch has its own. `num_blocks` sets the number of blocks (as Ray); Ray's
        task options (`num_cpus`, ...) raise `ConfigError` unless left at their defaults.
        """
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise TypeError(f"random_shuffle(seed={seed!r}): the seed must be an int or None.")
        refuse_unsupported("random_shuffle(...)", ray_remote_args)
        blocks = blocks_asked("random_shuffle(...)", override_num_blocks=num_blocks)
        return Dataset(self._source, shuffle=True, seed=seed, blocks=blocks or self._blocks)

    def map_batches(self, fn: Any, *, batch_size: Optional[int] = None, batch_format: Optional[str] = "default",
                    zero_copy_batch: bool = True, fn_args: Optional[Iterable[Any]] = None,
                    fn_kwargs: Optional[dict] = None, fn_constructor_args: Optional[Iterable[Any]] = None,
                    fn_constructor_kwargs: Optional[dict] = None, concurrency: Any = None,
                    **ray_remote_args: Any) -> "Dataset":
        """A dataset of `fn(batch, *fn_args, **fn_kwargs)` over batches of this one's rows, as Ray's.

        `fn` is a function, or a callable class (built with `fn_constructor_args`/`kwargs` once per
        thread, then called per batch). `batch` is a dict of column -> numpy array ("default"/"numpy")
        or a pandas DataFrame ("pandas"); `fn` returns a dict of columns (arrays or lists), a DataFrame
        or a pyarrow Table, with any number of rows. `batch_size=None` gives each block as one batch
        (see `num_blocks`); batches never span blocks. `concurrency` (an int, or Ray's (min, max[,
        initial]): its max) runs that many batches at once on threads. With `zero_copy_batch=True`
        (the default, as Ray) numpy batches are read-only; pass False to mutate them in place. A
        generator function may yield several outputs per batch. Ray's task options (`num_cpus`, `num_gpus`, `memory`,
        `compute`, `ray_remote_args_fn`, ...) raise `ConfigError` unless left at their defaults.

        Lazy, as in Ray: it runs where the rows are read, in each training worker, over the whole
        dataset, on every pass (epoch), so random augmentations are drawn anew each epoch; call
        `materialize()` to run it once and keep the rows. It must give the same number of rows on
        every rank (which rows a rank reads is decided on the output). A shuffle of this dataset
        carries over to the result (the mapped rows are reshuffled every epoch).
        """
        if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int)
                                       or batch_size < 1):
            raise ValueError(f"map_batches(batch_size={batch_size!r}) must be an int >= 1, or None for whole "
                             "blocks.")
        if not isinstance(zero_copy_batch, bool):
            raise TypeError(f"map_batches(zero_copy_batch={zero_copy_batch!r}) must be a bool.")
        options = _map_options("map_batches", fn, fn_args, fn_kwargs, fn_constructor_args, fn_constructor_kwargs,
                               concurrency, ray_remote_args, batch_size=batch_size,
                               batch_format=check_map_format(batch_format), zero_copy_batch=zero_copy_batch)
        mapped = Mapped(self._parent(), fn, options, self.num_blocks())
        return Dataset(mapped, shuffle=self._shuffle, seed=self._seed, blocks=self._blocks)

    def map(self, fn: Any, *, fn_args: Optional[Iterable[Any]] = None, fn_kwargs: Optional[dict] = None,
            fn_constructor_args: Optional[Iterable[Any]] = None, fn_constructor_kwargs: Optional[dict] = None,
            concurrency: Any = None, **ray_remote_args: Any) -> "Dataset":
        """A dataset of `fn(row, *fn_args, **fn_kwargs)` for each row, as Ray's `Dataset.map`: `row` is a
        dict of column -> value and `fn` returns one dict (anything else: Ray's ValueError). `fn` is a
        function or a callable class (built with `fn_constructor_args`/`kwargs` once per thread);
        `concurrency` runs that many chunks of rows at once on threads. Ray's task options (`num_cpus`,
        `num_gpus`, `memory`, `compute`, `ray_remote_args_fn`, ...) raise `ConfigError` unless left at
        their defaults. Lazy, as Ray: it runs where the rows are read, on every pass (see
        `minitrain.data.transforms`); `materialize()` runs it once."""
        return self._row_transform("map", fn, fn_args, fn_kwargs, fn_constructor_args, fn_constructor_kwargs,
                                   concurrency, ray_remote_args)

    def flat_map(self, fn: Any, *, fn_args: Optional[Iterable[Any]] = None, fn_kwargs: Optional[dict] = None,
                 fn_constructor_args: Optional[Iterable[Any]] = None, fn_constructor_kwargs: Optional[dict] = None,
                 concurrency: Any = None, **ray_remote_args: Any) -> "Dataset":
        """A dataset of the rows `fn(row, ...)` returns for each row, flattened, as Ray's
        `Dataset.flat_map`: `fn` returns a list (or any iterable, e.g. a generator) of dicts, `[]` to drop
        the row. Arguments, errors and laziness as `map`."""
        return self._row_transform("flat_map", fn, fn_args, fn_kwargs, fn_constructor_args,
                                   fn_constructor_kwargs, concurrency, ray_remote_args)

    def filter(self, fn: Any = None, expr: Any = None, *, fn_args: Optional[Iterable[Any]] = None,
               fn_kwargs: Optional[dict] = None, fn_constructor_args: Optional[Iterable[Any]] = None,
               fn_constructor_kwargs: Optional[dict] = None, concurrency: Any = None,
               **ray_remote_args: Any) -> "Dataset":
        """A dataset of the rows for which `fn(row, ...)` is true, as Ray's `Dataset.filter`; the kept
        rows keep their columns and dtypes. Arguments and laziness as `map`. `expr` (Ray's string or
        `ray.data.expressions` predicate) raises `ConfigError`: minitrain has no expression engine, so
        write the predicate as `fn` (e.g. `filter(lambda row: row["id"] <= 4)`)."""
        if expr is not None:
            raise ConfigError(f"filter(expr={expr!r}) is not supported: minitrain has no expression engine to "
                              "evaluate it. Pass the predicate as a function of the row instead, e.g. "
                              "filter(lambda row: row['id'] <= 4).")
        if fn is None:
            raise ValueError("filter: exactly one of 'fn' or 'expr' must be provided; pass fn, a function of the "
                             "row returning whether to keep it.")
        return self._row_transform("filter", fn, fn_args, fn_kwargs, fn_constructor_args,
                                   fn_constructor_kwargs, concurrency, ray_remote_args)

    def _row_transform(self, kind: str, fn: Any, fn_args: Any, fn_kwargs: Any, fn_constructor_args: Any,
                       fn_constructor_kwargs: Any, concurrency: Any, ray_remote_args: dict) -> "Dataset":
        options = _map_options(kind, fn, fn_args, fn_kwargs, fn_constructor_args, fn_constructor_kwargs,
                               concurrency, ray_remote_args)
        return Dataset(RowMapped(self._parent(), kind, fn, options), shuffle=self._shuffle, seed=self._seed,
                       blocks=self._blocks)

    def _parent(self) -> "Dataset":
        """This dataset without its shuffle: transforms run in storage order and the shuffle follows."""
        return Dataset(self._source, blocks=self._blocks)

    # ------------------------------------------------------------------ reading here

    def _holding(self, table: Any) -> "Dataset":
        """A dataset holding `table` (a ColumnTable or RowTable) in memory: `DataIterator.materialize()`'s."""
        return Dataset(InMemory(table))

    def _resolve(self) -> tuple[Any, bool, Optional[int]]:
        """(table, shuffled, seed). A source is loaded once per object (a factory called, files read)
        and kept; transforms (`map_batches`, `map`, `flat_map`, `filter`) run again on every call,
        which is every pass of an iterator: Ray's lazy execution."""
        if _is_transform(self._source):
            return self._source.load(), self._shuffle, self._seed
        if self._cache is None:
            if isinstance(self._source, Factory):
                inner = as_dataset(self._source.call(), f"what {self._source.where} returned")
                if isinstance(inner.source, Factory):
                    raise ConfigError(f"{self._source.where} returned another function; it must return the "
                                      "dataset itself.")
                self._cache = (inner, False, None)
            else:
                self._cache = (self._source.load(), self._shuffle, self._seed)
        if isinstance(self._source, Factory):
            table, shuffled, seed = self._cache[0]._resolve()  # the built dataset's transforms stay lazy
            if self._shuffle:
                shuffled, seed = True, self._seed
            return table, shuffled, seed
        return self._cache

    def _local_iterator(self) -> DataIterator:
        if self._iterator is None:
            self._iterator = DataIterator(self, run_seed=random.SystemRandom().getrandbits(63), name="local")
        return self._iterator

    def count(self) -> int:
        """The number of rows (loads the source in this process)."""
        return self._resolve()[0].num_rows

    def columns(self) -> Optional[list[str]]:
        """Column names of a columnar dataset; None for a dataset of other rows."""
        table = self._resolve()[0]
        return list(table.columns) if isinstance(table, ColumnTable) else None

    def take(self, limit: int = 20) -> list:
        """The first `limit` rows in storage order (before any shuffle)."""
        table = self._resolve()[0]
        return [table.row(i) for i in range(min(limit, table.num_rows))]

    def take_all(self) -> list:
        """Every row in storage order (a lazy dataset's transforms run once for it)."""
        table = self._resolve()[0]
        return [table.row(i) for i in range(table.num_rows)]

    def iter_rows(self) -> Iterable[Any]:
        """All rows, one epoch per pass (see `DataIterator.iter_rows`)."""
        return self._local_iterator().iter_rows()

    def iter_batches(self, **kwargs: Any) -> Iterable[Any]:
        """All rows in batches, one epoch per pass (arguments of `DataIterator.iter_batches`)."""
        return self._local_iterator().iter_batches(**kwargs)

    def iter_torch_batches(self, **kwargs: Any) -> Iterable[Any]:
        """All rows in torch batches, one epoch per pass (arguments of `DataIterator.iter_torch_batches`)."""
        return self._local_iterator().iter_torch_batches(**kwargs)

    def materialize(self) -> "Dataset":
        """A dataset holding this one's rows in memory (files read, factory called, transforms run now,
        once), same shuffle: iterating it never runs the transforms again, as Ray's `materialize()`."""
        table, shuffled, seed = self._resolve()
        return Dataset(InMemory(table), shuffle=shuffled, seed=seed, blocks=self._blocks)

    def to_pandas(self) -> Any:
        """All rows as a pandas DataFrame (needs pandas)."""
        return next(iter(self._local_iterator().iter_batches(batch_size=None, batch_format="pandas")))


def _is_transform(source: Any) -> bool:
    return isinstance(source, (Mapped, RowMapped))


def _map_options(kind: str, fn: Any, fn_args: Any, fn_kwargs: Any, fn_constructor_args: Any,
                 fn_constructor_kwargs: Any, concurrency: Any, ray_remote_args: dict,
                 **batch: Any) -> MapOptions:
    """The checked arguments every transform shares (`batch` adds map_batches' own)."""
    if not callable(fn):
        raise TypeError(f"{kind}(fn={fn!r}) needs a function or a callable class.")
    if not isinstance(fn, type) and (fn_constructor_args or fn_constructor_kwargs):
        raise ValueError(f"{kind}: fn_constructor_args and fn_constructor_kwargs can only be given when fn is a "
                         "callable class.")
    refuse_unsupported(f"{kind}(...)", ray_remote_args)
    batch.setdefault("batch_size", None)
    batch.setdefault("batch_format", "default")
    return MapOptions(fn_args=tuple(fn_args or ()), fn_kwargs=dict(fn_kwargs or {}),
                      fn_constructor_args=tuple(fn_constructor_args or ()),
                      fn_constructor_kwargs=dict(fn_constructor_kwargs or {}),
                      threads=pool_size(concurrency, kind), **batch)


# ---------------------------------------------------------------------------------- normalisation


def columns_dataset(columns: Mapping, where: str) -> Dataset:
    """A columnar dataset from a mapping of column name -> values; ConfigError naming `where`."""
    built = {}
    for key, values in columns.items():
        if not isinstance(key, str):
            raise ConfigError(f"{where} has column name {key!r} ({type(key).__name__}); column names must be "
                              "str.")
        built[key] = as_column(values, f"{where}[{key!r}]")
    return Dataset(InMemory(ColumnTable(built, where)))


def rows_dataset(rows: Any, where: str, wrap_key: Optional[str] = None) -> Dataset:
    """A dataset of `rows` (a sequence or map-style dataset). Lists of dicts sharing their keys, and
    lists of plain values when `wrap_key` is given, are stored as columns when every column stacks."""
    if isinstance(rows, (list, tuple)) and rows:
        columns = rows_to_columns(rows, wrap_key)
        if columns is not None:
            return Dataset(InMemory(ColumnTable(columns, where)))
    return Dataset(InMemory(RowTable(rows, wrap_key)))


def _is_iterable_dataset(value: Any) -> bool:
    return any(cls.__name__ == "IterableDataset" for cls in type(value).__mro__)


def as_dataset(value: Any, where: str) -> Dataset:
    """`value` as a `Dataset` (accepted values in the module doc); ConfigError naming `where`, the
    value's type and the accepted kinds otherwise."""
    if isinstance(value, Dataset):
        return value
    module = type(value).__module__ or ""
    if module.split(".")[0] == "ray":
        raise ConfigError(f"{where} is a {module}.{type(value).__name__}; minitrain does not run Ray Data. Build "
                          "the dataset with minitrain.data instead (same names: minitrain.data.read_parquet, "
                          "from_items, from_numpy, from_pandas, ...).")
    if module.split(".")[0] == "pandas" and hasattr(value, "columns"):
        return Dataset(InMemory(pandas_table(value)))
    if isinstance(value, Mapping):
        return columns_dataset(value, where)
    if module.split(".")[0] in ("numpy", "torch") and hasattr(value, "shape"):
        return columns_dataset({"data": value}, where)
    if isinstance(value, (str, bytes)):
        raise ConfigError(f"{where} is the string {value!r}; to read files use "
                          "minitrain.data.read_csv/read_json/read_parquet(path). Accepted: " + ACCEPTED + ".")
    if _is_iterable_dataset(value):
        raise ConfigError(f"{where} is an IterableDataset ({type(value).__name__}), whose rows cannot be split "
                          "by index. Pass a map-style dataset (__len__ and __getitem__), or iterate it yourself "
                          "with minitrain.torch.prepare_data_loader.")
    if callable(value) and (isinstance(value, type) or not hasattr(value, "__len__")):
        return Dataset(Factory(value, where))
    if hasattr(value, "__len__") and hasattr(value, "__getitem__"):
        return rows_dataset(value, where)
    raise ConfigError(f"{where} is a {module}.{type(value).__qualname__}, which minitrain cannot read rows from. "
                      "Accepted: " + ACCEPTED + ".")
