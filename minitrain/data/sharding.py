"""Which rows a rank reads in one pass (epoch), as pure functions of counts and seeds (numpy only).

The plan for one pass over a dataset of `num_rows` rows, seen by rank `rank` of `world_size`:

1. **Epoch order.** Without a shuffle seed the order is 0..num_rows-1 in every epoch. With a seed it
   is a permutation drawn from `(seed, epoch)`: the same seed gives the same sequence of orders, and
   every epoch has its own order. Every rank computes the same order without talking.
2. **Trim (drop_last only).** With `drop_last` and a batch size `b`, the epoch order is cut to the
   largest multiple of `world_size * b` rows, so every rank gets the same number of full batches (the
   dropped rows are the tail of the epoch's order, so a shuffled dataset drops different rows each
   epoch). Without `drop_last` nothing is dropped: every row is read exactly once per epoch across
   the ranks, and ranks' batch counts may differ by one.
3. **Split.** The (trimmed) order is cut into `world_size` contiguous blocks whose sizes differ by at
   most one row; rank r reads block r. Unsplit datasets use `world_size=1, rank=0`: all rows.
4. **Local shuffle (optional).** A rank may reorder its own block through a shuffle buffer
   (`local_shuffle`), which never adds or drops rows.
5. **Batches.** The block is cut into consecutive batches (`batch_bounds`).
"""

from __future__ import annotations

import random
from typing import Optional

import numpy as np

_SEED_MASK = (1 << 64) - 1


def check_batch_size(batch_size: Optional[int]) -> None:
    """ValueError unless `batch_size` is None (one batch per pass) or a positive int."""
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int)
                                   or batch_size <= 0):
        raise ValueError(f"batch_size={batch_size!r} must be a positive int, or None for one batch per pass.")


def epoch_order(num_rows: int, seed: Optional[int], epoch: int) -> np.ndarray:
    """Row indices of the whole dataset in `epoch`: 0..num_rows-1 when `seed` is None, otherwise a
    permutation determined by `(seed, epoch)` alone (int64)."""
    if seed is None:
        return np.arange(num_rows, dtype=np.int64)
    sequence = np.random.SeedSequence([seed & _SEED_MASK, epoch & _SEED_MASK])
    return np.random.Generator(np.random.PCG64(sequence)).permutation(num_rows).astype(np.int64, copy=False)


def shard_bounds(num_rows: int, world_size: int, rank: int) -> tuple[int, int]:
    """[start, stop) of rank's contiguous block: the first `num_rows % world_size` ranks get one more row."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a world of size {world_size}")
    base, extra = divmod(num_rows, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def kept_rows(num_rows: int, world_size: int, batch_size: Optional[int], drop_last: bool) -> int:
    """How many rows of an epoch are read across all ranks (all of them unless `drop_last`)."""
    if not drop_last or batch_size is None:
        return num_rows
    return num_rows - num_rows % (world_size * batch_size)


def shard_indices(num_rows: int, world_size: int, rank: int, *, seed: Optional[int] = None, epoch: int = 0,
                  batch_size: Optional[int] = None, drop_last: bool = False) -> np.ndarray:
    """The row indices rank `rank` reads in `epoch`, in reading order (steps 1-3 of the module doc)."""
    order = epoch_order(num_rows, seed, epoch)
    order = order[:kept_rows(num_rows, world_size, batch_size, drop_last)]
    start, stop = shard_bounds(len(order), world_size, rank)
    return order[start:stop]


def batch_bounds(num_rows: int, batch_size: Optional[int], drop_last: bool) -> list[tuple[int, int]]:
    """Consecutive [start, stop) batches over `num_rows` rows; the last one is partial unless
    `drop_last`, which leaves it out. `batch_size=None` is one batch of everything (none when empty)."""
    if batch_size is None:
        return [(0, num_rows)] if num_rows else []
    stop_at = num_rows - num_rows % batch_size if drop_last else num_rows
    return [(start, min(start + batch_size, stop_at)) for start in range(0, stop_at, batch_size)]


def derive_seed(*parts: int) -> int:
    """A 63-bit seed determined by the integers `parts` (e.g. a user seed, an epoch and a rank)."""
    sequence = np.random.SeedSequence([part & _SEED_MASK for part in parts])
    return int(sequence.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


def local_shuffle(indices: np.ndarray, buffer_size: int, seed: int) -> np.ndarray:
    """`indices` reordered through a shuffle buffer, as Ray's `local_shuffle_buffer_size`.

    Rows enter a buffer in order; once it holds `buffer_size` rows, each next output is drawn at random
    from it. The result is a permutation of `indices` determined by `seed`; a buffer of 1 keeps the
    order, and a buffer as large as the input shuffles it completely.
    """
    if isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or buffer_size <= 0:
        raise ValueError(f"local_shuffle_buffer_size={buffer_size!r} must be a positive int (or None for no "
                         "local shuffle).")
    rng = random.Random(seed)
    buffer: list[int] = []
    out: list[int] = []
    for index in indices.tolist():
        buffer.append(index)
        if len(buffer) >= buffer_size:
            out.append(_pop_random(buffer, rng))
    while buffer:
        out.append(_pop_random(buffer, rng))
    return np.asarray(out, dtype=np.int64)


def _pop_random(buffer: list[int], rng: random.Random) -> int:
    position = rng.randrange(len(buffer))
    buffer[position], buffer[-1] = buffer[-1], buffer[position]
    return buffer.pop()
