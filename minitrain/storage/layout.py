"""The run directory's layout: the one module that names the files minitrain keeps in it (L0, stdlib).

`<storage_path>/<name>/` holds, besides the committed checkpoint directories:

- `checkpoint_manager_snapshot.json` (INDEX_NAME): the index, replaced atomically; written when a run
  starts, so every run directory minitrain uses has one.
- `metrics.jsonl` (METRICS_NAME): every rank-0 report of the run, one JSON object a line.
- `telemetry.jsonl` (TELEMETRY_NAME) and `events.jsonl` (EVENTS_NAME): the run monitor's history
  (every rank's telemetry samples; run, attempt, checkpoint and straggler events), one JSON object a
  line, appended; see minitrain.monitoring.monitor.
- `logs/` (LOGS_DIR): `attempt_<n>/rank_<r>.log`.
- `.staging/` (STAGING_DIR): uploads not committed yet, at `attempt_<a>/rank_<r>/<checkpoint dir>/`.
  Only the coordinator's commit moves them into `<checkpoint dir>/`; nobody reads them in place.
- `.minitrain_lock` (LOCK_NAME): who runs this directory now (one `fit()` at a time).
- `.validate_storage_marker` (VALIDATE_MARKER): proves every host sees the same storage.
- `trackers/` (TRACKERS_DIR): what the driver-side tracker callbacks keep (`minitrain.callbacks`): the
  tracker run ids that make a restart or resume log into the same tracker run (`state.json`), and the
  default files of the TensorBoard, CSV and JSON loggers.

Temporary files of interrupted atomic writes are named `.<name>.<random>.minitrain-tmp`.
"""

from __future__ import annotations

import json
from typing import Any

INDEX_NAME = "checkpoint_manager_snapshot.json"
METRICS_NAME = "metrics.jsonl"
TELEMETRY_NAME = "telemetry.jsonl"
EVENTS_NAME = "events.jsonl"
LOGS_DIR = "logs"
STAGING_DIR = ".staging"
LOCK_NAME = ".minitrain_lock"
VALIDATE_MARKER = ".validate_storage_marker"
TEMP_SUFFIX = ".minitrain-tmp"
TRACKERS_DIR = "trackers"

# Names in the run directory that are minitrain's own, never checkpoints and never the user's.
# Beside the run directories, in `storage_path` itself: datasets staged for the workers, one folder per
# fit() (`<name>-<id>/`), deleted by the fit() that made it.
DATASETS_DIR = ".minitrain_datasets"
RESERVED_NAMES = frozenset({INDEX_NAME, METRICS_NAME, TELEMETRY_NAME, EVENTS_NAME, LOGS_DIR, STAGING_DIR,
                            LOCK_NAME, VALIDATE_MARKER, TRACKERS_DIR})


def is_temp_name(name: str) -> bool:
    """True for the name of a temporary file of an atomic write (left behind by a crash)."""
    return name.startswith(".") and name.endswith(TEMP_SUFFIX)


def is_own_name(name: str) -> bool:
    """True for a top-level entry of a run directory that minitrain itself names (not a checkpoint)."""
    return name in RESERVED_NAMES or is_temp_name(name)


def rank_log(attempt: int, rank: int) -> str:
    """The log file of rank `rank` in attempt `attempt`, relative to LOGS_DIR."""
    return f"attempt_{attempt}/rank_{rank}.log"


def shard_dir(attempt: int, rank: int, dir_name: str) -> str:
    """Rank `rank`'s files of checkpoint `dir_name` in attempt `attempt` (its shard), relative to where
    shards wait: the staging area of the run directory (`staged_dir`) or a node's memory tier
    (`minitrain.storage.memory_tier`)."""
    return f"attempt_{attempt}/rank_{rank}/{dir_name}"


def staged_dir(attempt: int, rank: int, dir_name: str) -> str:
    """Where rank `rank` of attempt `attempt` uploads checkpoint `dir_name`, relative to the run
    directory. Unique per (attempt, rank, checkpoint), so a write of a stale attempt never lands in a
    directory a later attempt commits."""
    return f"{STAGING_DIR}/{shard_dir(attempt, rank, dir_name)}"


def split_metrics_lines(text: str) -> tuple[list[dict], int]:
    """The entries of a `metrics.jsonl` text and the length of its intact prefix.

    A crash in the middle of an append leaves a last line without its newline; that torn line is
    ignored (it is the only place a crash can tear: lines are only ever appended). The intact prefix
    ends at the last newline. A bad line before the last one is a `ValueError` naming its number.
    """
    intact = text.rfind("\n") + 1
    entries: list[dict] = []
    for number, line in enumerate(text[:intact].splitlines(), start=1):
        if not line.strip():
            continue
        try:
            entry: Any = json.loads(line)
        except ValueError as exc:
            raise ValueError(f"{METRICS_NAME}:{number} is not valid JSON: {exc}") from None
        if not isinstance(entry, dict) or not isinstance(entry.get("metrics"), dict):
            raise ValueError(f"{METRICS_NAME}:{number} has no \"metrics\" object: {line[:200]}")
        entries.append(entry)
    return entries, intact
