"""`DataIterator`: one rank's view of one dataset, as `minitrain.get_dataset_shard(name)` returns it.

Epochs: every pass starts a new epoch. A pass is one `iter(...)` of the iterable that `iter_rows()`,
`iter_batches()` or `iter_torch_batches()` returns (a `for` loop over it), or of the `tf.data.Dataset`
`to_tf()` returns, as in Ray, where calling `iter_torch_batches()` once and looping over the result
each epoch also works. The first pass is
epoch 0; `set_epoch(n)` makes the next pass epoch n (for example after resuming from a checkpoint).
Every rank must start the same passes in the same order, with the same `batch_size` and `drop_last`,
for the shards to stay disjoint. Which rows a pass reads is `minitrain.data.sharding`'s plan.

`prefetch_batches=N` (default 1, as in Ray) builds up to N batches ahead of the consumer on a
background thread (`minitrain.data.prefetch`): the same batches in the same order as `N=0` (built on
the calling thread), the producer's exceptions raised where the consumer meets them, and the thread
stopped and joined when the pass ends, is closed or is garbage collected. The rank's data wait
(`minitrain.waits`) is the time the consumer is blocked in `next()`: with prefetch, on the buffer.
The pass plan (epoch, shard, local shuffle order) is fixed on the calling thread at `iter()`.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Optional, Protocol

import numpy as np

from minitrain import waits
from minitrain.context import TrainContext
from minitrain.data.batches import check_batch_format, format_batch, numpy_collate
from minitrain.data.prefetch import check_prefetch_batches, prefetched
from minitrain.data.sharding import (
    batch_bounds, check_batch_size, derive_seed, local_shuffle, shard_indices,
)
from minitrain.data.tables import ColumnTable, RowTable, numpy_columns


class Resolvable(Protocol):
    """What a DataIterator needs of its dataset (a `minitrain.data.Dataset`, which imports this module):
    `_resolve()` -> (rows as a table, whether they are shuffled, the shuffle seed); `_holding(table)` ->
    a dataset of the same kind holding `table` in memory (for `materialize`)."""

    def _resolve(self) -> tuple[Any, bool, Optional[int]]: ...

    def _holding(self, table: Any) -> Any: ...


class _Passes(Iterable):
    """An iterable whose every `iter()` starts a new pass (epoch) of its iterator."""

    def __init__(self, start: Callable[[], Iterator]):
        self._start = start

    def __iter__(self) -> Iterator:
        # Starting a pass (it may load the rows) and each next() are the rank's data wait (its
        # telemetry; see minitrain.waits).
        with waits.blocked(waits.DATA):
            rows = self._start()
        return _timed_pass(rows)


def _timed_pass(source: Iterator) -> Iterator:
    """`source` with every `next()` timed as data wait; closing this generator (a `break`, an exception
    in the loop, garbage collection) closes `source`, which stops a prefetch thread at once."""
    try:
        yield from waits.timed_iterator(source)
    finally:
        close = getattr(source, "close", None)
        if close is not None:
            close()


def _flatten(chunks: Iterator[list]) -> Iterator:
    """The items of consecutive lists, closing `chunks` when closed early."""
    try:
        for chunk in chunks:
            yield from chunk
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()


# iter_rows builds rows in chunks of this many when it prefetches (Ray's iter_rows reads whole blocks).
_ROWS_PER_PREFETCH = 256


class DataIterator:
    """Rows of one dataset for one rank: `iter_rows`, `iter_batches`, `iter_torch_batches`, `to_tf`.

    A split dataset gives rank r of N a disjoint block of about 1/N of the rows (every row is read by
    exactly one rank per epoch unless `drop_last` trims the epoch); an unsplit one gives every rank
    all rows. Shuffled datasets (`Dataset.random_shuffle`) are reordered every epoch from their seed.
    The rows are loaded on first use (a factory is called, files are read) and kept for later epochs;
    a dataset's transforms (`map_batches`, `map`, `flat_map`, `filter`) run again on every pass, as
    Ray's lazy datasets re-run them each epoch, unless it was `materialize()`d before `fit()`.
    """

    def __init__(self, dataset: Resolvable, *, world_size: int = 1, rank: int = 0, run_seed: int = 0,
                 context: Optional[TrainContext] = None, name: Optional[str] = None):
        self._dataset = dataset
        self._world_size = world_size
        self._rank = rank
        self._run_seed = run_seed
        self._context = context
        self._name = name
        self._next_epoch = 0
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return (f"DataIterator({self._name!r}, rank={self._rank}, world_size={self._world_size}, "
                f"next_epoch={self._next_epoch})")

    # ------------------------------------------------------------------ epochs

    @property
    def epoch(self) -> int:
        """The epoch the next pass will read."""
        return self._next_epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass read epoch `epoch` (a non-negative int); later passes count up from it.
        A minitrain extension, like `DistributedSampler.set_epoch`: call it with the same value on every
        rank, e.g. with the epoch you resume from after `get_checkpoint()`."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"set_epoch({epoch!r}): the epoch must be a non-negative int.")
        with self._lock:
            self._next_epoch = epoch

    def _claim_epoch(self) -> int:
        with self._lock:
            epoch = self._next_epoch
            self._next_epoch += 1
            return epoch

    # ------------------------------------------------------------------ rows of a pass

    def _load(self) -> tuple[Any, Optional[int]]:
        """(this pass's table, shuffle seed or None). The dataset keeps its loaded source; its
        transforms run again here, once per pass (Ray's lazy execution; see `Dataset._resolve`)."""
        table, shuffled, seed = self._dataset._resolve()
        if shuffled and seed is None:
            seed = self._run_seed
        return table, seed if shuffled else None

    def _plan(self, epoch: int, batch_size: Optional[int], drop_last: bool,
              buffer_size: Optional[int], shuffle_seed: Optional[int]) -> tuple[Any, np.ndarray]:
        table, seed = self._load()
        indices = shard_indices(table.num_rows, self._world_size, self._rank, seed=seed, epoch=epoch,
                                batch_size=batch_size, drop_last=drop_last)
        if buffer_size is not None:
            if shuffle_seed is None:
                local_seed = random.SystemRandom().getrandbits(63)
            else:
                local_seed = derive_seed(shuffle_seed, epoch, self._rank)
            indices = local_shuffle(indices, buffer_size, local_seed)
        return table, indices

    def _batches(self, batch_size: Optional[int], drop_last: bool, buffer_size: Optional[int],
                 shuffle_seed: Optional[int], prefetch_batches: int,
                 make: Callable[[Any, np.ndarray], Any]) -> Iterable:
        check_batch_size(batch_size)
        if drop_last and batch_size is None:
            raise ValueError("drop_last=True needs a batch_size: with batch_size=None the whole shard is one "
                             "batch and there is no partial batch to drop. Pass a batch_size or drop_last=False.")
        if buffer_size is not None and batch_size is None:  # Ray raises the same ValueError
            raise ValueError("A custom batch size must be provided when using a local shuffle buffer: pass "
                             "batch_size=<int> with local_shuffle_buffer_size, or drop the buffer.")
        if buffer_size is not None:
            local_shuffle(np.zeros(0, dtype=np.int64), buffer_size, 0)  # validates the size now
        # A seed without a buffer seeds nothing random (the order is already deterministic); Ray allows
        # it, and loops pass one seed to every call, so it is accepted, but it must be a seed.
        if shuffle_seed is not None and (isinstance(shuffle_seed, bool) or not isinstance(shuffle_seed, int)):
            raise ValueError(f"local_shuffle_seed={shuffle_seed!r} must be an int (or None).")
        check_prefetch_batches(prefetch_batches)

        def start() -> Iterator:
            epoch = self._claim_epoch()
            table, indices = self._plan(epoch, batch_size, drop_last, buffer_size, shuffle_seed)
            batches = (make(table, indices[a:b]) for a, b in batch_bounds(len(indices), batch_size, drop_last))
            return prefetched(batches, prefetch_batches, name=str(self._name or "dataset"))

        return _Passes(start)

    # ------------------------------------------------------------------ public iteration

    def materialize(self) -> Any:
        """This rank's rows of one pass (the next epoch, as `iter_rows` would read them) held in memory,
        as a `minitrain.data.Dataset` (`to_pandas()`, `iter_batches()`, ...), as Ray's
        `DataIterator.materialize()`; what XGBoost and LightGBM training functions build their matrix from."""
        with waits.blocked(waits.DATA):
            table, indices = self._plan(self._claim_epoch(), None, False, None, None)
            rows = table.take(indices)
        # A row table's take() already applied its wrap key; a column table keeps its (maybe empty) columns.
        held = ColumnTable(rows, where=f"dataset {self._name!r}") if isinstance(table, ColumnTable) else RowTable(rows)
        return self._dataset._holding(held)

    def iter_rows(self, *, prefetch_batches: int = 1, prefetch_blocks: int = 0) -> Iterable[Any]:
        """An iterable over this rank's rows, one pass (epoch) per `iter()`. Columnar datasets give
        `{column: value}` dicts; row datasets give their rows.

        `prefetch_batches=N` builds rows in chunks of 256, N chunks ahead on a background thread (0: on
        the calling thread). Ray 2.10-2.39 took it here too (Ray 2.40 dropped both prefetch arguments
        of iter_rows). `prefetch_blocks` is Ray's older name, which Ray's batch iterators refuse since
        2.4: anything but 0 raises ValueError pointing to `prefetch_batches`.
        """
        if prefetch_blocks != 0:
            raise ValueError(f"prefetch_blocks={prefetch_blocks!r} is deprecated in Ray and not supported: "
                             "use prefetch_batches to set the amount of prefetching in batches instead of "
                             "blocks.")
        check_prefetch_batches(prefetch_batches)

        def start() -> Iterator:
            table, indices = self._plan(self._claim_epoch(), None, False, None, None)
            if prefetch_batches == 0:
                return (table.row(index) for index in indices.tolist())
            order = indices.tolist()
            chunks = ([table.row(index) for index in order[at:at + _ROWS_PER_PREFETCH]]
                      for at in range(0, len(order), _ROWS_PER_PREFETCH))
            return _flatten(prefetched(chunks, prefetch_batches, name=str(self._name or "dataset")))

        return _Passes(start)

    def iter_batches(self, *, prefetch_batches: int = 1, batch_size: Optional[int] = 256,
                     batch_format: str = "default", drop_last: bool = False,
                     local_shuffle_buffer_size: Optional[int] = None,
                     local_shuffle_seed: Optional[int] = None) -> Iterable[Any]:
        """An iterable over batches of this rank's rows, one pass (epoch) per `iter()`.

        "default"/"numpy": a dict of column -> numpy array (row datasets: rows collated key by key or
        position by position); "pandas": a DataFrame. `batch_size=None`: the whole shard as one batch.
        `drop_last`: only full batches, and every rank gets the same number (module doc of
        `minitrain.data.sharding`); it needs a batch_size. `local_shuffle_buffer_size`: reorder this
        rank's rows through a buffer of that many rows, from `local_shuffle_seed` (with the epoch and
        rank mixed in, so each epoch differs) or at random when it is None (without a buffer size the
        order is deterministic and the seed has nothing to do). `prefetch_batches`: batches built
        ahead on a background thread (module doc); 0 builds them on the calling thread.
        """
        check_batch_format(batch_format)

        def make(table: Any, indices: np.ndarray) -> Any:
            raw = table.take(indices)
            return format_batch(raw if isinstance(table, ColumnTable) else numpy_collate(raw), batch_format)

        return self._batches(batch_size, drop_last, local_shuffle_buffer_size, local_shuffle_seed,
                             prefetch_batches, make)

    def iter_torch_batches(self, *, prefetch_batches: int = 1, batch_size: Optional[int] = 256,
                           dtypes: Any = None, device: Any = "auto", collate_fn: Optional[Callable] = None,
                           drop_last: bool = False, local_shuffle_buffer_size: Optional[int] = None,
                           local_shuffle_seed: Optional[int] = None, pin_memory: bool = False) -> Iterable[Any]:
        """Like `iter_batches`, with torch tensors: a dict of column -> tensor for columnar datasets, or
        the rows collated by torch's `default_collate` (as a DataLoader would) for row datasets.

        `dtypes`: one torch dtype or a dict of column -> dtype. `device="auto"`: this worker's device
        (`minitrain.torch.get_device()`); None leaves tensors on the CPU. `collate_fn(batch)` replaces
        the conversion: it gets the numpy dict (columnar) or the list of rows, and then it moves its
        output to a device itself, so it cannot be combined with `dtypes`, `device` or `pin_memory` (as
        in Ray). `pin_memory`: pin the host tensors before the copy to a GPU (a warning, not an error,
        where there is no CUDA). With `prefetch_batches`, the conversion and the host-to-device copy
        run on the prefetch thread, overlapping the training step. A dict of `dtypes` must name
        columns the batches have.
        """
        if collate_fn is not None and (dtypes is not None or device != "auto"):
            raise ValueError("collate_fn cannot be used with dtypes and device. You should manually move the "
                             "output Torch tensors to the desired dtype and device outside of collate_fn.")
        if collate_fn is not None and pin_memory:
            raise ValueError("pin_memory is only supported when using `DefaultCollateFn`: with collate_fn, "
                             "pin (and move) the tensors inside your collate_fn.")
        if collate_fn is not None and not callable(collate_fn):
            raise ValueError(f"collate_fn={collate_fn!r} is not callable; pass a function of the batch.")
        from minitrain.data import torch_batches

        torch_batches.check_dtypes(dtypes)
        torch_batches.warn_if_pin_memory_unused(pin_memory)
        # Resolved here, on the calling thread: torch's current CUDA device is per thread, and the
        # batches may be built on the prefetch thread.
        target = None if collate_fn is not None else torch_batches.resolve_device(device, self._context)

        def make(table: Any, indices: np.ndarray) -> Any:
            raw = table.take(indices)
            if isinstance(table, ColumnTable):  # pandas extension columns (categorical, ...) as numpy
                raw = numpy_columns(raw)
            if collate_fn is not None:
                return collate_fn(raw)
            if isinstance(table, ColumnTable):
                return torch_batches.columns_to_torch(raw, dtypes, target, pin_memory)
            return torch_batches.rows_to_torch(raw, dtypes, target, pin_memory)

        return self._batches(batch_size, drop_last, local_shuffle_buffer_size, local_shuffle_seed,
                             prefetch_batches, make)

    def to_tf(self, feature_columns: Any, label_columns: Any, *, additional_columns: Any = None,
              prefetch_batches: int = 1, batch_size: int = 1, drop_last: bool = False,
              local_shuffle_buffer_size: Optional[int] = None, local_shuffle_seed: Optional[int] = None,
              feature_type_spec: Any = None, label_type_spec: Any = None, additional_type_spec: Any = None) -> Any:
        """This rank's rows as a `tf.data.Dataset` of `(features, labels)` batches, or `(features, labels,
        additional)` with `additional_columns` (e.g. sample weights), as Ray Data's `to_tf`.

        Each of `feature_columns`, `label_columns`, `additional_columns` is a column name (the batch
        part is one tensor) or a list of names (a dict of column -> tensor). Each iteration of the
        dataset (each Keras epoch) is a new pass of `iter_batches` with `batch_size` (default 1, as
        Ray's), `drop_last`, the local shuffle and `prefetch_batches`, checked here. The type specs
        default to each column's dtype and per-row shape, `(None, ...)` (strings: tf.string); give a
        `tf.TypeSpec` (a dict of them for a list of columns) to cast. Auto-sharding is off (the rows
        are already this rank's). A column the dataset lacks raises ValueError naming the valid ones.
        """
        from minitrain.data import tf_batches

        table, _ = self._load()
        samples = tf_batches.column_samples(table, f"dataset {self._name!r}")
        tf_batches.check_columns(feature_columns, "feature_columns", list(samples))
        tf_batches.check_columns(label_columns, "label_columns", list(samples))
        tf_batches.check_columns(additional_columns, "additional_columns", list(samples), optional=True)
        batches = self.iter_batches(prefetch_batches=prefetch_batches, batch_size=batch_size, drop_last=drop_last,
                                    local_shuffle_buffer_size=local_shuffle_buffer_size,
                                    local_shuffle_seed=local_shuffle_seed)
        specs = (tf_batches.type_specs(samples, feature_columns, feature_type_spec, "feature_type_spec"),
                 tf_batches.type_specs(samples, label_columns, label_type_spec, "label_type_spec"))
        if additional_columns is not None:
            specs += (tf_batches.type_specs(samples, additional_columns, additional_type_spec,
                                            "additional_type_spec"),)
        return tf_batches.dataset(batches, feature_columns, label_columns, additional_columns, specs)

    def stats(self) -> str:
        """A one-line description of this shard (Ray returns execution statistics here)."""
        table, seed = self._load()
        return (f"dataset {self._name!r}: rank {self._rank} of {self._world_size}, {table.num_rows} rows in the "
                f"dataset, shuffle seed {seed}, next epoch {self._next_epoch}")
