"""Trials as the tuner keeps them, and the tuning run's state file (L3).

`<storage_path>/<name>/` holds one directory per trial (a TorchTrainer trial's is fit()'s run directory;
a function trial's holds the checkpoints it reported), `tuner_state.json` (this module: every trial's
id, name, config, status, failures, latest checkpoint and last result; replaced atomically after every
change) and `.tune/<trial dirname>.jsonl` (every result of the trial, in order) and `.log` (the
trial process's output).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

STATE_FILE = "tuner_state.json"
TUNE_DIR = ".tune"
STATE_VERSION = 1

PENDING, RUNNING, TERMINATED, ERROR = "PENDING", "RUNNING", "TERMINATED", "ERROR"


@dataclass
class Trial:
    """One trial. `status` is PENDING, RUNNING, TERMINATED (finished, or stopped early: then
    `stop_reason` says by whom and when) or ERROR (`error` holds the failure)."""

    trial_id: str
    name: str
    dirname: str
    config: Any
    index: int
    status: str = PENDING
    stop_reason: Optional[str] = None
    error: Optional[dict] = None  # {"exc_type", "message", "traceback"}
    num_failures: int = 0
    checkpoint: Optional[str] = None  # the latest reported checkpoint's path
    checkpoint_iteration: int = 0  # the training_iteration that reported it
    iteration: int = 0  # results so far
    last_result: Optional[dict] = None
    time_total_s: float = 0.0
    checkpoints: list = field(default_factory=list)  # [(path, metrics)] in report order
    config_is_json: bool = True

    @property
    def finished(self) -> bool:
        """True once the trial ended for good (TERMINATED or ERROR)."""
        return self.status in (TERMINATED, ERROR)


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
    fd, tmp = tempfile.mkstemp(prefix=".tuner_state.", dir=experiment_path)
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(experiment_path, STATE_FILE))


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
    trials = []
    for record in data.pop("trials"):
        record["checkpoints"] = [tuple(c) for c in record.get("checkpoints", [])]
        trials.append(Trial(**record))
    return data, trials


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
    path = history_path(experiment_path, trial)
    with open(path + ".tmp", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in kept)
    os.replace(path + ".tmp", path)


def append_history(experiment_path: str, trial: Trial, result: dict) -> None:
    """Append one result of `trial` to its history file."""
    with open(history_path(experiment_path, trial), "a") as f:
        f.write(json.dumps(result) + "\n")
