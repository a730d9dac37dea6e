"""One trial's process: `python -m minitrain.tune.trial_process <report fd>` (L3).

The tuner writes the trial's payload on stdin (an 8-byte length, then cloudpickle bytes: the
trainable, its config and the trial's facts), then one decision line ('continue' or 'stop') for each
result this process sends on the report pipe. The process ends with one last message: TrialFinished,
TrialFailed or TrialInterrupted (records and wire codec: minitrain.tune.messages). It gets SIGINT when the tuner dies, so a
`fit()` it runs stops its workers as on Ctrl-C, and it runs in its own session (the tuner forwards
Ctrl-C itself).

Why a process per trial and not a thread: a trial that runs `fit()` must be stoppable at any moment
(the scheduler's STOP, Ctrl-C, the tuner's death) with fit()'s own clean stop, which is Ctrl-C on the
main thread of the process that runs it; its output, its cwd, its imports and its crashes stay its
own. The cost is an interpreter start (about half a second) per trial.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import os
import signal
import struct
import sys
import traceback
from dataclasses import dataclass
from typing import Any, Optional

import cloudpickle

from minitrain import _session, knobs, procs
from minitrain.hosts.cluster import ClusterConfig, use_cluster
from minitrain.storage.sweep_state import TrialError
from minitrain.tune import session as tune_session
from minitrain.tune.messages import TrialFailed, TrialFinished, TrialInterrupted


@dataclass
class TrialPayload:
    """What a trial process is given: the trainable and the trial's facts."""

    trainable: Any
    config: dict
    context: tune_session.TuneContext
    checkpoint: Optional[str]  # the latest checkpoint to resume from
    iteration: int  # results reported before this run of the trial
    cluster: Optional[ClusterConfig] = None  # the hosts reserved for this trial: its fit()s use only them


def run_trainer(trainer: Any, config: dict, context: tune_session.TuneContext) -> Any:
    """A TorchTrainer as a trial: its train_loop_config updated with the sampled "train_loop_config",
    its run directory the trial directory (so a retried or restored trial resumes from its latest
    checkpoint)."""
    trainer = copy.copy(trainer)
    trainer.train_loop_config = {**(trainer.train_loop_config or {}), **config.get("train_loop_config", {})}
    parent, name = os.path.split(context.trial_dir.rstrip("/"))
    trainer.run_config = dataclasses.replace(trainer.run_config, name=name, storage_path=parent)
    return trainer.fit()


def _read_payload(stream: Any) -> TrialPayload:
    size = struct.unpack(">Q", stream.read(8))[0]
    return cloudpickle.loads(stream.read(size))  # from the tuner that started us, over our own stdin


MAX_PICKLED_ERROR = 1 << 20  # a larger exception reaches the tuner as text only


def _pickled(exc: BaseException) -> Optional[str]:
    """The exception as base64 cloudpickle bytes, so the tuner hands the caller the same type (None when
    it cannot be pickled or is too large)."""
    try:
        data = cloudpickle.dumps(exc)
    except Exception:  # noqa: BLE001 - an unpicklable exception still reaches the tuner as text
        return None
    return base64.b64encode(data).decode() if len(data) <= MAX_PICKLED_ERROR else None


def main(argv: list[str]) -> int:
    """Run one trial: read its payload on stdin, write results as JSON lines to fd argv[0], obey the
    tuner's continue/stop answers; dies by SIGINT with the tuner. Returns the exit code."""
    # This process's stops are SIGINT (the tuner's death, a scheduler's STOP reaching a fit() as Ctrl-C),
    # so it takes Python's own SIGINT handling whatever it inherited: a sweep started in the background
    # of a shell without job control (`nohup python sweep.py &`, a batch script) hands its children
    # SIGINT ignored, and then ASHA's stops did nothing (a stopped trial trained to the end) and a trial
    # outlived its tuner.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    procs.die_with_parent(signal.SIGINT, expected_parent=knobs.TUNE_PARENT.get())
    out = os.fdopen(int(argv[0]), "w", buffering=1)
    stdin = sys.stdin.buffer
    payload = _read_payload(stdin)
    if payload.cluster is not None:  # before any fit(): the trial's ranks go only where the tuner reserved
        use_cluster(payload.cluster)
    session = tune_session.TrialSession(payload.context, out, stdin, payload.checkpoint, payload.iteration)
    tune_session.set_session(session)
    _session.link_trial(session)  # every fit() the trainable runs forwards its rounds to the tuner
    os.makedirs(payload.context.trial_dir, exist_ok=True)
    trainer_module = sys.modules.get("minitrain.driver.trainer")  # loaded by the payload when it holds a trainer
    try:
        if trainer_module is not None and isinstance(payload.trainable, trainer_module.DataParallelTrainer):
            run_trainer(payload.trainable, payload.config, payload.context)
        else:
            payload.trainable(payload.config)
    except tune_session.TrialStopped:
        session.send(TrialFinished(stopped=True))
        return 0
    except KeyboardInterrupt:
        if session.stop_requested:  # our own STOP reached a fit() as Ctrl-C
            session.send(TrialFinished(stopped=True))
            return 0
        session.send(TrialInterrupted())
        return 130
    except BaseException as exc:  # noqa: BLE001 - every failure is reported to the tuner as a record
        session.send(TrialFailed(TrialError(f"{type(exc).__module__}.{type(exc).__qualname__}", str(exc)[:16384],
                                            traceback.format_exc()[-65536:]), _pickled(exc)))
        return 1
    session.send(TrialFinished(stopped=session.stop_requested))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
