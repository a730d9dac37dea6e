"""Building batches ahead of the consumer on a background thread (`prefetch_batches`, as in Ray Data).

`prefetched(source, depth)` returns an iterator over the same items as `source`, in the same order,
while one daemon thread pulls items from `source` until `depth` of them wait in a buffer ("depth
batches ahead of the one the consumer holds"); it waits for room before building the next one, so at
most `depth` finished items are ever held. `depth=0` returns `source` itself: no thread.

Contract of the returned `Prefetcher`:
- Order and content are exactly `source`'s: one producer, one FIFO buffer.
- An exception raised by `source` (a reader, a `map_batches` function, a tensor conversion) is raised
  by the consumer's `next()` after the items that came before it, where the consumer would have met it
  without prefetch; the producer stops there.
- `close()` (also run when the iterator is garbage collected, through `weakref.finalize`) tells the
  producer to stop, waits for it to finish the item it is building, closes `source` on the producer
  thread (a generator's `finally` blocks run there) and joins it: no thread is left behind.
- The consumer's time blocked in `next()` is its data wait; callers time `next()` (`minitrain.waits`).
  Time the producer spends building is not the consumer's wait.
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from collections.abc import Iterator
from typing import Any

_END = object()  # the producer's last buffer entry when `source` is exhausted


def check_prefetch_batches(prefetch_batches: Any) -> None:
    """ValueError naming the argument unless it is a non-negative int (0 turns prefetching off)."""
    if isinstance(prefetch_batches, bool) or not isinstance(prefetch_batches, int) or prefetch_batches < 0:
        raise ValueError(f"prefetch_batches={prefetch_batches!r} must be a non-negative int: the number of "
                         "batches built ahead on a background thread (0 builds them on the calling thread).")


def prefetched(source: Iterator, depth: int, *, name: str = "data") -> Iterator:
    """`source` read `depth` items ahead on a background thread (module doc), or `source` itself when
    `depth` is 0."""
    check_prefetch_batches(depth)
    if depth == 0:
        return source
    return Prefetcher(source, depth, name=name)


class _Shared:
    """What the producer thread and the consumer share (never the Prefetcher itself, so that dropping
    the consumer's last reference collects it and its finalizer stops the thread)."""

    def __init__(self, depth: int):
        self.depth = depth
        self.cond = threading.Condition()
        self.buffer: deque = deque()  # items, then _END or a BaseException (the producer's last entry)
        self.stopping = False


def _produce(shared: _Shared, source: Iterator) -> None:
    try:
        while True:
            with shared.cond:
                while len(shared.buffer) >= shared.depth and not shared.stopping:
                    shared.cond.wait()
                if shared.stopping:
                    return
            try:
                item = next(source)
            except StopIteration:
                item = _END
            except BaseException as error:  # handed to the consumer, raised where it would have been
                item = error
            with shared.cond:
                shared.buffer.append(item)
                shared.cond.notify_all()
            if item is _END or isinstance(item, BaseException):
                return
    finally:
        close = getattr(source, "close", None)
        if close is not None:
            try:
                close()
            except Exception:  # noqa: BLE001 - a failing cleanup must not hide the consumer's result
                pass


def _shutdown(shared: _Shared, thread: threading.Thread) -> None:
    with shared.cond:
        shared.stopping = True
        shared.buffer.clear()  # batches nobody will read (may hold device memory)
        shared.cond.notify_all()
    if thread is not threading.current_thread():  # a finalizer may run on the producer itself (gc)
        thread.join()


class Prefetcher(Iterator):
    """An iterator over `source`'s items, built `depth` ahead on a daemon thread (module doc)."""

    def __init__(self, source: Iterator, depth: int, *, name: str = "data"):
        check_prefetch_batches(depth)
        if depth == 0:
            raise ValueError("Prefetcher needs depth >= 1; use prefetched(), which returns the source for 0.")
        self._shared = _Shared(depth)
        self._done = False
        thread = threading.Thread(target=_produce, args=(self._shared, source), daemon=True,
                                  name=f"minitrain-prefetch-{name}")
        self._finalizer = weakref.finalize(self, _shutdown, self._shared, thread)
        self._finalizer.atexit = False  # at interpreter exit the daemon thread just ends with it
        thread.start()

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        shared = self._shared
        with shared.cond:
            while not shared.buffer and not shared.stopping:
                shared.cond.wait()
            item = shared.buffer.popleft() if shared.buffer else _END  # empty: closed meanwhile
            shared.cond.notify_all()  # room for the producer
        if item is _END:
            self._finish()
            raise StopIteration
        if isinstance(item, BaseException):
            self._finish()
            raise item
        return item

    def ready(self) -> int:
        """How many finished items wait in the buffer now (diagnostics and tests)."""
        with self._shared.cond:
            return sum(1 for item in self._shared.buffer if item is not _END
                       and not isinstance(item, BaseException))

    def close(self) -> None:
        """Stop the producer and join it (idempotent); later `next()` calls raise StopIteration."""
        self._finish()

    def _finish(self) -> None:
        self._done = True
        self._finalizer()
