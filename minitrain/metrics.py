"""Metrics must be JSON-safe: encoding and the error that names the offending key (L0)."""

from __future__ import annotations

import json
from typing import Any


def _numpy_scalar(value: Any) -> Any:
    # NumPy scalars are plain numbers in disguise; tensors and other objects are refused.
    if type(value).__module__ == "numpy" and getattr(value, "shape", None) == ():
        return value.item()
    raise TypeError(type(value).__name__)


_CIRCULAR = object()
# json.dumps(metrics, default=...) builds an encoder per call; report() is a hot path, so one is kept
# (stateless: safe from any thread). Same output as json.dumps with that default.
_ENCODER = json.JSONEncoder(default=_numpy_scalar)


def _find_unencodable(value: Any, path: str, seen: frozenset = frozenset()) -> tuple[str, Any] | None:
    if isinstance(value, (dict, list, tuple)):
        if id(value) in seen:
            return path, _CIRCULAR
        seen = seen | {id(value)}
        items = (value.items() if isinstance(value, dict) else
                 ((f"[{i}]", item) for i, item in enumerate(value)))
        for key, item in items:
            child = (f"{path}/{key}" if path else str(key)) if isinstance(value, dict) else f"{path}{key}"
            found = _find_unencodable(item, child, seen)
            if found:
                return found
        return None
    if value is None or isinstance(value, (str, int, float, bool)):
        return None
    try:
        plain = _numpy_scalar(value)
    except TypeError:
        return path, value
    return None if plain is None or isinstance(plain, (str, int, float, bool)) else (path, value)


def _refuse_lone_surrogates(value: Any, path: str) -> None:
    # A lone surrogate (from bytes decoded with errors="surrogateescape", or a bad slice) is valid in
    # a Python str and in escaped JSON but is no text: every UTF-8 writer (the dashboard's /metrics,
    # log files, trackers) fails on it later, far from the report that brought it.
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()
    for key, item in items:
        child = (f"{path}/{key}" if path else str(key)) if isinstance(value, dict) else f"{path}[{key}]"
        for text, what in ((key, "key"), (item, "value")):
            if isinstance(text, str):
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError:
                    raise ValueError(f"minitrain.report(metrics): the {what} of metrics[{child!r}] holds a lone "
                                     "surrogate, which is not text (decode bytes without errors='surrogateescape'"
                                     ", or report them as a hex string).") from None
        _refuse_lone_surrogates(item, child)


def encode_metrics(metrics: Any) -> str:
    """JSON text of `metrics`; ValueError naming the key of the first value that is not JSON-safe.

    Accepted values: str (text: a lone surrogate is refused), int, float (NaN and infinities included), bool, None, NumPy scalars, and
    lists/tuples/dicts of those. A torch tensor must be turned into a number with `.item()` first.
    """
    if not isinstance(metrics, dict):
        raise ValueError(f"minitrain.report(metrics) expects a dict of metrics, got "
                         f"{type(metrics).__name__}. Pass e.g. {{'loss': loss.item()}}.")
    try:
        text = _ENCODER.encode(metrics)
    except (TypeError, ValueError):
        pass
    else:
        if "\\ud" in text or "\\uD" in text:  # a surrogate escape: legal in pairs, refused alone
            _refuse_lone_surrogates(metrics, "")
        return text
    found = _find_unencodable(metrics, "")
    if found is None:
        raise ValueError("minitrain.report(metrics): the metrics cannot be encoded as JSON "
                         "(a key that is not a string, or a circular reference).")
    key, value = found
    if value is _CIRCULAR:
        raise ValueError(f"minitrain.report(metrics): metrics[{key!r}] refers back to itself (a circular "
                         "reference). Report plain values.")
    hint = " (a tensor: pass tensor.item() for a scalar, or tensor.tolist())" if hasattr(value, "tolist") else ""
    raise ValueError(f"minitrain.report(metrics): metrics[{key!r}] is a {type(value).__module__}."
                     f"{type(value).__name__}, which is not JSON-safe{hint}. Report numbers, strings, "
                     "booleans, None, or lists/dicts of them.")
