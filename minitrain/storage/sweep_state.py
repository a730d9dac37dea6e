"""A sweep's state on disk: trials as minitrain.tune keeps them, and the files that hold them (L1).

`<storage_path>/<name>/` holds one directory per trial (a TorchTrainer trial's is fit()'s run directory;
a function trial's holds the checkpoints it reported), `tuner_state.json` (this module: every trial's
id, name, config, status, failures, latest checkpoint and last result; replaced atomically after every
change), `.tune/sweep_spec.json` (the param space, TuneConfig and RunConfig, written once, for
`Tuner.restore`) and `.tune/<trial dirname>.jsonl` (every result of the trial, in order) and `.log` (the
trial process's output).

It sits below minitrain.tune and minitrain.dashboard because both read it: the tuner (its sweep loop
changes trials, `Tuner.restore` reads them back) and the dashboard (the sweep's page, live or from
storage), which must not import tune. The standard library and storage.retention only, so a trial process stays light.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from typing import Any, Optional

from minitrain.storage.retention import flatten_metrics

STATE_FILE = "tuner_state.json"
TUNE_DIR = ".tune"
STATE_VERSION = 1
SPEC_FILE = f"{TUNE_DIR}/sweep_spec.json"  # what Tuner.restore needs beyond the state file (minitrain.tune.restore_spec)



class TrialStatus(str, Enum):
    """Where a trial is, in Ray Tune's words. A `str`: `Trial.status` and `Result.status` compare
    equal to the plain strings Ray scripts use (`result.status == "TERMINATED"`), print as them, and
    are written as them to the state file and the dashboard's JSON. Ray's PAUSED is not among them:
    no minitrain scheduler pauses a trial."""

    PENDING = "PENDING"  # not started yet, or waiting to go on: retried after a failure, or stopped by Ctrl-C
    RUNNING = "RUNNING"  # its process runs
    TERMINATED = "TERMINATED"  # finished, or stopped early (then `Trial.stop_reason` says by whom and when)
    ERROR = "ERROR"  # failed more often than max_failures allows (`Trial.error` holds the last failure)

    # Printed and formatted as the bare word on every Python (3.12 would print "TrialStatus.PENDING").
    __str__ = str.__str__
    __format__ = str.__format__

    @property
    def finished(self) -> bool:
        """True for the statuses a trial never leaves (TERMINATED, ERROR)."""
        return self in (TrialStatus.TERMINATED, TrialStatus.ERROR)


@dataclass(frozen=True)
class TrialError:
    """Why a trial's run failed: the exception's qualified type name, its message and its traceback
    as text (the trial process reports them; minitrain never unpickles an exception from a trial)."""

    exc_type: str
    message: str
    traceback: str = ""

    @classmethod
    def from_record(cls, record: dict) -> "TrialError":
        """The error as the state file holds it (older files also hold a "type" key, ignored)."""
        return cls(str(record.get("exc_type", "Error")), str(record.get("message", "")),
                   str(record.get("traceback", "")))

    @property
    def summary(self) -> str:
        """`exc_type: first line of the message`, for one-line displays."""
        first = self.message.splitlines()[0] if self.message else ""
        return f"{self.exc_type}: {first}"


@dataclass
class Trial:
    """One trial, as the sweep loop changes it and the state file keeps it (see `TrialStatus`)."""

    trial_id: str
    name: str
    dirname: str
    config: Any
    index: int
    status: TrialStatus = TrialStatus.PENDING
    stop_reason: Optional[str] = None
    error: Optional[TrialError] = None  # the last failure (also kept while a retried trial is PENDING)
    num_failures: int = 0
    checkpoint: Optional[str] = None  # the latest reported checkpoint's path
    checkpoint_iteration: int = 0  # the training_iteration that reported it
    iteration: int = 0  # results so far
    last_result: Optional[dict] = None
    time_total_s: float = 0.0
    checkpoints: list = field(default_factory=list)  # [(path, metrics)] in report order
    config_is_json: bool = True
    # A config that is not JSON is kept as its repr in `config`, and here as a pickle sealed with the user's key
    # (minitrain.tune.restore_spec.seal_value), so that Tuner.restore can run the trial again with it.
    config_sealed: Optional[str] = None
    # Start-up: when the trial's latest process started (time.time(); set at each start) and how long
    # it took to its first result (None until then): "starting for 0:00:07", then the cost, in the tables.
    started_at: Optional[float] = None
    startup_s: Optional[float] = None
    startup_phase: str = ""  # what its fit() was doing when last heard, while starting ("" when not known)

    @property
    def finished(self) -> bool:
        """True once the trial ended for good (TERMINATED or ERROR)."""
        return TrialStatus(self.status).finished


def _is_json(value: Any) -> bool:
    try:
        return json.loads(json.dumps(value)) == value
    except (TypeError, ValueError):
        return False


def new_trial(trial_id: str, name: str, dirname: str, config: Any, index: int) -> Trial:
    """A PENDING trial of `config`, noting whether the config can be kept as JSON in the state file."""
    return Trial(trial_id=trial_id, name=name, dirname=dirname, config=config, index=index,
                 config_is_json=_is_json(config))


def write_state(experiment_path: str, header: dict, trials: list[Trial]) -> None:
    """Replace the state file atomically (a crash leaves the old one or the new one, never half)."""
    records = []
    for trial in trials:
        record = asdict(trial)
        if not trial.config_is_json:
            record["config"] = repr(trial.config)
        records.append(record)
    text = json.dumps({"version": STATE_VERSION, **header, "trials": records}, indent=1, default=repr)
    sweep_storage(experiment_path).write_text_atomic(STATE_FILE, text)


def sweep_storage(experiment_path: str) -> Any:
    """The sweep directory as a local `Storage`: every write into it follows no link and refuses another
    user's entries (a shared storage_path, see minitrain.storage.safe_files)."""
    # Imported here: a trial process reads this module and stays free of fsspec.
    from fsspec.implementations.local import LocalFileSystem

    from minitrain.storage.filesystem import Storage

    return Storage(LocalFileSystem(), experiment_path, guard_root=True)


# What a trial's directory name may be: one path component of the sweep directory (Tuner's namer makes
# such names); a state file that says otherwise would have the sweep write outside its directory.
_DIRNAME = re.compile(r"[A-Za-z0-9_,=+-][A-Za-z0-9_.,=+-]{0,127}")
_TRIAL_TYPES = {"trial_id": str, "name": str, "dirname": str, "index": int, "status": str,
                "stop_reason": (str, type(None)), "error": (dict, type(None)), "num_failures": int,
                "checkpoint": (str, type(None)), "checkpoint_iteration": int, "iteration": int,
                "last_result": (dict, type(None)), "time_total_s": (int, float), "checkpoints": list,
                "config_is_json": bool, "config_sealed": (str, type(None)), "started_at": (int, float, type(None)),
                "startup_s": (int, float, type(None)), "startup_phase": str}
# (the start-up fields are absent in files written before them)
_TRIAL_REQUIRED = ("trial_id", "name", "dirname", "config", "index")
HEADER_FIELDS = {"name": str, "trainable": str, "num_samples": int, "total_trials": int, "id_prefix": str,
                 "metric": (str, type(None)), "mode": (str, type(None))}


def _check_trial(record: Any, number: int, location: str) -> dict:
    """The trial record `number` of the state file, checked field by field; ValueError naming the field."""
    where = f"{location}: trials[{number}]"
    if not isinstance(record, dict):
        raise ValueError(f"{where} is not an object")
    known = {f.name for f in fields(Trial)}
    extra = sorted(set(record) - known)
    if extra:
        raise ValueError(f"{where} has unknown field(s) {extra}; it was not written by minitrain.tune")
    for key in _TRIAL_REQUIRED:
        if key not in record:
            raise ValueError(f"{where} has no {key!r}")
    for key, kind in _TRIAL_TYPES.items():
        if key in record and (not isinstance(record[key], kind) or isinstance(record[key], bool) and kind is int):
            raise ValueError(f"{where}.{key} is {record[key]!r}, not of the type minitrain.tune writes")
    if not _DIRNAME.fullmatch(record["dirname"]) or record["dirname"] in (".", ".."):
        raise ValueError(f"{where}.dirname is {record['dirname']!r}: a trial directory is one name inside the "
                         "sweep directory (letters, digits and _.,=+-, not starting with a dot)")
    if "status" in record and record["status"] not in {s.value for s in TrialStatus}:
        raise ValueError(f"{where}.status is {record['status']!r}, not one of {[s.value for s in TrialStatus]}")
    for key in ("started_at", "startup_s"):
        value = record.get(key)
        if value is not None and (isinstance(value, bool) or not 0 <= value < float("inf")):
            raise ValueError(f"{where}.{key} is {record[key]!r}, not a time minitrain.tune writes")
    if any(not isinstance(c, list) or len(c) != 2 for c in record.get("checkpoints", [])):
        raise ValueError(f"{where}.checkpoints holds an entry that is not a [path, metrics] pair")
    return record


def check_header(header: dict, location: str) -> None:
    """ValueError naming the first missing or mistyped field of a state file's header (what
    `Tuner.restore` needs to go on with the sweep)."""
    for key, kind in HEADER_FIELDS.items():
        if key not in header and kind != (str, type(None)):
            raise ValueError(f"{location} has no {key!r}; it was not written by minitrain.tune or is damaged")
        if not isinstance(header.get(key), kind) or isinstance(header.get(key), bool):
            raise ValueError(f"{location}: {key} is {header[key]!r}, not of the type minitrain.tune writes")


def read_state(experiment_path: str) -> tuple[dict, list[Trial]]:
    """The header and trials of a tuning run's state file; ValueError when it is unreadable."""
    location = os.path.join(experiment_path, STATE_FILE)
    try:
        with open(location) as f:
            data = json.load(f)
    except ValueError as exc:
        raise ValueError(f"{location} is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
        raise ValueError(f"{location}: not a minitrain.tune state file of version {STATE_VERSION}.")
    if not isinstance(data.get("trials"), list):
        raise ValueError(f"{location} has no \"trials\" list; it was not written by minitrain.tune or is damaged")
    trials = []
    for number, record in enumerate(data.pop("trials")):
        record = _check_trial(record, number, location)
        record["checkpoints"] = [tuple(c) for c in record.get("checkpoints", [])]
        record["status"] = TrialStatus(record.get("status", TrialStatus.PENDING))
        record["error"] = TrialError.from_record(record["error"]) if record.get("error") else None
        trials.append(Trial(**record))
    return data, trials


def write_spec(experiment_path: str, record: dict) -> None:
    """Write the sweep's spec file (`SPEC_FILE`, once at the sweep's start; no link followed)."""
    sweep_storage(experiment_path).write_text_atomic(SPEC_FILE, json.dumps(record, indent=1))


def read_spec(experiment_path: str) -> Optional[dict]:
    """The sweep's spec file as written, None when there is none (a sweep from before it existed);
    ValueError when it is not a JSON object."""
    location = os.path.join(experiment_path, SPEC_FILE)
    try:
        with open(location) as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    except ValueError as exc:
        raise ValueError(f"{location} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{location} is not a JSON object; it was not written by minitrain.tune or is damaged")
    return data


def history_path(experiment_path: str, trial: Trial) -> str:
    """Where every result of `trial` is kept, one JSON object a line."""
    return os.path.join(experiment_path, TUNE_DIR, trial.dirname + ".jsonl")


def log_path(experiment_path: str, trial: Trial) -> str:
    """The output (stdout and stderr) of `trial`'s process."""
    return os.path.join(experiment_path, TUNE_DIR, trial.dirname + ".log")


def read_history(experiment_path: str, trial: Trial) -> list[dict]:
    """Every result of the trial, in order; a torn last line (a crash mid-write) is ignored."""
    try:
        with open(history_path(experiment_path, trial)) as f:
            lines = f.read().split("\n")
    except FileNotFoundError:
        return []
    results = []
    for line in lines:
        if not line.strip():
            continue
        try:
            results.append(json.loads(line))
        except ValueError:
            break
    return results


def cut_history(experiment_path: str, trial: Trial, keep: int) -> None:
    """Keep only the first `keep` results (a resumed trial reports the ones after its checkpoint again)."""
    kept = read_history(experiment_path, trial)[:keep]
    sweep_storage(experiment_path).write_text_atomic(f"{TUNE_DIR}/{trial.dirname}.jsonl",
                                                     "".join(json.dumps(r) + "\n" for r in kept))


def append_history(experiment_path: str, trial: Trial, result: dict) -> None:
    """Append one result of `trial` to its history file."""
    sweep_storage(experiment_path).append_text(f"{TUNE_DIR}/{trial.dirname}.jsonl", json.dumps(result) + "\n")


def open_log(experiment_path: str, trial: Trial) -> int:
    """A descriptor of `trial`'s log file (`log_path`), opened to append, no link followed."""
    return sweep_storage(experiment_path).open_local(f"{TUNE_DIR}/{trial.dirname}.log",
                                                     os.O_WRONLY | os.O_APPEND | os.O_CREAT)


def make_tune_dir(experiment_path: str) -> None:
    """Create the sweep directory and its `.tune/` (no link followed)."""
    sweep_storage(experiment_path).makedirs(TUNE_DIR)


# ---------------------------------------------------------------- how the trial tables show a trial
# (the console's, minitrain.tune.progress, and the dashboard's, minitrain.dashboard.sweep)


def flat_config(config: Any) -> dict:
    """A trial's config with nested dicts as "a/b" keys; {} for a config that is not a dict."""
    return flatten_metrics(config) if isinstance(config, dict) else {}


def startup_cell(trial: Trial, now: float) -> str:
    """The trial's start-up as a table cell: "starting for 0:00:07: rendezvous (process-group init)"
    from its process's start until its first result (`now`: time.time(); the phase its fit() said last,
    when one did), then how long that took ("0:00:07"); "" before it ever started."""
    if trial.started_at is None:
        return ""
    if trial.startup_s is not None:
        return _span(trial.startup_s)
    if trial.status == TrialStatus.RUNNING:
        phase = f": {trial.startup_phase}" if trial.startup_phase else ""
        return f"starting for {_span(now - trial.started_at)}{phase}"
    return ""  # ended (or waiting to start again) before its first result


def _span(seconds: float) -> str:
    whole = int(max(seconds, 0.0))
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


def table_cell(value: Any) -> str:
    """`value` as a table cell: floats to 4 significant digits, long text cut to 24 characters."""
    if isinstance(value, float):
        return f"{value:.4g}"
    text = str(value)
    return text if len(text) <= 24 else text[:21] + "..."
