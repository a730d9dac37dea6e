"""Committing checkpoints: the run's checkpoint index and top-K retention (L1: storage + retention).

The index `checkpoint_manager_snapshot.json` in the run directory is the only authority on which
checkpoints exist. Ranks upload into `.staging/attempt_<a>/rank_<r>/<dir>/` (see `minitrain.storage.layout`),
and a commit (`CheckpointManager.commit`):

1. records `<dir>` in the index as created by this run (an intent: replaced atomically),
2. moves the staged uploads into `<dir>/` (one rename locally when one rank uploaded),
3. replaces the index atomically with `<dir>` committed and the evicted checkpoints recorded as created
   but no longer committed,
4. deletes the evicted directories.

A crash at any point leaves either the old or the new index, every directory it names complete, and
at worst directories the index records as created but uncommitted: those, the staging area and
temporary files of interrupted atomic writes are garbage that `delete_garbage` removes. Nothing else
in the run directory is ever deleted: a directory minitrain did not create (the user's, or one written
with NO_UPLOAD and never committed) stays where it is.

The index never silently starts fresh: an unreadable or malformed index, or one naming a checkpoint
directory that does not exist, raises `CheckpointIndexError` saying how to proceed.

Index JSON (Ray's key names where Ray has one; unlike Ray, the version is recorded but not enforced):
    {"minitrain_version": "0.1.0", "format": 2,
     "checkpoint_config": {"num_to_keep": ..., "checkpoint_score_attribute": ..., "checkpoint_score_order": ...},
     "checkpoint_results": [{"checkpoint_dir_name", "metrics", "report_index", "attempt", "committed_at",
                             "durable_at"}, ...],
     "latest_checkpoint_result": {...} or null,
     "current_report_index": 7,
     "created_uncommitted": ["checkpoint_000004", ...],
     "preemptions": 1}
`checkpoint_results` are the kept checkpoints in manager order (worst first); each one's `committed_at`
is when it was committed (in memory, for one that went through the memory tier) and `durable_at` when
its files and this entry were on storage (absent in indexes written before the tier existed). Directory names are
relative to the run directory, so the run directory can be moved. Format 1 (no
`created_uncommitted`) is read as created nothing; an index without `preemptions` (the `fit()`s a
preemption ended, counted against `FailureConfig.max_preemption_failures`) as none.

A resumed run with a different `CheckpointConfig` re-applies retention with the new config at load
time, in memory only: the checkpoints it drops stay on disk, and stay named by the index on disk,
until the next write (`register` or `save`), which persists the new index and then deletes them.

A `CheckpointManager` is owned by one thread (the controller's); it is not thread-safe.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from typing import Any, Optional

import minitrain
from minitrain.config import CheckpointConfig
from minitrain.errors import MinitrainError
from minitrain.storage.filesystem import Storage, StorageError
from minitrain.storage.layout import INDEX_NAME, METRICS_NAME, RESERVED_NAMES, STAGING_DIR, is_own_name, is_temp_name
from minitrain.storage.retention import CheckpointRecord, Retention, best_checkpoints, retain

__all__ = ["CheckpointIndexError", "CheckpointManager", "INDEX_NAME", "METRICS_NAME", "RESERVED_NAMES",
           "check_dir_name", "config_dict"]

FORMAT = 2
READABLE_FORMATS = (1, 2)

logger = logging.getLogger("minitrain")


class CheckpointIndexError(MinitrainError):
    """The checkpoint index is unreadable or inconsistent; the message names it and how to proceed."""


def check_dir_name(dir_name: Any) -> str:
    """`dir_name` when it can name a checkpoint directory: one path component, not a reserved name."""
    if (not isinstance(dir_name, str) or not dir_name or "/" in dir_name or "\\" in dir_name
            or dir_name in (".", "..") or dir_name in RESERVED_NAMES or is_temp_name(dir_name)):
        raise ValueError(f"a checkpoint directory name must be one path component that is not one of "
                         f"minitrain's own names {sorted(RESERVED_NAMES)}, got {dir_name!r}")
    return dir_name


def config_dict(config: CheckpointConfig) -> dict[str, Any]:
    """The retention fields of `config`, as stored in the index."""
    return {"num_to_keep": config.num_to_keep,
            "checkpoint_score_attribute": config.checkpoint_score_attribute,
            "checkpoint_score_order": config.checkpoint_score_order}


def _record_json(record: CheckpointRecord) -> dict[str, Any]:
    return {"checkpoint_dir_name": record.dir_name, "metrics": record.metrics,
            "report_index": record.report_index, "attempt": record.attempt,
            "committed_at": record.committed_at, "durable_at": record.durable_at}


class _Shape(Exception):
    """The index parsed as JSON but is not what minitrain writes (internal; becomes CheckpointIndexError)."""


def _int_field(obj: dict, key: str, where: str) -> int:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _Shape(f"{where}[{key!r}] must be an int >= 0, got {value!r}")
    return value


def _parse_record(obj: Any, where: str) -> CheckpointRecord:
    if not isinstance(obj, dict):
        raise _Shape(f"{where} must be an object, got {obj!r}")
    try:
        dir_name = check_dir_name(obj.get("checkpoint_dir_name"))
    except ValueError as exc:
        raise _Shape(f"{where}['checkpoint_dir_name']: {exc}") from None
    metrics = obj.get("metrics")
    if not isinstance(metrics, dict):
        raise _Shape(f"{where}['metrics'] must be an object, got {metrics!r}")
    times = {}
    for key in ("committed_at", "durable_at"):
        value = obj.get(key, 0.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise _Shape(f"{where}[{key!r}] must be a number, got {value!r}")
        times[key] = float(value)
    return CheckpointRecord(dir_name=dir_name, metrics=metrics,
                            report_index=_int_field(obj, "report_index", where),
                            attempt=_int_field(obj, "attempt", where), **times)


def _parse_created(data: dict) -> frozenset[str]:
    created = data.get("created_uncommitted", [])
    if not isinstance(created, list):
        raise _Shape(f"'created_uncommitted' must be a list, got {created!r}")
    try:
        return frozenset(check_dir_name(name) for name in created)
    except ValueError as exc:
        raise _Shape(f"'created_uncommitted': {exc}") from None


def _parse_index(data: Any) -> tuple[dict, list[CheckpointRecord], Optional[CheckpointRecord], int]:
    """(stored checkpoint config, records, latest, current_report_index) of a parsed index."""
    if not isinstance(data, dict):
        raise _Shape(f"the top level must be an object, got {type(data).__name__}")
    if data.get("format") not in READABLE_FORMATS:
        raise _Shape(f"'format' is {data.get('format')!r}; this minitrain reads formats {READABLE_FORMATS} "
                     f"(written by minitrain {data.get('minitrain_version')!r})")
    stored_config = data.get("checkpoint_config")
    if not isinstance(stored_config, dict):
        raise _Shape(f"'checkpoint_config' must be an object, got {stored_config!r}")
    results = data.get("checkpoint_results")
    if not isinstance(results, list):
        raise _Shape(f"'checkpoint_results' must be a list, got {results!r}")
    records = [_parse_record(obj, f"checkpoint_results[{i}]") for i, obj in enumerate(results)]
    names = [record.dir_name for record in records]
    if len(set(names)) != len(names):
        raise _Shape(f"'checkpoint_results' names a directory twice: {names}")
    latest_obj = data.get("latest_checkpoint_result")
    latest = None if latest_obj is None else _parse_record(latest_obj, "latest_checkpoint_result")
    newest = max(records, key=lambda record: record.report_index, default=None)
    if (latest is None) != (newest is None) or (latest and latest.dir_name != newest.dir_name):
        raise _Shape(f"'latest_checkpoint_result' ({latest and latest.dir_name!r}) is not the most recent "
                     f"of 'checkpoint_results' ({newest and newest.dir_name!r})")
    current = _int_field(data, "current_report_index", "the index")
    if newest is not None and current < newest.report_index:
        raise _Shape(f"'current_report_index' {current} is below the report_index {newest.report_index} "
                     f"of checkpoint {newest.dir_name!r}")
    return stored_config, records, newest, current


class CheckpointManager:
    """The committed checkpoints of one run, their retention, and the run-wide report counter.

    `records` are the kept checkpoints in manager order (worst first); `latest` the most recently
    committed one (always kept); `report_index` the number of report rounds processed so far in the
    run, across attempts and resumes. Build one with `load`.
    """

    def __init__(self, storage: Storage, config: CheckpointConfig):
        self.storage = storage
        self.config = config
        self.resumed = False
        self._records: tuple[CheckpointRecord, ...] = ()
        self._latest: Optional[CheckpointRecord] = None
        self._report_index = 0
        self._preemptions = 0  # fit()s of this run that a preemption ended (FailureConfig.max_preemption_failures)
        self._persisted_names: frozenset[str] = frozenset()  # named by the index on disk
        self._pending_evictions: tuple[CheckpointRecord, ...] = ()  # dropped at load by a new config
        self._created: frozenset[str] = frozenset()  # made by this run, not committed: ours to delete
        self._warned_missing = False
        self._in_place: frozenset[str] = frozenset()  # written by NO_UPLOAD ranks, staged ranks merge in

    # ------------------------------------------------------------------------------ loading

    @classmethod
    def load(cls, storage: Storage, config: CheckpointConfig) -> "CheckpointManager":
        """The manager of the run in `storage`: resumed from its index when there is one (`resumed`
        is then True), else empty. Raises `CheckpointIndexError` for an unreadable or inconsistent
        index, `StorageError` when storage cannot be read, and `ValueError` when a kept checkpoint's
        score under a new `checkpoint_score_attribute` is not a number."""
        manager = cls(storage, config)
        if not storage.exists(INDEX_NAME):
            return manager
        url = storage.url(INDEX_NAME)
        try:
            data = json.loads(storage.read_text(INDEX_NAME))
            stored_config, records, latest, current = _parse_index(data)
            manager._created = _parse_created(data)
            preemptions = data.get("preemptions", 0)
            if isinstance(preemptions, bool) or not isinstance(preemptions, int) or preemptions < 0:
                raise _Shape(f"'preemptions' must be an int >= 0, got {preemptions!r}")
            manager._preemptions = preemptions
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CheckpointIndexError(_corrupt(url, f"it is not valid JSON: {exc}")) from exc
        except _Shape as exc:
            raise CheckpointIndexError(_corrupt(url, f"unexpected content: {exc}")) from None
        for record in records:
            if not storage.isdir(record.dir_name):
                raise CheckpointIndexError(
                    f"The checkpoint index {url} names the checkpoint directory {storage.url(record.dir_name)}, "
                    "which does not exist. minitrain does not resume from an index whose checkpoints are "
                    f"gone. Restore the directory, or move {url} away to start this run fresh.")
        manager.resumed = True
        manager._persisted_names = frozenset(record.dir_name for record in records)
        manager._latest = latest
        manager._report_index = current
        retention = manager._retain(records)
        manager._records = retention.kept
        manager._pending_evictions = retention.evicted
        if stored_config != config_dict(config):
            logger.info("The checkpoint config changed since %s was written (%s -> %s); retention is "
                        "re-applied, and %d checkpoint(s) it drops are deleted at the next commit.",
                        url, stored_config, config_dict(config), len(retention.evicted))
        manager._warn_missing(retention)
        return manager

    # ------------------------------------------------------------------------------ state

    @property
    def records(self) -> tuple[CheckpointRecord, ...]:
        """The kept checkpoints in manager order (worst first, best last)."""
        return self._records

    @property
    def latest(self) -> Optional[CheckpointRecord]:
        """The most recently committed checkpoint, or None."""
        return self._latest

    @property
    def report_index(self) -> int:
        """How many report rounds the run has processed (persisted with the index)."""
        return self._report_index

    @property
    def preemptions(self) -> int:
        """How many `fit()`s of this run a preemption ended (persisted with the index)."""
        return self._preemptions

    def note_preemption(self) -> None:
        """A preemption ends this `fit()`: count it; persisted by the next `save`/commit."""
        self._preemptions += 1

    @property
    def committed_dir_names(self) -> set[str]:
        """The directory names of the kept checkpoints."""
        return {record.dir_name for record in self._records}

    def best(self) -> list[CheckpointRecord]:
        """Ray's `best_checkpoints`: the best `num_to_keep` in manager order (may exclude `latest`)."""
        return best_checkpoints(self._records, self.config.num_to_keep,
                                self.config.checkpoint_score_attribute, self.config.checkpoint_score_order)

    def advance_report_index(self, n: int) -> None:
        """Raise the report counter to `n` (never lowers it); persisted by the next `register`/`save`."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"report index must be an int >= 0, got {n!r}")
        self._report_index = max(self._report_index, n)

    # ------------------------------------------------------------------------------ commits

    def expect_in_place(self, dir_name: str) -> None:
        """A round's NO_UPLOAD ranks wrote `dir_name` in the run directory themselves, and its other
        ranks' files are staged: `commit` merges those into it instead of refusing a directory this
        run did not create (and never deletes it first)."""
        self._in_place = self._in_place | {check_dir_name(dir_name)}

    def commit(self, record: CheckpointRecord, staged: tuple[str, ...] = ()) -> Retention:
        """Commit `record` as the latest checkpoint: move the staged uploads `staged` (directories
        relative to the run directory, in merge order) into `record.dir_name`, then `register` it.

        Before anything is moved, the index records the directory as created by this run, so a crash
        mid-move leaves garbage this run may delete, never a directory of unknown origin. Refuses
        (StorageError, nothing moved) to write into a committed checkpoint or into a directory this run
        did not create; with no `staged`, the directory must already hold the files (NO_UPLOAD).
        """
        check_dir_name(record.dir_name)
        self._check_order(record)
        if staged:
            target = record.dir_name
            url = self.storage.url(target)
            if target in self.committed_dir_names or target in self._persisted_names:
                raise StorageError(f"cannot commit {url}: a committed checkpoint of this name exists, and "
                                   "committed checkpoints are never written again")
            if target in self._in_place:  # the round's NO_UPLOAD ranks' files: merge the staged ones in
                self._in_place = self._in_place - {target}
            elif self.storage.exists(target):
                if target not in self._created:
                    raise StorageError(
                        f"cannot commit {url}: a directory of that name exists and minitrain did not create "
                        "it, so minitrain neither writes into nor deletes it. Move it away, or report with "
                        "another checkpoint_dir_name.")
                self.storage.remove_tree(target)  # an interrupted commit of this run left it
            self._created = self._created | {target}
            self._write(self._records, self._latest, self._report_index)
            self.storage.promote(list(staged), target)
        return self._register(record)

    def register(self, record: CheckpointRecord) -> Retention:
        """Commit `record`, whose directory must already hold its files, as the latest checkpoint.

        Applies retention, replaces the index atomically, then deletes the evicted directories (plus
        any dropped by a config change at load). A record reusing a kept directory name replaces
        that record (NO_UPLOAD wrote into it). The returned `Retention.evicted` lists every
        record whose directory was deleted. Raises ValueError for a bad directory name, a
        `report_index` not above the latest's, or a non-numeric score (nothing changes then),
        `StorageError` when the directory is missing or the index cannot be written.
        """
        check_dir_name(record.dir_name)
        self._check_order(record)
        return self._register(record)

    def _register(self, record: CheckpointRecord) -> Retention:
        if not self.storage.isdir(record.dir_name):
            raise StorageError(f"cannot commit checkpoint {self.storage.url(record.dir_name)}: the directory "
                               "does not exist (its upload did not happen or failed)")
        others = [kept for kept in self._records if kept.dir_name != record.dir_name]
        retention = self._retain(others + [record])
        evicted = self._pending_evictions + retention.evicted
        self._created = (self._created - {record.dir_name}) | {r.dir_name for r in evicted}
        self._write(retention.kept, record, max(self._report_index, record.report_index))
        self._warn_missing(retention)
        self._pending_evictions = ()
        self._delete(evicted)
        return dataclasses.replace(retention, evicted=evicted)

    def _check_order(self, record: CheckpointRecord) -> None:
        if self._latest is not None and record.report_index <= self._latest.report_index:
            raise ValueError(f"checkpoint {record.dir_name!r} has report_index {record.report_index}, but "
                             f"checkpoint {self._latest.dir_name!r} was committed with "
                             f"{self._latest.report_index}; rounds are committed in increasing order")

    def save(self) -> None:
        """Write the index now (e.g. after `advance_report_index`), then delete the checkpoints a
        config change at load dropped."""
        evicted, self._pending_evictions = self._pending_evictions, ()
        self._created = self._created | {r.dir_name for r in evicted}
        self._write(self._records, self._latest, self._report_index)
        self._delete(evicted)

    def _retain(self, records: list[CheckpointRecord] | tuple[CheckpointRecord, ...]) -> Retention:
        return retain(records, self.config.num_to_keep, self.config.checkpoint_score_attribute,
                      self.config.checkpoint_score_order)

    def _write(self, records: tuple[CheckpointRecord, ...], latest: Optional[CheckpointRecord],
               report_index: int) -> None:
        """Persist the index, and only then adopt the new state (a failed write changes nothing)."""
        snapshot = {
            "minitrain_version": minitrain.__version__,
            "format": FORMAT,
            "checkpoint_config": config_dict(self.config),
            "checkpoint_results": [_record_json(record) for record in records],
            "latest_checkpoint_result": None if latest is None else _record_json(latest),
            "current_report_index": report_index,
            "preemptions": self._preemptions,
            "created_uncommitted": sorted(self._created - {record.dir_name for record in records}),
        }
        self.storage.write_text_atomic(INDEX_NAME, json.dumps(snapshot, indent=2) + "\n")
        self._records, self._latest, self._report_index = tuple(records), latest, report_index
        self._persisted_names = frozenset(record.dir_name for record in records)

    def _delete(self, evicted: tuple[CheckpointRecord, ...]) -> None:
        # A directory the index on disk still names is never deleted (a reused name, say).
        for record in evicted:
            if record.dir_name in self._persisted_names:
                continue
            try:
                self.storage.remove_tree(record.dir_name)
            except StorageError as exc:  # committed already: the directory is now garbage, not an error
                logger.warning("Could not delete evicted checkpoint %s (%s); delete_garbage() removes it "
                               "later.", record.dir_name, exc)
                continue
            self._created = self._created - {record.dir_name}

    def _warn_missing(self, retention: Retention) -> None:
        if retention.missing_attribute and not self._warned_missing:
            self._warned_missing = True
            attribute = self.config.checkpoint_score_attribute
            logger.warning(
                "Checkpoint(s) %s have no metric %r (CheckpointConfig.checkpoint_score_attribute): they "
                "rank worst and are deleted first. Report %r with every checkpoint. (Logged once per run.)",
                ", ".join(retention.missing_attribute), attribute, attribute)

    # ------------------------------------------------------------------------------ garbage

    def garbage_dirs(self) -> list[str]:
        """What this run may delete in its run directory: directories it created that no index entry
        names (partial commits, evictions a crash interrupted), the staging area of uploads that were
        never committed, and temporary files of interrupted atomic writes. Never anything else."""
        protected = self.committed_dir_names | self._persisted_names
        entries = self.storage.list_entries()
        return sorted(name for name in entries
                      if name not in protected and (name in self._created or name == STAGING_DIR
                                                    or is_temp_name(name)))

    def unknown_entries(self) -> list[str]:
        """Entries of the run directory that are neither minitrain's nor checkpoints it created: left
        alone (a directory of the user's, a NO_UPLOAD directory that was never committed)."""
        known = self.committed_dir_names | self._persisted_names | self._created
        return sorted(name for name in self.storage.list_entries() if name not in known and not is_own_name(name))

    def delete_garbage(self) -> list[str]:
        """Delete `garbage_dirs()` and return the names of those that held something. The staging area
        every attempt leaves once its uploads were committed holds empty directories only: it is
        deleted without being named (naming it told every clean run it had removed leftovers). Only
        while no attempt is uploading."""
        garbage = self.garbage_dirs()
        held = [name for name in garbage if name != STAGING_DIR or self._holds_a_file(STAGING_DIR)]
        for name in garbage:
            self.storage.remove_tree(name)
        self._created = self._created - set(garbage)
        return held

    def _holds_a_file(self, rel: str) -> bool:
        entries, dirs = self.storage.list_entries(rel), set(self.storage.list_dirs(rel))
        return any(name not in dirs or self._holds_a_file(f"{rel}/{name}") for name in entries)


def _corrupt(url: str, detail: str) -> str:
    return (f"The checkpoint index {url} is corrupted: {detail}. minitrain never starts a run over a "
            f"damaged index. To start this run fresh, move the file away (e.g. rename it to "
            f"{url}.corrupt); to resume, restore it from a backup.")
