"""Which committed checkpoints to keep: the pure core of top-K retention (L0: stdlib only).

Everything here is a function over `CheckpointRecord`s: no I/O, no logging, no clock. What the caller
must act on (directories to delete, checkpoints that lack the score attribute) is returned as facts in a
`Retention`; `minitrain.storage.checkpoint_manager` persists the index and deletes directories.

The order is Ray Train's "manager order": worst first, best last.

- With a score attribute, ascending by score for "max" (descending for "min"); ties are broken by
  recency (the more recent report counts as better, so it comes later).
- A checkpoint whose metrics lack the attribute (or hold None), or hold NaN, ranks WORST in both
  orders. Deliberate difference from Ray, where a missing attribute becomes -inf before the order
  multiplier and so ranks BEST under "min" (quirk 2 of the API reference).
- Without an attribute, by report index, oldest first.

`retain` keeps the `num_to_keep` best plus, always, the latest checkpoint (highest report index), so
at most `num_to_keep + 1` are kept, as in Ray. `best_checkpoints` is Ray's `best_checkpoints`: the
last `num_to_keep` entries of manager order, which may exclude the latest.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Optional

ORDERS = ("max", "min")


@dataclass(frozen=True, slots=True)
class CheckpointRecord:
    """One committed checkpoint.

    `dir_name` is the checkpoint directory relative to the run directory; `metrics` are the rank-0
    metrics of the report that produced it; `report_index` is the run-wide number of that report round
    (it keeps counting across attempts and resumes; higher is more recent) and orders recency;
    `attempt` is the attempt that produced it; `committed_at` the wall-clock time of the commit (in
    memory, when its files went through the nodes' memory tiers); `durable_at` when it was on storage
    and in the index (0.0: not known, as in an index written before the memory tier existed).
    """

    dir_name: str
    metrics: dict
    report_index: int
    attempt: int = 0
    committed_at: float = 0.0
    durable_at: float = 0.0


@dataclass(frozen=True, slots=True)
class Retention:
    """The outcome of `retain`.

    `kept` in manager order (worst first); `evicted` (also in manager order) are the records whose
    directories may be deleted once an index without them is persisted; `missing_attribute` names the
    directories (in manager order) whose metrics lack the score attribute, so the caller can warn.
    """

    kept: tuple[CheckpointRecord, ...]
    evicted: tuple[CheckpointRecord, ...]
    missing_attribute: tuple[str, ...] = ()


def flatten_metrics(metrics: Mapping[str, Any], delimiter: str = "/") -> dict[str, Any]:
    """`metrics` with nested dicts flattened into "a/b" keys, like Ray's `flatten_dict`.

    Only dicts are flattened (lists stay values); keys are turned into strings; an empty nested dict
    contributes no key.
    """
    flat: dict[str, Any] = {}
    for key, value in metrics.items():
        if isinstance(value, Mapping):
            for sub_key, sub_value in flatten_metrics(value, delimiter).items():
                flat[f"{key}{delimiter}{sub_key}"] = sub_value
        else:
            flat[str(key)] = value
    return flat


def score_of(record: CheckpointRecord, attribute: str) -> Optional[float]:
    """The score of `record` under `attribute` (a flattened "a/b" key), or None when it is missing.

    A value of None counts as missing. NaN is returned as NaN. An int too large for a float becomes
    +-inf. A value that is not a real number (str, list, bool, ...) raises `ValueError` naming the
    attribute, the value and the checkpoint directory.
    """
    flat = flatten_metrics(record.metrics)
    if attribute not in flat or flat[attribute] is None:
        return None
    value = flat[attribute]
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"checkpoint_score_attribute {attribute!r} of checkpoint {record.dir_name!r} is "
                         f"{value!r}, not a number. Report a number under {attribute!r}, or choose "
                         "another CheckpointConfig.checkpoint_score_attribute.")
    try:
        return float(value)
    except OverflowError:  # a huge int: its sign is all the order needs
        return math.inf if value > 0 else -math.inf


def _check(num_to_keep: Optional[int], order: str) -> None:
    if order not in ORDERS:
        raise ValueError(f"checkpoint_score_order must be 'max' or 'min', got {order!r}")
    if num_to_keep is not None and (isinstance(num_to_keep, bool) or not isinstance(num_to_keep, int)
                                    or num_to_keep < 1):
        raise ValueError(f"num_to_keep must be None or an int >= 1, got {num_to_keep!r}")


def _sort_key(record: CheckpointRecord, attribute: Optional[str], order: str) -> tuple:
    if attribute is None:
        return (record.report_index,)
    score = score_of(record, attribute)
    if score is None or math.isnan(score):
        return (0, 0.0, record.report_index)  # missing / NaN: below every real score, oldest first
    return (1, score if order == "max" else -score, record.report_index)


def manager_order(records: Iterable[CheckpointRecord], attribute: Optional[str],
                  order: str = "max") -> list[CheckpointRecord]:
    """`records` worst first, best last (see the module docstring). Raises ValueError for a
    non-numeric score or an order other than "max"/"min"."""
    _check(None, order)
    return sorted(records, key=lambda record: _sort_key(record, attribute, order))


def retain(records: Iterable[CheckpointRecord], num_to_keep: Optional[int], attribute: Optional[str],
           order: str = "max") -> Retention:
    """Keep the `num_to_keep` best of `records` plus the latest (highest report index).

    `num_to_keep=None` keeps all. Everything not kept is evicted. Raises ValueError for a non-numeric
    score, an order other than "max"/"min", or a `num_to_keep` below 1.
    """
    _check(num_to_keep, order)
    ordered = manager_order(records, attribute, order)
    missing = () if attribute is None else tuple(
        record.dir_name for record in ordered if score_of(record, attribute) is None)
    if num_to_keep is None or len(ordered) <= num_to_keep:
        return Retention(kept=tuple(ordered), evicted=(), missing_attribute=missing)
    # Positions, not equality: records hold dicts, and two records may compare equal.
    latest = max(range(len(ordered)), key=lambda i: ordered[i].report_index)
    keep = set(range(len(ordered) - num_to_keep, len(ordered))) | {latest}
    kept = tuple(record for i, record in enumerate(ordered) if i in keep)
    evicted = tuple(record for i, record in enumerate(ordered) if i not in keep)
    return Retention(kept=kept, evicted=evicted, missing_attribute=missing)


def best_checkpoints(kept: Iterable[CheckpointRecord], num_to_keep: Optional[int],
                     attribute: Optional[str], order: str = "max") -> list[CheckpointRecord]:
    """Ray's `best_checkpoints`: the last `num_to_keep` entries of manager order (all when None).

    Unlike the kept set, this may exclude the latest checkpoint when it is not among the best.
    """
    _check(num_to_keep, order)
    ordered = manager_order(kept, attribute, order)
    return ordered if num_to_keep is None else ordered[-num_to_keep:]
