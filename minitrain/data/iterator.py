"""`DataIterator`: one rank's view of one dataset, as `minitrain.get_dataset_shard(name)` returns it.

Epochs: every pass starts a new epoch. A pass is one `iter(...)` of the iterable that `iter_rows()`,
`iter_batches()` or `iter_torch_batches()` returns (a `for` loop over it), as in Ray, where calling
`iter_torch_batches()` once and looping over the result each epoch also works. The first pass is
epoch 0; `set_epoch(n)` makes the next pass epoch n (for example after resuming from a checkpoint).
Every rank must start the same passes in the same order, with the same `batch_size` and `drop_last`,
for the shards to stay disjoint. Which rows a pass reads is `minitrain.data.sharding`'s plan.

Batches are built on the calling thread; `prefetch_batches` is accepted for compatibility and ignored.
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
from minitrain.data.sharding import (
    batch_bounds, check_batch_size, derive_seed, local_shuffle, shard_indices,
)
from minitrain.data.tables import ColumnTable


class Resolvable(Protocol):
    """What a DataIterator needs of its dataset (a `minitrain.data.Dataset`, which imports this module):
    `_resolve()` -> (rows as a table, whether they are shuffled, the shuffle seed)."""

    def _resolve(self) -> tuple[Any, bool, Optional[int]]: ...


class _Passes(Iterable):
    """An iterable whose every `iter()` starts a new pass (epoch) of its iterator."""

    def __init__(self, start: Callable[[], Iterator]):
        self._start = start

    def __iter__(self) -> Iterator:
        # Starting a pass (it may load the rows) and each next() are the rank's data wait (its
        # telemetry; see minitrain.waits).
        with waits.blocked(waits.DATA):
            rows = self._start()
        return waits.timed_iterator(rows)


class DataIterator:
    """Rows of one dataset for one rank: `iter_rows`, `iter_batches`, `iter_torch_batches`.

    A split dataset gives rank r of N a disjoint block of about 1/N of the rows (every row is read by
    exactly one rank per epoch unless `drop_last` trims the epoch); an unsplit one gives every rank
    all rows. Shuffled datasets (`Dataset.random_shuffle`) are reordered every epoch from their seed.
    The rows are loaded on first use (a factory is called, files are read) and kept for later epochs.
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
        self._loaded: Optional[tuple[Any, Optional[int]]] = None

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
        if self._loaded is None:
            table, shuffled, seed = self._dataset._resolve()
            if shuffled and seed is None:
                seed = self._run_seed
            self._loaded = (table, seed if shuffled else None)
        return self._loaded

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
        if buffer_size is not None:
            local_shuffle(np.zeros(0, dtype=np.int64), buffer_size, 0)  # validates the size now
        if isinstance(prefetch_batches, bool) or not isinstance(prefetch_batches, int) or prefetch_batches < 0:
            raise ValueError(f"prefetch_batches={prefetch_batches!r} must be a non-negative int.")

        def start() -> Iterator:
            epoch = self._claim_epoch()
            table, indices = self._plan(epoch, batch_size, drop_last, buffer_size, shuffle_seed)
            return (make(table, indices[a:b]) for a, b in batch_bounds(len(indices), batch_size, drop_last))

        return _Passes(start)

    # ------------------------------------------------------------------ public iteration

    def iter_rows(self, *, prefetch_batches: int = 1, prefetch_blocks: int = 0) -> Iterable[Any]:
        """An iterable over this rank's rows, one pass (epoch) per `iter()`. Columnar datasets give
        `{column: value}` dicts; row datasets give their rows. The prefetch arguments are ignored."""
        def start() -> Iterator:
            table, indices = self._plan(self._claim_epoch(), None, False, None, None)
            return (table.row(index) for index in indices.tolist())

        return _Passes(start)

    def iter_batches(self, *, prefetch_batches: int = 1, batch_size: Optional[int] = 256,
                     batch_format: str = "default", drop_last: bool = False,
                     local_shuffle_buffer_size: Optional[int] = None,
                     local_shuffle_seed: Optional[int] = None) -> Iterable[Any]:
        """An iterable over batches of this rank's rows, one pass (epoch) per `iter()`.

        "default"/"numpy": a dict of column -> numpy array (row datasets: rows collated key by key or
        position by position); "pandas": a DataFrame. `batch_size=None`: the whole shard as one batch.
        `drop_last`: only full batches, and every rank gets the same number (module doc of
        `minitrain.data.sharding`). `local_shuffle_buffer_size`: reorder this rank's rows through a
        buffer of that many rows, from `local_shuffle_seed` (with the epoch and rank mixed in, so each
        epoch differs) or at random when it is None.
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
        output to a device itself, so it cannot be combined with `dtypes` or `device` (as in Ray).
        """
        if collate_fn is not None and (dtypes is not None or device != "auto"):
            raise ValueError("collate_fn cannot be used with dtypes and device. You should manually move the "
                             "output Torch tensors to the desired dtype and device outside of collate_fn.")
        resolved: list = []

        def make(table: Any, indices: np.ndarray) -> Any:
            raw = table.take(indices)
            if collate_fn is not None:
                return collate_fn(raw)
            from minitrain.data import torch_batches

            if not resolved:
                resolved.append(torch_batches.resolve_device(device, self._context))
            if isinstance(table, ColumnTable):
                return torch_batches.columns_to_torch(raw, dtypes, resolved[0], pin_memory)
            return torch_batches.rows_to_torch(raw, dtypes, resolved[0], pin_memory)

        return self._batches(batch_size, drop_last, local_shuffle_buffer_size, local_shuffle_seed,
                             prefetch_batches, make)

    def stats(self) -> str:
        """A one-line description of this shard (Ray returns execution statistics here)."""
        table, seed = self._load()
        return (f"dataset {self._name!r}: rank {self._rank} of {self._world_size}, {table.num_rows} rows in the "
                f"dataset, shuffle seed {seed}, next epoch {self._next_epoch}")
