"""What `TorchTrainer.fit()` says about a run as a whole (L3): texts only, each self-sufficient: it names
the run, what happened and what to do next.

- `interrupted`: the line of a Ctrl-C, with the checkpoint the same command resumes from;
- `preemption_error`: the PreemptionError of a preempted run, resumable or not (the judgement is
  `Rules.allows_resume`'s, coordinator/policy/loop.py);
- `nothing_left_to_do`: a resumed run whose training function returned without a single report;
- `file_in_storage_path`: a ConfigError for a storage path that is (or passes through) a file.
"""

from __future__ import annotations

import os
from typing import Optional

from minitrain.errors import ConfigError, PreemptionError
from minitrain.records import RunOutcome
from minitrain.storage.checkpoint_manager import CheckpointManager
from minitrain.storage.filesystem import Storage


def interrupted(name: str, checkpoints: CheckpointManager) -> str:
    """The one line a Ctrl-C ends with (the workers are already stopped when it is shown)."""
    latest = checkpoints.latest
    if latest is None:
        return (f"interrupted: stopped every worker of run {name!r}; no checkpoint was committed, so the same "
                "command starts it again from the beginning")
    return (f"interrupted: stopped every worker of run {name!r}; run the same command again to resume from "
            f"{latest.dir_name}")


def nothing_left_to_do(name: str, storage: Storage, checkpoints: CheckpointManager) -> str:
    """The line of a resumed run whose training function returned on every rank without reporting:
    its loop had already reached its end (e.g. a finished run, resumed with the same epoch count)."""
    latest = checkpoints.latest
    where = f"from {latest.dir_name}" if latest is not None else "(it had no checkpoint)"
    return (f"resumed run {name!r} {where}, and the training function returned without reporting: it had "
            f"nothing left to do. To train further, raise its loop's bound (e.g. the number of epochs); to "
            f"start a new run, pass another RunConfig(name=...) or delete {storage.url()}")


def file_in_storage_path(storage_path: str) -> Optional[ConfigError]:
    """The error for a local `storage_path` that is a file, or lies under one; None when it is not."""
    if "://" in storage_path:
        return None
    path = os.path.abspath(os.path.expanduser(storage_path))
    while path and not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent
    if not os.path.isfile(path):
        return None
    return ConfigError(
        f"RunConfig.storage_path={storage_path!r} cannot be used: {path} is a file, and runs are kept in "
        f"directories (<storage_path>/<name>). Pass the directory that should hold your runs, e.g. "
        f"storage_path={os.path.dirname(path)!r}, or move the file away.")


def preemption_error(outcome: RunOutcome, checkpoints: CheckpointManager, preemptions: int, resumable: bool,
                     budget: int) -> PreemptionError:
    """The error of a preempted run whose `preemptions` (this one counted) left it `resumable` or not
    within `budget` (`FailureConfig.max_preemption_failures`, as `Rules.allows_resume` judged)."""
    latest = checkpoints.latest
    message = outcome.error_message
    if latest is not None:
        message += f" The latest committed checkpoint is {latest.dir_name}."
    if resumable:
        message += " Run the same fit() again (same RunConfig name and storage_path) to resume from it."
    else:
        message += (f" The run was preempted {preemptions} time(s), more than "
                    f"FailureConfig.max_preemption_failures={budget}: it is not to be resumed.")
    return PreemptionError(outcome.preemption, drain_timed_out=outcome.drain_timed_out, message=message,
                           resumable=resumable, checkpoint_dir=latest.dir_name if latest is not None else "")
