"""Torch helpers for the training function: `ray.train.torch`'s utilities, same names and defaults.

Every function that needs to know its place in the run reads it from the current session
(`minitrain._session`), so calling one outside a training function raises the "cannot be used outside
of a minitrain training function" `RuntimeError` that names it.

Deliberate differences from Ray Train 2.60 (listed in docs/porting.md):
- `prepare_model(parallel_strategy=...)` accepts only "ddp", "fsdp" or None and raises `ValueError`
  for anything else, on any world size (Ray silently treats every other string as "fsdp").
- `prepare_model(parallel_strategy="fsdp")` also works on CPU workers with gloo (Ray raises
  `RuntimeError` when CUDA is unavailable); useful for testing sharded code paths on a laptop.
- `prepare_data_loader` keeps `persistent_workers`, `prefetch_factor`, `multiprocessing_context`,
  `pin_memory_device` and `in_order` when it rebuilds a loader (Ray drops them), passes the rank and
  world size to `DistributedSampler` explicitly (no process group needed), refuses to rebuild a loader
  that uses a custom `batch_sampler` (Ray silently turns it into an unbatched loader), and returns CPU
  loaders unwrapped (nothing to move).
- The loader `prepare_data_loader` returns counts the time inside its iterators' `next()` as the
  rank's data wait (telemetry, `minitrain.waits`); it stays the same object with the same type name.
"""

from __future__ import annotations

import collections.abc
import logging
import os
import random
from typing import Any, Optional, Union

import torch
from torch import nn
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
)

from minitrain import _session, waits
from minitrain.context import TrainContext

logger = logging.getLogger(__name__)

_PARALLEL_STRATEGIES = ("ddp", "fsdp", None)

# Seed from the last `enable_reproducibility()` in this process; `prepare_data_loader` uses it to
# seed the rebuilt loader's generator and worker processes, as Ray does.
_reproducibility_seed: Optional[int] = None


def _context(function_name: str) -> TrainContext:
    return _session.current(function_name).context


def _devices_for(context: TrainContext) -> list[torch.device]:
    if context.device_indices and torch.cuda.is_available():
        return [torch.device(f"cuda:{index}") for index in context.device_indices]
    if context.local_mode and torch.cuda.is_available():
        return [torch.device(f"cuda:{torch.cuda.current_device()}")]
    return [torch.device("cpu")]


def get_devices() -> list[torch.device]:
    """All torch devices assigned to this worker, lowest first.

    GPU workers get `cuda:<i>` for each of their GPUs, `i` being the GPU's index inside this process's
    `CUDA_VISIBLE_DEVICES`; CPU workers get `[cpu]`. In local mode (`ScalingConfig(num_workers=0)`)
    the result is `[cuda:<torch.cuda.current_device()>]` when CUDA is available, else `[cpu]`.
    Raises `RuntimeError` outside a training function.
    """
    return _devices_for(_context("get_devices"))


def get_device() -> torch.device:
    """This worker's main torch device: `get_devices()[0]` (see there).

    Raises `RuntimeError` outside a training function.
    """
    return _devices_for(_context("get_device"))[0]


def prepare_model(
    model: nn.Module,
    move_to_device: Union[bool, torch.device] = True,
    parallel_strategy: Optional[str] = "ddp",
    parallel_strategy_kwargs: Optional[dict[str, Any]] = None,
) -> nn.Module:
    """Move `model` to this worker's device and wrap it for data-parallel training.

    - Device: `move_to_device` when it is a `torch.device`, else `get_device()`; for a CUDA device,
      `torch.cuda.set_device` is called. The model is moved there unless `move_to_device` is False.
    - Wrapping happens only when `parallel_strategy` is set and the world size is above 1:
      "ddp" -> `DistributedDataParallel(model, **parallel_strategy_kwargs)` (with
      `device_ids=[device], output_device=device` first on CUDA); "fsdp" ->
      `FullyShardedDataParallel(model, **parallel_strategy_kwargs)`, on CUDA or (unlike Ray) on CPU
      with gloo. With one worker, or `parallel_strategy=None`, the (moved) model is returned as is.
    - Any other `parallel_strategy` raises `ValueError`, whatever the world size.
    The process group must already be initialised (minitrain workers do that before the train fn).
    """
    if parallel_strategy not in _PARALLEL_STRATEGIES:
        raise ValueError(
            f"prepare_model(parallel_strategy={parallel_strategy!r}) is not supported; valid choices are "
            f"'ddp', 'fsdp' or None (None moves the model without wrapping it)."
        )
    context = _context("prepare_model")
    kwargs = dict(parallel_strategy_kwargs or {})
    if isinstance(move_to_device, torch.device):
        device = move_to_device
    else:
        device = _devices_for(context)[0]
    on_cuda = device.type == "cuda" and torch.cuda.is_available()
    if on_cuda:
        torch.cuda.set_device(device)
    if move_to_device:
        log = logger.info if context.world_rank == 0 else logger.debug
        log("Moving model to device: %s", device)
        model = model.to(device)

    if not parallel_strategy or context.world_size <= 1:
        return model
    if parallel_strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        if on_cuda:
            kwargs = {"device_ids": [device], "output_device": device, **kwargs}
        log = logger.info if context.world_rank == 0 else logger.debug
        log("Wrapping provided model in DistributedDataParallel.")
        return DistributedDataParallel(model, **kwargs)
    from torch.distributed.fsdp import FullyShardedDataParallel

    if device.type == "cpu":
        # FSDP looks for an accelerator unless told the device; CPU sharding over gloo works when told.
        kwargs.setdefault("device_id", device)
    log = logger.info if context.world_rank == 0 else logger.debug
    log("Wrapping provided model in FullyShardedDataParallel.")
    return FullyShardedDataParallel(model, **kwargs)


def prepare_data_loader(
    data_loader: DataLoader,
    add_dist_sampler: bool = True,
    move_to_device: bool = True,
    auto_transfer: bool = True,
) -> DataLoader:
    """Shard `data_loader` across workers and move its batches to this worker's device.

    - With world size above 1, `add_dist_sampler`, a sampler that is not already a
      `DistributedSampler` and a map-style dataset, the loader is rebuilt with the same dataset,
      batch size, workers, collate_fn, pin_memory, drop_last, timeout, worker_init_fn and generator
      (plus persistent_workers, prefetch_factor and multiprocessing_context when it uses worker
      processes) and `sampler=DistributedSampler(dataset, num_replicas=world_size, rank=world_rank,
      shuffle=<the original sampler was not a SequentialSampler>)`. A custom sampler is replaced with a
      warning; a custom `batch_sampler` raises `ValueError` (pass `add_dist_sampler=False` and shard
      it yourself). Call `loader.sampler.set_epoch(epoch)` each epoch to reshuffle.
    - With `move_to_device` and a non-CPU device, the loader is wrapped so tensors inside each batch
      (nested dicts, tuples, lists) arrive on `get_device()`, copied with `non_blocking=True` on CUDA
      when `auto_transfer`. The wrapper is a `DataLoader` with the same `len()`, `.sampler`,
      `.dataset` and `.batch_size`. On CPU the loader is returned unwrapped.
    Raises `RuntimeError` outside a training function.
    """
    context = _context("prepare_data_loader")
    if (
        context.world_size > 1
        and add_dist_sampler
        and not isinstance(data_loader.sampler, DistributedSampler)
        and not isinstance(getattr(data_loader, "dataset", None), IterableDataset)
    ):
        data_loader = _with_distributed_sampler(data_loader, context)
    if move_to_device:
        device = _devices_for(context)[0]
        if device.type != "cpu":
            data_loader = _DeviceDataLoader(data_loader, device, auto_transfer)
    return _timed(data_loader)


_TIMED_CLASSES: dict[type, type] = {}


def _timed(loader: DataLoader) -> DataLoader:
    """`loader` itself, its class swapped for a subclass whose iterators count `next()` as data wait
    (so `prepare_data_loader(loader) is loader` still holds on CPU). Unchanged with telemetry off."""
    if not waits.ENABLED or getattr(type(loader), "_minitrain_timed", False):
        return loader
    base = type(loader)
    timed = _TIMED_CLASSES.get(base)
    if timed is None:
        def __iter__(self):
            return waits.timed_iterator(base.__iter__(self))

        timed = type(base.__name__, (base,), {"__iter__": __iter__, "_minitrain_timed": True,
                                               "__module__": base.__module__, "__qualname__": base.__qualname__})
        _TIMED_CLASSES[base] = timed
    try:
        loader.__class__ = timed
    except TypeError:  # a class whose layout forbids it: no data wait for this loader
        pass
    return loader


def _with_distributed_sampler(loader: DataLoader, context: TrainContext) -> DataLoader:
    if loader.batch_size is None and not isinstance(loader.batch_sampler, (BatchSampler, type(None))):
        raise ValueError(
            f"prepare_data_loader cannot shard a DataLoader built with a custom batch_sampler "
            f"({type(loader.batch_sampler).__name__}). Pass add_dist_sampler=False and make your batch "
            "sampler yield only this worker's share (minitrain.get_context().get_world_rank() and "
            "get_world_size() tell you which)."
        )
    if not isinstance(loader.sampler, (SequentialSampler, RandomSampler)) and context.world_rank == 0:
        logger.warning(
            "The %s of this DataLoader will be replaced with a DistributedSampler. Pass "
            "add_dist_sampler=False to prepare_data_loader to keep it (and shard the data yourself).",
            type(loader.sampler).__name__,
        )
    sampler = DistributedSampler(
        loader.dataset,
        num_replicas=context.world_size,
        rank=context.world_rank,
        shuffle=not isinstance(loader.sampler, SequentialSampler),
    )
    worker_init_fn, generator = loader.worker_init_fn, loader.generator
    if _reproducibility_seed is not None:
        worker_init_fn = _seeded_worker_init_fn(worker_init_fn)
        generator = torch.Generator()
        generator.manual_seed(_reproducibility_seed)
    kwargs: dict[str, Any] = dict(
        batch_size=loader.batch_size,
        shuffle=False,
        sampler=sampler,
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        drop_last=loader.drop_last,
        timeout=loader.timeout,
        worker_init_fn=worker_init_fn,
        generator=generator,
        pin_memory_device=getattr(loader, "pin_memory_device", ""),
        in_order=getattr(loader, "in_order", True),
    )
    if loader.num_workers > 0:
        # DataLoader rejects these with num_workers=0, so only carry them over when they matter.
        kwargs.update(
            persistent_workers=loader.persistent_workers,
            prefetch_factor=loader.prefetch_factor,
            multiprocessing_context=loader.multiprocessing_context,
        )
    return DataLoader(loader.dataset, **kwargs)


def _seeded_worker_init_fn(worker_init_fn):
    def seeded(worker_id: int) -> None:
        worker_seed = torch.initial_seed() % 2**32
        random.seed(worker_seed)
        try:
            import numpy as np
        except ImportError:
            pass
        else:
            np.random.seed(worker_seed)
        if worker_init_fn is not None:
            worker_init_fn(worker_id)

    return seeded


class _DeviceDataLoader(DataLoader):
    """A view of another DataLoader whose batches are moved to one device.

    It subclasses DataLoader (so `isinstance` checks in user code still pass) without running its
    constructor: it shares the wrapped loader's attributes, hence the very same `.sampler` object,
    and only overrides iteration and `len()`.
    """

    def __init__(self, base: DataLoader, device: torch.device, auto_transfer: bool) -> None:
        self.__dict__.update(getattr(base, "__dict__", {}))
        self._base_loader = base
        self._device = device
        self._non_blocking = bool(auto_transfer) and device.type == "cuda"

    def __len__(self) -> int:
        return len(self._base_loader)

    def __iter__(self):
        for batch in self._base_loader:
            yield self._move(batch)

    def _move(self, item: Any) -> Any:
        if isinstance(item, torch.Tensor):
            return item.to(self._device, non_blocking=self._non_blocking)
        if isinstance(item, collections.abc.Mapping):
            return {key: self._move(value) for key, value in item.items()}
        if isinstance(item, tuple) and hasattr(item, "_fields"):  # namedtuple: keep its type
            return type(item)(*(self._move(value) for value in item))
        if isinstance(item, tuple):
            return tuple(self._move(value) for value in item)
        if isinstance(item, list):
            return [self._move(value) for value in item]
        return item


def enable_reproducibility(seed: int = 0) -> None:
    """Make training as deterministic as torch allows; call it first in the training function.

    Seeds `torch`, `random` and (when installed) `numpy` with `seed`, turns on
    `torch.use_deterministic_algorithms(True)`, disables cudnn benchmarking and sets
    `CUBLAS_WORKSPACE_CONFIG=":4096:8"`. Later `prepare_data_loader` calls seed the loader's shuffling
    generator and worker processes from `seed`. Determinism can cost speed, and some ops then raise
    because they have no deterministic implementation.
    """
    global _reproducibility_seed
    _reproducibility_seed = seed
    torch.manual_seed(seed)
    random.seed(seed)
    try:
        import numpy as np
    except ImportError:
        pass
    else:
        np.random.seed(seed)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    # Needed for deterministic cuBLAS on CUDA >= 10.2.
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"


def accelerate(amp: bool = False) -> None:
    """Removed in Ray Train v2, which minitrain mirrors: always raises `DeprecationWarning`."""
    raise DeprecationWarning(
        "minitrain.torch.accelerate() was removed (as in Ray Train v2). For mixed precision, wrap the "
        "forward pass in `with torch.autocast(device_type=minitrain.torch.get_device().type):` and use "
        "torch.amp.GradScaler for float16."
    )


def backward(tensor: torch.Tensor) -> None:
    """Removed in Ray Train v2, which minitrain mirrors: always raises `DeprecationWarning`."""
    raise DeprecationWarning(
        "minitrain.torch.backward() was removed (as in Ray Train v2). Call `loss.backward()` directly "
        "(or `scaler.scale(loss).backward()` with torch.amp.GradScaler)."
    )


def prepare_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Removed in Ray Train v2, which minitrain mirrors: always raises `DeprecationWarning`."""
    raise DeprecationWarning(
        "minitrain.torch.prepare_optimizer() was removed (as in Ray Train v2). Use the optimizer "
        "directly; for mixed precision use torch.amp.GradScaler."
    )
