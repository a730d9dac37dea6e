"""Property-based fault injection: real 2-worker DDP runs under schedules of faults drawn by hypothesis.

Every example is a real `TorchTrainer.fit()` (coordinator, agent, 2 gloo workers) of a deterministic
DDP training function that checkpoints every k steps on rank 0 and resumes from `get_checkpoint()`.
A schedule of 0..3 faults (rank, step, kind) and a failure budget are drawn; the faults are fired from
inside the training function. Invariants checked on every example:

- `fit()` succeeds iff the number of faults that fired <= max_failures; otherwise the
  `WorkerGroupError` blames the last fault that fired (the one that spent the budget): its rank is
  among `worker_failures` with the right type (the injected exception, WorkerProcessError with the
  exit code or signal, WorkerHangError, NodeLostError), and the "Root cause" line names that rank and
  cause. For a killed agent either rank may be named (both lived on it); for a hang, the peer
  blocked in DDP's all-reduce is found hung too, and must be marked a consequence, not the cause.
- On success the final parameters are bit-identical to a fault-free run's, and the last attempt
  reported steps resume_step+1 .. N-1 exactly once each, in order.
- Committed checkpoints are never lost (each attempt resumes from a step >= the previous one's, and
  from at least the last checkpoint that both ranks had reported before the fault fired) or
  corrupt: every directory the index names exists, is complete, loads, and holds the step its metrics
  say; at most K+1 checkpoint directories exist; on success exactly the indexed ones remain.
- No process survives `fit()`: none of the pids the run noted, no minitrain agent/worker below the
  test process, and no process anywhere carrying this run's environment tag (orphans and fork servers too).

How faults fire. Fault i fires the first time its (rank, step) is reached after fault i-1 fired, in a
LATER attempt than fault i-1 (each attempt draws a token that rank 0 broadcasts; a marker file holding
the token is written right before a fault fires). Without "later attempt", a fault on rank 1 at the
step where rank 0 just failed could fire within the same doomed attempt, and two faults would cost one
failure. So every fired fault costs exactly one failure, and a fault whose step is never reached again
(the run resumed past it) never fires. Upload faults only exist on rank 0's checkpoint steps.

Tiers. The default run holds a smoke of three faults, one of each shape: a rank SIGKILLed mid-training and
restarted, a rank hung in an endless loop (found and named), a failed checkpoint upload (named with its
phase). The property and the rest of the regression matrix are the soak tier's (marked `soak`, run by
`bash scripts/test.sh --soak`).

Profiles (registered in tests/conftest.py): "faults-ci" by default (also under hypothesis's "default"
and "ci" profiles); `--hypothesis-profile=soak` or `MINITRAIN_FAULTS_PROFILE=soak` for hundreds of
examples. A failing example prints its
`@reproduce_failure` blob. Set MINITRAIN_FAULTS_KEEP=1 to keep each example's run directory, and
MINITRAIN_FAULTS_LOG=PATH to append one JSON line per example (verdict, faults fired, seconds).
"""

from __future__ import annotations

import _thread
import faulthandler
import json
import os
import shutil
import tempfile
import threading
import time
import uuid
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import psutil
import pytest
from hypothesis import event, given, note, settings
from hypothesis import strategies as st

import minitrain
from fault_training import (AFTER_REPORT_EXIT_CODE, AFTER_REPORT_KINDS, CHECKPOINT_FILES, CHECKPOINT_KINDS,
                            EVERY_RANK, HANG_KINDS, KILLED_DRIVER_OUT, KINDS, N_STEPS, PARTIAL_UPLOAD_EXIT_CODE,
                            RIVAL_DONE, RIVAL_REFUSED, RUN_NAME, USER_UPLOAD_MARKER, Fault, InjectedFault, InjectedUploadError,
                            Schedule, checkpoint_steps, make_trainer)
from minitrain.procs import wait_until_gone
from procs_support import living_descendants

pytestmark = pytest.mark.e2e

FIT_TIMEOUT_S = 240.0  # far above the slowest schedule (4 attempts, hangs included)
TAG_VAR = "MINITRAIN_FAULTS_TAG"
FAULTS_DIR = str(Path(__file__).resolve().parent)
EARLIER_DRIVER_CLEANUP_S = 30.0


# ---------------------------------------------------------------------------------- running one schedule


@dataclass
class Outcome:
    schedule: Schedule
    root: Path  # the example's temporary directory
    result: Optional[minitrain.Result]
    error: Optional[minitrain.WorkerGroupError]
    seconds: float
    descendants_after: list  # minitrain agents/workers below the test process right after fit()
    tag: str  # the value of TAG_VAR in the environment of the run's processes
    earlier_lines: int = 0  # intact metrics.jsonl lines an earlier (killed) driver of the run left
    user_files: dict = field(default_factory=dict)  # path -> digest of the user's files around the run
    rival: Optional[str] = None  # what the rival driver printed
    _fired: Optional[list] = None
    _attempts: Optional[list] = None

    @property
    def out(self) -> Path:
        return self.root / "out"

    @property
    def run_dir(self) -> Path:
        return self.root / "results" / RUN_NAME

    def fired(self) -> list[int]:
        """Indices of the faults that fired (read once, right after fit())."""
        if self._fired is None:
            self._fired = sorted(int(p.name.split("_")[1]) for p in (self.out / "markers").glob("fault_*")
                                 if not p.name.endswith(".tmp"))
        return self._fired

    def attempts(self) -> list[dict]:
        """What rank 0 saw at the start of each attempt, oldest first (read once, right after fit())."""
        if self._attempts is None:
            self._attempts = [json.loads(p.read_text()) for p in sorted((self.out / "attempts").iterdir())
                              if not p.name.endswith(".tmp")]
        return self._attempts

    def metrics_entries(self) -> list[dict]:
        """This fit()'s lines of metrics.jsonl (an earlier driver's lines left out); every line must parse."""
        path = self.run_dir / "metrics.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        return [json.loads(line) for line in lines[self.earlier_lines:]]

    def diagnostics(self) -> str:
        """The schedule, the error, metrics and the tail of every rank's log, for assertion messages."""
        parts = [f"schedule: {self.schedule}", f"fired: {self.fired()}", f"attempts: {self.attempts()}",
                 f"fit() took {self.seconds:.1f} s", f"error: {self.error}",
                 f"earlier driver's lines: {self.earlier_lines}", f"rival: {self.rival}"]
        metrics = self.run_dir / "metrics.jsonl"
        if metrics.exists():
            parts.append("metrics.jsonl:\n" + metrics.read_text()[-3000:])
        for log in sorted((self.run_dir / "logs").glob("attempt_*/rank_*.log")):
            parts.append(f"--- {log.relative_to(self.run_dir)}:\n" + log.read_text()[-1500:])
        return "\n".join(parts)


def _tagged_processes(tag: str) -> list[int]:
    """Pids of living processes anywhere whose environment carries this run's tag."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.pid != os.getpid() and process.environ().get(TAG_VAR) == tag \
                    and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process.pid)
        except (psutil.Error, OSError):
            continue
    return found


def _minitrain_descendants() -> list[str]:
    found = []
    for process in living_descendants(os.getpid()):
        try:
            command = " ".join(process.cmdline())
        except psutil.Error:
            continue
        if "minitrain.worker" in command or "minitrain.agent" in command:
            found.append(f"{process.pid}: {command}")
    return found


class _Watchdog:
    """Turns a fit() that never returns into a test failure: after `timeout_s` it prints every
    thread's stack and interrupts the main thread, so the controller stops the workers as on Ctrl-C."""

    def __init__(self, timeout_s: float):
        self.fired = False
        self._timer = threading.Timer(timeout_s, self._fire)
        self._timer.daemon = True

    def _fire(self) -> None:
        self.fired = True
        faulthandler.dump_traceback(all_threads=True)
        _thread.interrupt_main()

    def __enter__(self):
        self._timer.start()
        return self

    def __exit__(self, *exc_info):
        self._timer.cancel()


def _other_driver(argv: list, env: dict, timeout_s: float, nice: bool = False) -> subprocess.CompletedProcess:
    """Run fault_training.other_driver(argv) in a new Python process (see fault_training); `nice`: at
    the lowest priority (so its imports do not starve a run it races, whose hang timeout is 2 s)."""
    code = f"import sys; sys.path.insert(0, {FAULTS_DIR!r}); import fault_training; " \
           f"fault_training.other_driver({argv!r})"
    return subprocess.run([*(["nice", "-n", "19"] if nice else []), sys.executable, "-c", code], env=env,
                          capture_output=True, text=True, timeout=timeout_s)


def _run_killed_driver(schedule: Schedule, root: Path, env: dict) -> int:
    """An earlier driver of the run, SIGKILLed in its n-th metrics append. The intact lines it left."""
    done = _other_driver(["killed_driver", str(root), schedule.killed_driver],
                         {**env, "FAULTS_EVERY": str(schedule.every), "FAULTS_KEEP": json.dumps(schedule.num_to_keep)},
                         FIT_TIMEOUT_S)
    assert done.returncode == -signal.SIGKILL, \
        f"the earlier driver was not killed mid-append (rc {done.returncode}):\n{done.stdout}\n{done.stderr}"
    # Its agent and workers follow it (parent-death signal, then the agent stops its workers: bounded by
    # the lease, the stop grace, the kill wait and the output drain, about 15 s on a loaded machine).
    survivors = wait_until_gone(_tagged_processes(env[TAG_VAR]), timeout=EARLIER_DRIVER_CLEANUP_S)
    assert survivors == [], f"processes of the SIGKILLed driver survived it: {_describe(survivors)}"
    text = (root / "results" / RUN_NAME / "metrics.jsonl").read_text()
    assert not text.endswith("\n"), "the killed driver left no torn line"
    return text.count("\n")


def _plant_user_files(root: Path) -> dict:
    """The user's files beside the run and (when it exists) inside it. path -> content."""
    files = {root / "results" / "other_project" / "checkpoint_000000" / "model.pt": "another project's model",
             root / "results" / "notes.txt": "beside the run"}
    if (root / "results" / RUN_NAME).exists():
        files[root / "results" / RUN_NAME / "my_notes" / "todo.txt"] = "inside the run"
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return {str(path): text for path, text in files.items()}


class _Rival(threading.Thread):
    """A second driver that calls fit() on the same run while this process holds the run's lock.
    The run's workers wait for RIVAL_DONE before they train, so the race is always run."""

    def __init__(self, root: Path, env: dict):
        super().__init__(daemon=True)
        self.root, self.env, self.output = root, env, None
        self.stop = threading.Event()

    def _locked_by_this_process(self) -> bool:
        try:
            return json.loads((self.root / "results" / RUN_NAME / ".minitrain_lock").read_text())["pid"] == os.getpid()
        except (OSError, ValueError, KeyError):
            return False

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                if self._locked_by_this_process():
                    done = _other_driver(["rival", str(self.root)], self.env, 120, nice=True)
                    self.output = f"rc {done.returncode}: {done.stdout}{done.stderr}"
                    return
                self.stop.wait(0.02)
        finally:
            (self.root / "out" / RIVAL_DONE).write_text("done")


def run_schedule(schedule: Schedule, root: Path) -> Outcome:
    """Run fit() once under `schedule`, with everything under `root`."""
    trainer = make_trainer(schedule, str(root), str(root / "out"))
    tag = uuid.uuid4().hex
    env = {**os.environ, TAG_VAR: tag}
    earlier_lines = _run_killed_driver(schedule, root, env) if schedule.killed_driver else 0
    user_files = _plant_user_files(root)
    rival = _Rival(root, env) if schedule.rival else None
    previous = os.environ.get(TAG_VAR)
    os.environ[TAG_VAR] = tag  # agents, workers and fork servers inherit it: found even when orphaned
    result = error = None
    started = time.monotonic()
    watchdog = _Watchdog(FIT_TIMEOUT_S)
    try:
        try:
            with watchdog:
                if rival is not None:
                    rival.start()
                result = trainer.fit()
        except minitrain.WorkerGroupError as exc:
            error = exc
        except KeyboardInterrupt:
            if not watchdog.fired:
                raise
            raise AssertionError(f"fit() did not return within {FIT_TIMEOUT_S:g} s under {schedule} "
                                 f"(every thread's stack is on stderr); run directory: {root}") from None
        seconds = time.monotonic() - started
        descendants = _minitrain_descendants()
    finally:
        if previous is None:
            os.environ.pop(TAG_VAR, None)
        else:
            os.environ[TAG_VAR] = previous
        if rival is not None:
            rival.stop.set()
            rival.join(timeout=150)
    outcome = Outcome(schedule, root, result, error, seconds, descendants, tag, earlier_lines, user_files,
                      rival.output if rival is not None else None)
    outcome.fired(), outcome.attempts()
    return outcome


# ---------------------------------------------------------------------------------- invariants


def _expected_cause(fault: Fault) -> tuple[type, str]:
    """The exception type worker_failures[rank] must have, and a text the message must contain."""
    if fault.kind in ("exception", "after_report_exception"):
        return InjectedFault, "InjectedFault: injected on rank"
    if fault.kind == "after_report_exit":
        return SystemExit, f"SystemExit: {AFTER_REPORT_EXIT_CODE}"
    if fault.kind == "exit_code":
        return minitrain.WorkerProcessError, f"exited with code {fault.arg}"
    if fault.kind == "upload_partial_then_die":
        return minitrain.WorkerProcessError, f"exited with code {PARTIAL_UPLOAD_EXIT_CODE}"
    if fault.kind in ("sigkill", "kill_during_checkpoint_report"):
        return minitrain.WorkerProcessError, "killed by signal SIGKILL (9)"
    if fault.kind == "sigsegv":
        return minitrain.WorkerProcessError, "killed by signal SIGSEGV (11)"
    if fault.kind in ("hang_sigstop", "hang_loop"):
        return minitrain.WorkerHangError, "WorkerHangError: rank"
    if fault.kind == "agent_sigkill":
        return minitrain.NodeLostError, "NodeLostError: node"
    if fault.kind == "agent_sigstop_slow_upload":
        # rank 1 waits in DDP's all-reduce for the crawling rank 0: found hung (2 s) before the frozen
        # node is found lost, or lost first; either names the frozen node's failure.
        return (minitrain.NodeLostError, minitrain.WorkerHangError), "Error: "
    if fault.kind == "upload_fails":
        return InjectedUploadError, "InjectedUploadError: injected upload failure"
    raise AssertionError(fault.kind)


def check_processes(outcome: Outcome) -> None:
    assert outcome.descendants_after == [], f"minitrain processes outlived fit(): {outcome.descendants_after}"
    pids = sorted(int(p.name) for p in (outcome.out / "pids").iterdir() if not p.name.endswith(".tmp"))
    assert len(pids) >= 2, "the run noted no pids: the check would prove nothing"
    survivors = wait_until_gone(pids, timeout=10.0)
    assert survivors == [], f"processes of the run survived fit(): {_describe(survivors)}"
    survivors = wait_until_gone(_tagged_processes(outcome.tag), timeout=10.0)
    assert survivors == [], \
        f"processes with this run's environment (agents, workers, fork servers) survived fit(): {_describe(survivors)}"
    check_daemons(outcome)


def check_daemons(outcome: Outcome) -> None:
    """The setsid daemons the workers started (no run tag: found by their noted pids) died with their
    attempts. Except after a SIGKILLed agent: nothing is left on its node to end them (the agent's
    workers die with it by their parent-death signal, a daemon has none); they are killed here."""
    daemons = sorted(int(p.name) for p in (outcome.out / "daemons").iterdir() if not p.name.endswith(".tmp"))
    assert daemons, "no worker noted its daemon: the check would prove nothing"
    survivors = wait_until_gone(daemons, timeout=10.0)
    kinds = {outcome.schedule.faults[i].kind for i in outcome.fired()}
    if "agent_sigkill" in kinds:
        for pid in survivors:
            _kill_noted_daemon(pid)
        return
    for pid in survivors:
        _kill_noted_daemon(pid)  # leave nothing behind, then fail
    assert survivors == [], f"daemons started by workers survived fit(): {_describe(survivors)}"


def _kill_noted_daemon(pid: int) -> None:
    try:
        process = psutil.Process(pid)
        if "time.sleep(3600)" in " ".join(process.cmdline()):  # still the daemon, not a reused pid
            process.kill()
    except psutil.Error:
        pass


def _describe(pids: list) -> str:
    """pid, parent, state, age and command line of each living process (for an assertion message)."""
    lines = []
    for pid in pids:
        try:
            process = psutil.Process(pid)
            lines.append(f"\n  {pid} (parent {process.ppid()}, {process.status()}, "
                         f"{time.time() - process.create_time():.1f} s old): {' '.join(process.cmdline())[:200]}")
        except psutil.Error as exc:
            lines.append(f"\n  {pid}: {exc}")
    return "".join(lines)


def check_outcome(outcome: Outcome) -> None:
    schedule, fired = outcome.schedule, outcome.fired()
    budget = schedule.max_failures
    assert fired == list(range(len(fired))), "faults fired out of order"
    assert len(fired) <= budget + 1, "a fault fired after the failure budget was spent"
    succeeded = outcome.error is None
    assert succeeded == (len(fired) <= budget), \
        f"{len(fired)} fault(s) fired with max_failures={budget}, yet fit() " + \
        ("succeeded" if succeeded else f"failed:\n{outcome.error}")
    # Every fired fault cost one attempt, and nothing else did.
    assert len(outcome.attempts()) == len(fired) + (1 if succeeded else 0)
    if succeeded:
        return
    last = schedule.faults[fired[-1]]
    error, text = outcome.error, str(outcome.error)
    expected_type, expected_text = _expected_cause(last)
    if last.rank == EVERY_RANK:  # the first rank to fail is the cause; the other may be stopped first
        fired_on = [r for r in (0, 1) if (outcome.out / "markers" / f"returned_{fired[-1]}_rank_{r}").exists()]
        assert any(isinstance(error.worker_failures.get(r), expected_type) for r in fired_on), \
            f"none of ranks {fired_on} ({last.kind}) is among the failures as {expected_type}"
    else:
        assert last.rank in error.worker_failures, f"rank {last.rank} ({last.kind}) is not among the failures"
        assert isinstance(error.worker_failures[last.rank], expected_type), \
            f"worker_failures[{last.rank}] is {error.worker_failures[last.rank]!r}, expected {expected_type}"
    assert expected_text in text, f"{expected_text!r} is not in the error message"
    root_line = next(line for line in text.splitlines() if line.startswith("Root cause: "))
    if last.kind in ("agent_sigkill", "agent_sigstop_slow_upload"):
        # Both ranks lived on the lost agent: either may be named as the root cause.
        assert "NodeLostError" in root_line or "WorkerHangError" in root_line, root_line
    elif last.rank == EVERY_RANK:
        assert root_line.startswith(("Root cause: rank 0 ", "Root cause: rank 1 ")), root_line
        assert expected_text in root_line, root_line
    else:
        assert root_line.startswith(f"Root cause: rank {last.rank} "), root_line
        assert expected_text in root_line, root_line


def check_success(outcome: Outcome, reference_params: str) -> None:
    if outcome.error is not None:
        return
    final = (outcome.out / "final_params.hex").read_text()
    assert final == reference_params, "final parameters differ from the fault-free run's"
    assert outcome.result.metrics == {"step": N_STEPS - 1}
    resume = outcome.attempts()[-1]["resume_step"]
    last_attempt = len(outcome.fired())
    entries = outcome.metrics_entries()
    assert max((e["attempt"] for e in entries), default=0) <= last_attempt
    steps = [e["metrics"]["step"] for e in entries if e["attempt"] == last_attempt]
    assert steps == list(range(resume + 1, N_STEPS)), \
        f"the last attempt (resumed after step {resume}) reported steps {steps}"


def _load_checkpoint_dir(path: Path) -> int:
    """The step a complete checkpoint directory holds (every file loads and agrees)."""
    import torch

    assert sorted(os.listdir(path)) == sorted(CHECKPOINT_FILES), f"{path.name} holds {os.listdir(path)}"
    model = torch.load(path / "model.pt")
    optim = torch.load(path / "optim.pt")
    meta = json.loads((path / "meta.json").read_text())
    assert model["step"] == optim["step"] == meta["step"], f"{path.name}: steps disagree"
    assert set(model["model"]) == {"weight", "bias"} and optim["optimizer"]["state"]
    return meta["step"]


def check_checkpoints(outcome: Outcome) -> None:
    schedule, run_dir = outcome.schedule, outcome.run_dir
    index_path = run_dir / "checkpoint_manager_snapshot.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else {}
    records = list(index.get("checkpoint_results") or [])
    latest = index.get("latest_checkpoint_result")
    if latest is not None:
        assert latest["checkpoint_dir_name"] in {r["checkpoint_dir_name"] for r in records}
    named = {}
    for record in records:
        step = _load_checkpoint_dir(run_dir / record["checkpoint_dir_name"])
        assert step == record["metrics"]["step"], f"{record['checkpoint_dir_name']} holds step {step}"
        assert step in checkpoint_steps(schedule.every)
        named[record["checkpoint_dir_name"]] = step
    steps = sorted(named.values())
    assert len(steps) == len(set(steps)), f"a step was committed twice: {records}"
    on_disk = sorted(d.name for d in run_dir.iterdir() if d.is_dir() and d.name.startswith("checkpoint_")
                     and not (d / USER_UPLOAD_MARKER).exists())
    # The partial uploads of injected upload faults are the user's own files: never deleted.
    users = sorted(d.name for d in run_dir.iterdir() if (d / USER_UPLOAD_MARKER).exists())
    upload_faults = [i for i in outcome.fired() if schedule.faults[i].kind in ("upload_fails",
                                                                              "upload_partial_then_die")]
    assert bool(users) == bool(upload_faults), \
        f"a directory written by the user's upload function was deleted (or never written): {users}"
    if schedule.num_to_keep is not None:
        assert len(records) <= schedule.num_to_keep
        assert len(on_disk) <= schedule.num_to_keep + 1, f"too many checkpoint directories: {on_disk}"
    # Committed checkpoints are never lost: each attempt resumes from at least the previous one's step.
    resumes = [a["resume_step"] for a in outcome.attempts()]
    assert resumes == sorted(resumes), f"an attempt resumed from an older checkpoint: {resumes}"
    if latest is not None:
        assert named[latest["checkpoint_dir_name"]] >= resumes[-1]
    if outcome.error is None:
        assert on_disk == sorted(named), f"uncommitted directories remain: {on_disk} vs index {sorted(named)}"
        expected = checkpoint_steps(schedule.every)
        if schedule.num_to_keep is not None:
            expected = expected[-schedule.num_to_keep:]
        assert steps == expected, f"kept steps {steps}, expected the latest {expected}"


def check_acknowledged_checkpoints_survive(outcome: Outcome) -> None:
    """A checkpoint whose report returned on both ranks before a fault fired is never lost.

    Fault i fired in attempt i (check_outcome proved one attempt per fired fault). A fault at step t
    fires after step t's allreduce, which each rank entered only after its report of step t-1
    returned: so every checkpoint step c of that attempt with c <= t-1 was reported (and, on rank
    0, acknowledged) by both ranks, and the next attempt must resume from c or later.
    """
    attempts, committed = outcome.attempts(), _committed_steps(outcome)
    for i in outcome.fired():
        fault = outcome.schedule.faults[i]
        start = attempts[i]["resume_step"]
        acknowledged = [c for c in checkpoint_steps(outcome.schedule.every) if start < c <= fault.step - 1]
        if not acknowledged:
            continue
        resumed = attempts[i + 1]["resume_step"] if i + 1 < len(attempts) else max(committed, default=-1)
        assert resumed >= acknowledged[-1], (
            f"fault {i} ({fault}) fired after the checkpoint of step {acknowledged[-1]} was reported on both "
            f"ranks, yet the run then stood at step {resumed}")


# A rank that fails this way sends its queued reports before its failure (SIGKILL, os._exit and a
# frozen process cannot: docs/guarantees.md states that window).
FLUSHING_KINDS = ("exception", "upload_fails") + AFTER_REPORT_KINDS


def check_returned_reports_committed(outcome: Outcome) -> None:
    """Every round whose report() returned on both ranks before a flushing fault fired is committed:
    its metrics are in metrics.jsonl, in order, once.

    A fault at step t fires after step t's all-reduce, which each rank entered once its report of
    step t-1 had returned; an after-report fault notes on each rank that its report of step t
    returned (markers/returned_<i>_rank_<r>) right before it fires. When both ranks noted it, round
    t is covered too.
    """
    entries, attempts = outcome.metrics_entries(), outcome.attempts()
    for i in outcome.fired():
        fault = outcome.schedule.faults[i]
        steps = [e["metrics"]["step"] for e in entries if e["attempt"] == i]
        start = attempts[i]["resume_step"]
        assert steps == list(range(start + 1, start + 1 + len(steps))), \
            f"attempt {i} committed the steps {steps} (it resumed after step {start})"
        if fault.kind not in FLUSHING_KINDS:
            continue
        both = all((outcome.out / "markers" / f"returned_{i}_rank_{r}").exists() for r in (0, 1))
        returned = fault.step if both else fault.step - 1
        assert start + 1 + len(steps) > returned, (
            f"fault {i} ({fault}) fired once every rank's report of step {returned} had returned, yet attempt {i} "
            f"committed only {steps}")


def check_other_users(outcome: Outcome) -> None:
    """The user's files beside and inside the run are untouched; a rival driver was refused."""
    for path, text in outcome.user_files.items():
        assert os.path.exists(path) and Path(path).read_text() == text, f"the user's {path} was changed or deleted"
    if outcome.schedule.rival:
        assert outcome.rival is not None and outcome.rival.startswith("rc 0") and RIVAL_REFUSED in outcome.rival \
            and f"pid {os.getpid()}" in outcome.rival, f"the rival driver was not refused: {outcome.rival}"


def _committed_steps(outcome: Outcome) -> list[int]:
    index_path = outcome.run_dir / "checkpoint_manager_snapshot.json"
    if not index_path.exists():
        return []
    return [r["metrics"]["step"] for r in json.loads(index_path.read_text()).get("checkpoint_results") or []]


def _log_example(outcome: Outcome, verdict: str) -> None:
    """With MINITRAIN_FAULTS_LOG=PATH, one JSON line per example (a soak's progress and its mix)."""
    path = os.environ.get("MINITRAIN_FAULTS_LOG")
    if not path:
        return
    schedule = outcome.schedule
    line = {"verdict": verdict, "seconds": round(outcome.seconds, 1), "succeeded": outcome.error is None,
            "fired": [schedule.faults[i].kind + ("@every_rank" if schedule.faults[i].rank == EVERY_RANK else "")
                      for i in outcome.fired()],
            "drawn": len(schedule.faults), "max_failures": schedule.max_failures,
            "killed_driver": schedule.killed_driver, "rival": schedule.rival,
            "committed": len(_committed_steps(outcome))}
    with open(path, "a") as handle:
        handle.write(json.dumps(line) + "\n")


def run_and_check(schedule: Schedule, reference_params: str) -> Outcome:
    keep = os.environ.get("MINITRAIN_FAULTS_KEEP") == "1"
    root = Path(tempfile.mkdtemp(prefix="mt-faults-"))
    outcome = None
    try:
        outcome = run_schedule(schedule, root)
        try:
            check_processes(outcome)
            check_outcome(outcome)
            check_checkpoints(outcome)
            check_acknowledged_checkpoints_survive(outcome)
            check_returned_reports_committed(outcome)
            check_other_users(outcome)
            check_success(outcome, reference_params)
        except AssertionError as exc:
            _log_example(outcome, f"FAILED: {str(exc).splitlines()[0]}")
            raise AssertionError(f"{exc}\n\n{outcome.diagnostics()}") from exc
        _log_example(outcome, "ok")
        return outcome
    finally:
        if keep:
            print(f"kept the example's directory: {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


# ---------------------------------------------------------------------------------- the fault-free run


@pytest.fixture(scope="module")
def reference_params() -> str:
    """The final parameters (hex of their float bits) of a fault-free run, once per module."""
    root = Path(tempfile.mkdtemp(prefix="mt-faults-ref-"))
    try:
        outcome = run_schedule(Schedule(faults=(), max_failures=0, every=2, num_to_keep=None), root)
        assert outcome.error is None, str(outcome.error)
        check_processes(outcome)
        entries = [json.loads(line) for line in (outcome.run_dir / "metrics.jsonl").read_text().splitlines()]
        assert [e["metrics"]["step"] for e in entries] == list(range(N_STEPS))
        params = (outcome.out / "final_params.hex").read_text()
        # DDP kept the ranks in sync, and training moved the parameters away from their init.
        import torch
        torch.manual_seed(0)
        init = b"".join(p.detach().numpy().tobytes() for p in torch.nn.Linear(4, 1).parameters()).hex()
        assert params and params != init
        return params
    finally:
        shutil.rmtree(root, ignore_errors=True)


# ---------------------------------------------------------------------------------- the property


def _profile() -> settings:
    """MINITRAIN_FAULTS_PROFILE, else the profile `--hypothesis-profile` loaded, else "faults-ci".

    Hypothesis's own "default" and "ci" profiles (the latter loaded automatically when a CI
    environment variable is set) allow 100 examples: hours here, so they mean "faults-ci" too.
    """
    name = os.environ.get("MINITRAIN_FAULTS_PROFILE")
    if not name:
        current = settings.get_current_profile_name()
        name = "faults-ci" if current in ("default", "ci") else current
    return settings.get_profile(name)


@st.composite
def schedules(draw) -> Schedule:
    every = draw(st.sampled_from([2, 3]))
    faults = []
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(KINDS))
        if kind in CHECKPOINT_KINDS:
            rank, step = 0, draw(st.sampled_from(checkpoint_steps(every)))
        elif kind in AFTER_REPORT_KINDS:
            rank, step = draw(st.sampled_from([0, 1, EVERY_RANK])), draw(st.integers(0, N_STEPS - 1))
        else:
            rank, step = draw(st.integers(0, 1)), draw(st.integers(0, N_STEPS - 1))
        arg = 0
        if kind == "exit_code":
            arg = draw(st.sampled_from([1, 3, 42]))
        elif kind == "kill_during_checkpoint_report":
            arg = draw(st.integers(0, 30))
        faults.append(Fault(rank, step, kind, arg))
    return Schedule(faults=tuple(faults), max_failures=draw(st.sampled_from([0, 1, 2, 3])), every=every,
                    num_to_keep=draw(st.sampled_from([1, 2, None])),
                    killed_driver=draw(st.sampled_from([0, 0, 0, 1, 2, 3])),
                    rival=draw(st.sampled_from([False, False, False, True])))


def property_timeout_s() -> float:
    """pytest-timeout's limit for a property test: 60 s per example of the profile (a fit with its faults
    takes 5-25 s; each fit also has its own deadline, FIT_TIMEOUT_S), never below the suite's 600 s, so
    that the release soak's hundreds of examples are not cut off."""
    return max(600.0, 60.0 * _profile().max_examples)


@pytest.mark.soak
@pytest.mark.timeout(property_timeout_s())
@settings(_profile())
@given(schedule=schedules())
def test_any_fault_schedule_keeps_the_invariants(schedule, reference_params):
    note(f"schedule: {schedule}")
    outcome = run_and_check(schedule, reference_params)
    note(f"fired {outcome.fired()}, fit() took {outcome.seconds:.1f} s")
    event(f"faults fired: {len(outcome.fired())}, fit() {'failed' if outcome.error else 'succeeded'}")
    for i in outcome.fired():
        event(f"fired: {schedule.faults[i].kind}")


# ---------------------------------------------------------------------------------- every kind, every run

REGRESSIONS = [
    Fault(1, 2, "exception"),
    Fault(0, 4, "exit_code", 3),
    Fault(1, 5, "sigkill"),
    Fault(0, 2, "sigsegv"),
    Fault(1, 4, "hang_sigstop"),
    Fault(0, 5, "hang_loop"),
    Fault(1, 3, "agent_sigkill"),
    Fault(0, 3, "upload_fails"),
    Fault(0, 5, "upload_partial_then_die"),
    Fault(0, 3, "kill_during_checkpoint_report", 10),
    Fault(1, 4, "after_report_exception"),
    Fault(EVERY_RANK, 4, "after_report_exception"),
    Fault(EVERY_RANK, 3, "after_report_exit"),
    Fault(0, 3, "agent_sigstop_slow_upload"),
]
IDS = [f"{f.kind}-rank{'s' if f.rank == EVERY_RANK else f.rank}" for f in REGRESSIONS]
# The matrix's one entry in the default run: a rank killed mid-training, the group restarted, and the run
# ends bit-identical to a fault-free one. The other kinds are the soak tier's.
SURVIVED_IN_THE_DEFAULT_RUN = "sigkill-rank1"


@pytest.mark.parametrize("fault", [
    pytest.param(fault, id=name, marks=() if name == SURVIVED_IN_THE_DEFAULT_RUN else pytest.mark.soak)
    for fault, name in zip(REGRESSIONS, IDS)])
def test_each_fault_kind_is_survived_once(fault, reference_params):
    outcome = run_and_check(Schedule(faults=(fault,), max_failures=1, every=2, num_to_keep=1),
                            reference_params)
    assert outcome.fired() == [0] and outcome.error is None


@pytest.mark.soak
@pytest.mark.parametrize("fault", REGRESSIONS, ids=IDS)
def test_each_fault_kind_spends_a_zero_budget_and_is_named(fault, reference_params):
    outcome = run_and_check(Schedule(faults=(fault,), max_failures=0, every=2, num_to_keep=2),
                            reference_params)
    assert outcome.fired() == [0] and outcome.error is not None


# A frozen rank (SIGSTOP) is the soak tier's here; tests/e2e/test_fault_tolerance.py freezes one in the
# default run. The endless loop is the default run's: a rank that runs on but makes no progress.
@pytest.mark.parametrize("kind", [pytest.param(kind, marks=() if kind == "hang_loop" else pytest.mark.soak)
                                  for kind in HANG_KINDS])
def test_the_hung_rank_is_the_root_cause(kind, reference_params):
    outcome = run_and_check(Schedule(faults=(Fault(1, 3, kind),), max_failures=0, every=2, num_to_keep=2),
                            reference_params)
    assert outcome.fired() == [0] and outcome.error is not None
    assert isinstance(outcome.error.worker_failures[1], minitrain.WorkerHangError)
    root_line = next(line for line in str(outcome.error).splitlines() if line.startswith("Root cause: "))
    assert root_line.startswith("Root cause: rank 1 ") and "WorkerHangError: rank" in root_line, root_line


def test_a_failed_upload_is_reported_during_checkpoint_upload(reference_params):
    outcome = run_and_check(Schedule(faults=(Fault(0, 1, "upload_fails"),), max_failures=0, every=2,
                                     num_to_keep=2), reference_params)
    root_line = next(line for line in str(outcome.error).splitlines() if line.startswith("Root cause: "))
    assert "during checkpoint upload: InjectedUploadError" in root_line, root_line


@pytest.mark.soak
def test_a_driver_killed_mid_append_and_a_rival_driver_leave_the_run_whole(reference_params):
    # The run was SIGKILLed in its third metrics append (a torn line), the user keeps notes in it, a
    # second driver tries the same run while this one holds it, and rank 1 then fails once.
    outcome = run_and_check(Schedule(faults=(Fault(1, 5, "exception"),), max_failures=1, every=2, num_to_keep=2,
                                     killed_driver=3, rival=True), reference_params)
    assert outcome.earlier_lines >= 2
    assert outcome.fired() == [0] and outcome.error is None
