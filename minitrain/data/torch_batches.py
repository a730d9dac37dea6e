"""Batches as torch tensors for `iter_torch_batches` (imports torch inside its functions only).

Used in the training function, never by the driver's own code paths, so `import minitrain.data` and
the trainer stay free of torch.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any, Optional

import numpy as np

from minitrain.context import TrainContext


def resolve_device(device: Any, context: Optional[TrainContext]) -> Any:
    """`device="auto"`: this worker's device (its first GPU, else cpu), as `minitrain.torch.get_device`;
    None: leave tensors where they are built (cpu); anything else: `torch.device(device)`."""
    import torch

    if device is None:
        return None
    if device != "auto":
        return torch.device(device)
    if context is not None and context.device_indices and torch.cuda.is_available():
        return torch.device(f"cuda:{context.device_indices[0]}")
    if context is not None and context.local_mode and torch.cuda.is_available():
        return torch.device(f"cuda:{torch.cuda.current_device()}")
    return torch.device("cpu")


def check_dtypes(dtypes: Any) -> None:
    """ValueError naming `dtypes` unless it is None, a torch.dtype or a dict of column -> torch.dtype."""
    import torch

    if dtypes is None or isinstance(dtypes, torch.dtype):
        return
    if isinstance(dtypes, Mapping):
        wrong = {key: value for key, value in dtypes.items() if not isinstance(value, torch.dtype)}
        if not wrong:
            return
        raise ValueError(f"dtypes={dtypes!r}: the values for {sorted(map(str, wrong))} are not torch dtypes; "
                         "give torch.dtype values such as torch.float32.")
    raise ValueError(f"dtypes={dtypes!r} must be a torch.dtype (e.g. torch.float32), a dict of column -> "
                     "torch.dtype, or None to keep each column's own type.")


def warn_if_pin_memory_unused(pin_memory: bool) -> None:
    """pin_memory=True on a machine without CUDA pins nothing (pinned memory only speeds up copies to a
    GPU): say so once per call, as torch's DataLoader does, instead of ignoring it silently."""
    import torch

    if pin_memory and not torch.cuda.is_available():
        warnings.warn("iter_torch_batches(pin_memory=True): no CUDA device is available, so tensors are not "
                      "pinned (pinned memory only speeds up host-to-GPU copies).", UserWarning, stacklevel=3)


def _check_dtype_keys(dtypes: Any, batch: Any) -> None:
    """A dict of dtypes must name columns (or top-level row keys) the batch has."""
    if not isinstance(dtypes, Mapping):
        return
    if not isinstance(batch, Mapping):
        raise ValueError(f"dtypes={dtypes!r} is a dict of column -> dtype, but the batches are not dicts "
                         f"(they are {type(batch).__name__}); pass one torch.dtype instead.")
    unknown = [key for key in dtypes if key not in batch]
    if unknown:
        raise ValueError(f"dtypes names {unknown}, which the batches do not have (their columns: "
                         f"{list(batch)}); fix the names or leave them out.")


def _dtype_for(dtypes: Any, key: Any) -> Any:
    if isinstance(dtypes, Mapping):
        return dtypes.get(key)
    return dtypes


def _unragged(value: np.ndarray) -> np.ndarray:
    """An object array whose cells are numeric arrays of one shape (a batch of a ragged column that
    happens to be even) stacked to `[B, ...]`, as Ray does; otherwise `value` unchanged."""
    cells = list(value)
    if cells and all(isinstance(c, np.ndarray) and c.dtype.kind in "biufc" for c in cells) and \
            len({c.shape for c in cells}) == 1:
        return np.stack(cells)
    return value


def _tensor(value: Any, dtype: Any, device: Any, pin_memory: bool, where: str) -> Any:
    import torch

    if isinstance(value, np.ndarray):
        if value.dtype == object and value.ndim == 1:
            value = _unragged(value)
        if value.dtype == object:
            raise RuntimeError(
                f"{where} holds cells of different shapes (a ragged list column), which one tensor cannot hold. "
                "Pad the values to one length when building the dataset, or pass collate_fn to build the batch "
                "yourself (for example torch.nn.utils.rnn.pad_sequence). Numpy array of object dtype cannot be "
                "converted to a Torch Tensor.")
        if value.dtype.kind in "US":
            raise TypeError(f"{where} holds {value.dtype} values, which a torch tensor cannot hold. Leave "
                            "the column out of the dataset, or pass collate_fn to build the batch yourself.")
        value = torch.from_numpy(np.ascontiguousarray(value))
    if not isinstance(value, torch.Tensor):
        return value
    if dtype is not None:
        value = value.to(dtype)
    if pin_memory and torch.cuda.is_available():
        value = value.pin_memory()
    if device is not None and value.device != device:
        value = value.to(device, non_blocking=pin_memory)
    return value


def columns_to_torch(batch: dict[str, np.ndarray], dtypes: Any, device: Any, pin_memory: bool) -> dict:
    """A dict of numpy columns as a dict of tensors on `device` (per-column `dtypes` when a dict)."""
    _check_dtype_keys(dtypes, batch)
    return {key: _tensor(value, _dtype_for(dtypes, key), device, pin_memory, f"column {key!r}")
            for key, value in batch.items()}


def rows_to_torch(rows: list, dtypes: Any, device: Any, pin_memory: bool) -> Any:
    """A list of rows collated as a torch DataLoader would (`default_collate`), then moved to `device`.

    With a dict of `dtypes`, top-level dict keys get their dtype; a single dtype applies to every tensor.
    """
    from torch.utils.data import default_collate

    batch = default_collate(rows)
    _check_dtype_keys(dtypes, batch)
    return _move(batch, dtypes, device, pin_memory, None)


def _move(value: Any, dtypes: Any, device: Any, pin_memory: bool, key: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _move(v, dtypes, device, pin_memory, k) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_move(v, dtypes, device, pin_memory, key) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_move(v, dtypes, device, pin_memory, key) for v in value)
    dtype = dtypes.get(key) if isinstance(dtypes, Mapping) else dtypes
    return _tensor(value, dtype, device, pin_memory, f"field {key!r}")
