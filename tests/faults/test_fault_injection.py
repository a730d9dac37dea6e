"""Property-based fault injection: real 2-worker DDP runs under schedules of faults drawn by hypothesis.

Every example is a real `TorchTrainer.fit()` (coordinator, agent, 2 gloo workers) of a deterministic
DDP training function that checkpoints every k steps on rank 0 and resumes from `get_checkpoint()`.
A schedule of 0..3 faults (rank, step, kind), a failure budget and the node's memory tier (the default
one, none, or one smaller than a checkpoint: fault_training.TIER_SETTINGS) are drawn; the faults are
fired from inside the training function (and, for the tier's storage faults, from inside the node
agent's writes to storage: fault_training.TierFaultFileSystem). Invariants checked on every example:

- `fit()` succeeds iff the number of fired faults that cost a failure <= max_failures (a storage outage
  shorter than the agents' retries costs none: FREE_KINDS); otherwise the `WorkerGroupError` blames the
  last of them (the one that spent the budget): its rank is among `worker_failures` with the right type
  (the injected exception, WorkerProcessError with the exit code or signal, WorkerHangError,
  NodeLostError), and the "Root cause" line names that rank and cause. For a killed agent either rank
  may be named (both lived on it), and with the tier the rank whose round the agent took with it fails
  with CheckpointNotDurable naming the round and the lost node; for a hang, the peer blocked in DDP's
  all-reduce is found hung too, and must be marked a consequence, not the cause.
- On success the final parameters are bit-identical to a fault-free run's, and the last attempt
  reported steps resume_step+1 .. N-1 exactly once each, in order.
- Committed checkpoints are never lost (each attempt resumes from a step >= the previous one's, and
  from at least the last checkpoint that both ranks had reported before the fault fired: with the tier,
  committed in memory, including the round of a rank SIGKILLed 0 ms after its report returned) or
  corrupt: every directory the index names exists, is complete, loads, and holds the step its metrics
  say; at most K+1 checkpoint directories exist; on success exactly the indexed ones remain. The one
  documented exception, on one host: a killed node agent takes the rounds it had not put on storage with
  it; then the next attempt resumes from at least what storage held right before the kill, the lost
  rounds are logged by name and never named by the index, and no round is lost in any other way.
- No process survives `fit()`: none of the pids the run noted, no minitrain agent/worker below the
  test process, and no process anywhere carrying this run's environment tag (orphans and fork servers too).
- No memory tier is left in the tier directory (MINITRAIN_MEMORY_TIER_DIR, the session's: tests/conftest.py)
  but the one of an agent SIGKILLed in the run's last attempt: a SIGKILLed agent's tier is removed only by
  the next agent on the host (check_tiers), and none comes after the last attempt.

How faults fire. Fault i fires the first time its (rank, step) is reached after fault i-1 fired, in a
LATER attempt than fault i-1 (each attempt draws a token that rank 0 broadcasts; a marker file holding
the token is written right before a fault fires). Without "later attempt", a fault on rank 1 at the
step where rank 0 just failed could fire within the same doomed attempt, and two faults would cost one
failure. So every fired fault costs exactly one failure, and a fault whose step is never reached again
(the run resumed past it) never fires. After a fault that costs no failure, the next one may fire at a
later step of the same attempt (Outcome.attempt_of reads a fault's attempt from its marker). Upload and
tier faults only exist on rank 0's checkpoint steps, and each only with a tier setting it can fire under
(fault_training.kinds_for): the frozen agent's slow upload only without the default tier (it needs the
worker's own upload), the tier's kinds only with it.

Tiers. The default run holds a smoke of four faults: a rank SIGKILLed mid-training and restarted, rank 0
SIGKILLed 0 ms after its SYNC checkpoint report returned (the restart reads that round back from the
memory tier), a rank hung in an endless loop (found and named), a failed checkpoint upload (named with its
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
import contextlib
import faulthandler
import json
import logging
import os
import re
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
from fault_training import (AFTER_REPORT_EXIT_CODE, AFTER_REPORT_KINDS, AGENT_KILLING_KINDS, CHECKPOINT_FILES,
                            CHECKPOINT_KINDS, EVERY_RANK, FREE_KINDS, HANG_KINDS, KILLED_DRIVER_OUT, N_STEPS, OUTAGE,
                            PARTIAL_UPLOAD_EXIT_CODE, PERSIST_RETRY_S, RIVAL_DONE, RIVAL_REFUSED, RUN_NAME,
                            TIER_FULL_BYTES, TIER_KINDS, TIER_SETTINGS, USER_UPLOAD_MARKER, Fault, InjectedFault,
                            InjectedUploadError, Schedule, checkpoint_steps, kinds_for, make_trainer)
from minitrain.procs import wait_until_gone
from minitrain.storage.memory_tier import DEFAULT_BASE, PREFIX as TIER_PREFIX
from procs_support import living_descendants

pytestmark = pytest.mark.e2e

FIT_TIMEOUT_S = 240.0  # far above the slowest schedule (4 attempts, hangs included)
TAG_VAR = "MINITRAIN_FAULTS_TAG"
TIER_DIR_VAR = "MINITRAIN_MEMORY_TIER_DIR"  # where the agents make their tiers (tests/conftest.py sets it)
TIER_FULL_WARNING = "CheckpointConfig.memory_tier_bytes sets its size"  # the worker's one warning of a full tier
# How the coordinator names a round committed in memory that never became durable (durability.py).
LOST_ROUND = re.compile(r"(checkpoint_\d+) \(round (\d+)\) (?:was not on storage yet|could not be written to storage)")
FAULTS_DIR = str(Path(__file__).resolve().parent)
EARLIER_DRIVER_CLEANUP_S = 30.0


# ---------------------------------------------------------------------------------- running one schedule


@dataclass
class Outcome:
    schedule: Schedule
    root: Path  # the example's temporary directory
    result: Optional[minitrain.Result]
    error: Optional[minitrain.TrainingFailedError]
    seconds: float
    descendants_after: list  # minitrain agents/workers below the test process right after fit()
    tag: str  # the value of TAG_VAR in the environment of the run's processes
    earlier_lines: int = 0  # intact metrics.jsonl lines an earlier (killed) driver of the run left
    user_files: dict = field(default_factory=dict)  # path -> digest of the user's files around the run
    rival: Optional[str] = None  # what the rival driver printed
    errors_logged: list = field(default_factory=list)  # the driver's "minitrain" ERROR records during fit()
    tiers_before: frozenset = frozenset()  # the memory tiers in the tier directory before the run
    tiers_after: frozenset = frozenset()  # ... and once the run's processes are gone (check_tiers)
    log_offsets: dict = field(default_factory=dict)  # rank log -> its size before this fit() (an earlier driver's)
    _fired: Optional[list] = None
    _attempts: Optional[list] = None
    _tokens: Optional[list] = None

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
            notes = [p for p in sorted((self.out / "attempts").iterdir()) if not p.name.endswith(".tmp")]
            self._attempts = [json.loads(p.read_text()) for p in notes]
            self._tokens = [p.name.split("_", 1)[1] for p in notes]
        return self._attempts

    def token(self, attempt: int) -> str:
        """The token of `attempt` (rank 0 draws one per attempt; fault markers hold it)."""
        self.attempts()
        return self._tokens[attempt]

    def attempt_of(self, i: int) -> int:
        """The attempt fault i fired in (its marker holds that attempt's token). A fault that costs a
        failure ends its attempt; one of FREE_KINDS does not, so faults and attempts are not one to one."""
        self.attempts()
        return self._tokens.index((self.out / "markers" / f"fault_{i}").read_text())

    def charged(self) -> list[int]:
        """The fired faults that cost a failure (all but FREE_KINDS), in order."""
        return [i for i in self.fired() if self.schedule.faults[i].kind not in FREE_KINDS]

    def agent_killed_in(self, attempt: int) -> Optional[int]:
        """The step the run's storage held, by the index, right before a fault killed the node agent
        in `attempt` (None when none did): what that kill must not lose."""
        for i in self.fired():
            note = self.out / "markers" / f"durable_{i}"
            if self.attempt_of(i) == attempt and note.exists():
                return int(note.read_text())
        return None

    def tier_on(self) -> bool:
        """Whether checkpoints went through the memory tier (the default tier; a full one takes none)."""
        return self.schedule.memory_tier_bytes is None

    def lost_rounds(self) -> dict[str, int]:
        """dir name -> round of each round the coordinator logged as lost (committed in memory, never
        durable)."""
        return {m.group(1): int(m.group(2)) for line in self.errors_logged for m in LOST_ROUND.finditer(line)}

    def rank_log(self, attempt: int, rank: int) -> str:
        """What this fit() wrote to rank `rank`'s log of `attempt` (an earlier driver's part left out)."""
        path = self.run_dir / "logs" / f"attempt_{attempt}" / f"rank_{rank}.log"
        if not path.exists():
            return ""
        with open(path, "rb") as handle:
            handle.seek(self.log_offsets.get(str(path), 0))
            return handle.read().decode(errors="replace")

    def metrics_entries(self) -> list[dict]:
        """This fit()'s lines of metrics.jsonl (an earlier driver's lines left out); every line must parse."""
        path = self.run_dir / "metrics.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        return [json.loads(line) for line in lines[self.earlier_lines:]]

    def diagnostics(self) -> str:
        """The schedule, the error, metrics and the tail of every rank's log, for assertion messages."""
        parts = [f"schedule: {self.schedule}", f"fired: {self.fired()}", f"attempts: {self.attempts()}",
                 f"fit() took {self.seconds:.1f} s", f"error: {self.error}",
                 f"earlier driver's lines: {self.earlier_lines}", f"rival: {self.rival}",
                 f"errors logged: {self.errors_logged}",
                 f"tiers before: {sorted(self.tiers_before)}, after: {sorted(self.tiers_after)}"]
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
                         {**env, "FAULTS_EVERY": str(schedule.every), "FAULTS_KEEP": json.dumps(schedule.num_to_keep),
                          "FAULTS_TIER": json.dumps(schedule.memory_tier_bytes)},
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


def tier_parent() -> str:
    """Where the run's agents make their memory tiers (they inherit this process's environment)."""
    return os.environ.get(TIER_DIR_VAR) or DEFAULT_BASE


def _tiers() -> frozenset:
    """The memory tiers (`minitrain-tier-*`) in the tier directory now."""
    try:
        return frozenset(name for name in os.listdir(tier_parent()) if name.startswith(TIER_PREFIX))
    except FileNotFoundError:
        return frozenset()


class _ErrorRecords(logging.Handler):
    """Keeps the text of every ERROR record of the "minitrain" loggers in the driver (the coordinator
    logs there each round committed in memory that never became durable, by name)."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextlib.contextmanager
def _environment(**values: str):
    """Set environment variables for the run's processes (agents inherit the driver's environment), then
    put back what was there."""
    previous = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def run_schedule(schedule: Schedule, root: Path) -> Outcome:
    """Run fit() once under `schedule`, with everything under `root`."""
    trainer = make_trainer(schedule, str(root), str(root / "out"))
    tag = uuid.uuid4().hex
    tiers_before = _tiers()
    # The agents retry failed writes to storage for PERSIST_RETRY_S (read from the environment they inherit).
    run_env = {TAG_VAR: tag, "MINITRAIN_PERSIST_RETRY_S": str(PERSIST_RETRY_S)}
    env = {**os.environ, **run_env}
    earlier_lines = _run_killed_driver(schedule, root, env) if schedule.killed_driver else 0
    logs = root / "results" / RUN_NAME / "logs"
    log_offsets = {str(p): p.stat().st_size for p in logs.glob("attempt_*/rank_*.log")}
    user_files = _plant_user_files(root)
    rival = _Rival(root, env) if schedule.rival else None
    errors = _ErrorRecords()
    minitrain_logger = logging.getLogger("minitrain")
    result = error = None
    started = time.monotonic()
    watchdog = _Watchdog(FIT_TIMEOUT_S)
    # agents, workers and fork servers inherit the tag: found even when orphaned
    with _environment(**run_env):
        minitrain_logger.addHandler(errors)
        try:
            try:
                with watchdog:
                    if rival is not None:
                        rival.start()
                    result = trainer.fit()
            except minitrain.TrainingFailedError as exc:  # check_outcome says whether it is the right one
                error = exc
            except KeyboardInterrupt:
                if not watchdog.fired:
                    raise
                raise AssertionError(f"fit() did not return within {FIT_TIMEOUT_S:g} s under {schedule} "
                                     f"(every thread's stack is on stderr); run directory: {root}") from None
            seconds = time.monotonic() - started
            descendants = _minitrain_descendants()
        finally:
            minitrain_logger.removeHandler(errors)
            if rival is not None:
                rival.stop.set()
                rival.join(timeout=150)
    outcome = Outcome(schedule, root, result, error, seconds, descendants, tag, earlier_lines, user_files,
                      rival.output if rival is not None else None, errors_logged=errors.lines,
                      tiers_before=tiers_before, log_offsets=log_offsets)
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
    if fault.kind in ("sigkill", "kill_during_checkpoint_report", "kill_after_tier_report"):
        return minitrain.WorkerProcessError, "killed by signal SIGKILL (9)"
    if fault.kind == "sigsegv":
        return minitrain.WorkerProcessError, "killed by signal SIGSEGV (11)"
    if fault.kind in ("hang_sigstop", "hang_loop"):
        return minitrain.WorkerHangError, "WorkerHangError: rank"
    if fault.kind == "agent_sigkill":
        return minitrain.NodeLostError, "NodeLostError: node"
    if fault.kind in ("agent_sigstop_slow_upload", "agent_sigkill_during_persist"):
        # rank 1 waits in DDP's all-reduce for rank 0, which crawls (a slow upload) or waits for its agent
        # to be held in its write to storage before it kills it: found hung (2 s) before the node is found
        # lost, or lost first; either names the node's failure (check_outcome).
        return (minitrain.NodeLostError, minitrain.WorkerHangError), "Error: "
    if fault.kind == "upload_fails":
        return InjectedUploadError, "InjectedUploadError: injected upload failure"
    raise AssertionError(fault.kind)


def _not_durable(failure: BaseException) -> bool:
    """Whether a rank's failure is the coordinator's CheckpointNotDurable (a round committed in memory
    that its node took with it)."""
    return isinstance(failure, minitrain.RemoteWorkerError) and failure.exc_type == "CheckpointNotDurable"


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
    if kinds & set(AGENT_KILLING_KINDS):
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
    schedule, fired, charged = outcome.schedule, outcome.fired(), outcome.charged()
    budget = schedule.max_failures
    assert fired == list(range(len(fired))), "faults fired out of order"
    assert len(charged) <= budget + 1, "a fault fired after the failure budget was spent"
    succeeded = outcome.error is None
    assert succeeded == (len(charged) <= budget), \
        f"{len(charged)} fault(s) that cost a failure fired with max_failures={budget}, yet fit() " + \
        ("succeeded" if succeeded else f"failed:\n{outcome.error}")
    # Every fired fault that costs a failure cost one attempt, and nothing else did.
    assert len(outcome.attempts()) == len(charged) + (1 if succeeded else 0)
    assert [outcome.attempt_of(i) for i in charged] == list(range(len(charged))), \
        f"faults that cost a failure fired in attempts {[outcome.attempt_of(i) for i in charged]}"
    if succeeded:
        return
    last = schedule.faults[charged[-1]]
    error, text = outcome.error, str(outcome.error)
    assert isinstance(error, minitrain.WorkerGroupError), f"fit() failed, but not for its workers: {error!r}"
    expected_type, expected_text = _expected_cause(last)
    node_lost = last.kind in AGENT_KILLING_KINDS + ("agent_sigstop_slow_upload",)

    def is_cause(failure) -> bool:
        # With the memory tier, a round the killed agent had not put on storage is lost with it, and the
        # rank that held it fails with CheckpointNotDurable naming the round and the lost node
        # (docs/guarantees.md: "the attempt fails with CheckpointNotDurable").
        return isinstance(failure, expected_type) or (node_lost and outcome.tier_on() and _not_durable(failure))

    if last.rank == EVERY_RANK:  # the first rank to fail is the cause; the other may be stopped first
        fired_on = [r for r in (0, 1) if (outcome.out / "markers" / f"returned_{charged[-1]}_rank_{r}").exists()]
        assert any(isinstance(error.worker_failures.get(r), expected_type) for r in fired_on), \
            f"none of ranks {fired_on} ({last.kind}) is among the failures as {expected_type}"
    else:
        assert last.rank in error.worker_failures, f"rank {last.rank} ({last.kind}) is not among the failures"
        assert is_cause(error.worker_failures[last.rank]), \
            f"worker_failures[{last.rank}] is {error.worker_failures[last.rank]!r}, expected {expected_type}"
    assert expected_text in text, f"{expected_text!r} is not in the error message"
    root_line = next(line for line in text.splitlines() if line.startswith("Root cause: "))
    if node_lost:
        # Both ranks lived on the lost node: either may be named as the root cause.
        assert "NodeLostError" in root_line or "WorkerHangError" in root_line or \
            (outcome.tier_on() and "CheckpointNotDurable" in root_line and " is lost " in root_line), root_line
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
    last_attempt = len(outcome.charged())
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
    # Except after the node agent was killed with the memory tier on: the rounds committed in memory that
    # it had not put on storage went with it (the documented limit on one host); never one on storage.
    resumes = [a["resume_step"] for a in outcome.attempts()]
    floors = []
    for attempt, resume in enumerate(resumes):
        durable = outcome.agent_killed_in(attempt) if outcome.tier_on() else None
        floors.append(resume if durable is None else durable)
        if attempt > 0:
            assert resume >= floors[attempt - 1], \
                f"an attempt resumed from an older checkpoint than the run had: {resumes} (floors {floors})"
    if latest is not None:
        assert named[latest["checkpoint_dir_name"]] >= floors[-1]
    lost = outcome.lost_rounds()
    assert not set(lost) & set(named), f"the index names rounds that were lost: {sorted(set(lost) & set(named))}"
    if outcome.error is None:
        assert on_disk == sorted(named), f"uncommitted directories remain: {on_disk} vs index {sorted(named)}"
        expected = checkpoint_steps(schedule.every)
        if schedule.num_to_keep is not None:
            expected = expected[-schedule.num_to_keep:]
        assert steps == expected, f"kept steps {steps}, expected the latest {expected}"


def _tier_round_committed(outcome: Outcome, i: int) -> bool:
    """For a kill_after_tier_report fault i: whether the round it killed rank 0 after was committed. Rank
    0's report returned (noted right before the kill); SYNC returns once every rank reported the round and
    it is committed in memory, ASYNC once rank 0's files are in the tier and its report is with its agent,
    so it needs rank 1's report of the step too (rank 1 notes that it returned)."""
    fault, token = outcome.schedule.faults[i], outcome.token(outcome.attempt_of(i))
    ranks = (0, 1) if fault.arg else (0,)
    return all((outcome.out / "markers" / f"returned_{i}_rank_{r}_{token}").exists() for r in ranks)


def check_acknowledged_checkpoints_survive(outcome: Outcome) -> None:
    """A checkpoint whose report returned on both ranks before a fault fired is never lost.

    A fault at step t fires after step t's allreduce, which each rank entered only after its report
    of step t-1 returned: so every checkpoint step c of that attempt with c <= t-1 was reported (and,
    on rank 0, acknowledged) by both ranks, and the next attempt must resume from c or later. With the
    memory tier, acknowledged means committed in memory, which also covers a kill_after_tier_report's
    own step once its round was committed (SIGKILL 0 ms after report() returned loses nothing); a killed
    node agent takes what it had not put on storage with it, so then only what was on storage right
    before the kill counts.
    """
    attempts, committed = outcome.attempts(), _committed_steps(outcome)
    for i in outcome.charged():
        fault, attempt = outcome.schedule.faults[i], outcome.attempt_of(i)
        start = attempts[attempt]["resume_step"]
        acknowledged = [c for c in checkpoint_steps(outcome.schedule.every) if start < c <= fault.step - 1]
        if fault.kind == "kill_after_tier_report" and _tier_round_committed(outcome, i):
            acknowledged.append(fault.step)
        if not acknowledged:
            continue
        resumed = attempts[attempt + 1]["resume_step"] if attempt + 1 < len(attempts) \
            else max(committed, default=-1)
        durable = outcome.agent_killed_in(attempt) if outcome.tier_on() else None
        if durable is not None:
            assert resumed >= durable, (
                f"fault {i} ({fault}) killed the node agent when storage held step {durable}, yet the run then "
                f"stood at step {resumed}: a durable checkpoint was lost")
            continue
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
        fault, attempt = outcome.schedule.faults[i], outcome.attempt_of(i)
        steps = [e["metrics"]["step"] for e in entries if e["attempt"] == attempt]
        start = attempts[attempt]["resume_step"]
        assert steps == list(range(start + 1, start + 1 + len(steps))), \
            f"attempt {attempt} committed the steps {steps} (it resumed after step {start})"
        if fault.kind == "kill_after_tier_report":
            returned = fault.step if _tier_round_committed(outcome, i) else fault.step - 1
        elif fault.kind in FLUSHING_KINDS:
            both = all((outcome.out / "markers" / f"returned_{i}_rank_{r}").exists() for r in (0, 1))
            returned = fault.step if both else fault.step - 1
        else:
            continue
        assert start + 1 + len(steps) > returned, (
            f"fault {i} ({fault}) fired once every rank's report of step {returned} had returned, yet attempt "
            f"{attempt} committed only {steps}")


def check_lost_rounds(outcome: Outcome) -> None:
    """A round committed in memory is lost only with the node agent that held it (one host: the documented
    limit), and never silently: the coordinator logs each one by name. agent_sigkill_during_persist kills
    the agent while it writes its round to storage (held there): that round is always lost. Everything
    else (a worker SIGKILLed 0 ms after its report returned, a storage outage shorter than the agents'
    retries) loses nothing."""
    lost = outcome.lost_rounds()
    failed_commits = [line for line in outcome.errors_logged if "could not commit checkpoint_" in line]
    assert not failed_commits, f"committed rounds could not be committed on storage: {failed_commits}"
    killed = [i for i in outcome.fired() if (outcome.out / "markers" / f"durable_{i}").exists()]
    if not (outcome.tier_on() and killed):
        assert not lost, f"rounds committed in memory were lost, yet no node agent was killed: {lost}"
    entries = outcome.metrics_entries()
    for i in killed:
        fault = outcome.schedule.faults[i]
        if fault.kind != "agent_sigkill_during_persist":
            continue
        attempt = outcome.attempt_of(i)
        rounds = [e["report_index"] for e in entries if e["attempt"] == attempt and e["metrics"]["step"] == fault.step]
        assert len(rounds) == 1, f"rank 0's report of step {fault.step} in attempt {attempt}: {rounds}"
        assert lost.get(f"checkpoint_{rounds[0]:06d}") == rounds[0], \
            f"fault {i} ({fault}) killed the agent persisting round {rounds[0]}, yet it was not logged as lost: {lost}"


def check_storage_outage(outcome: Outcome) -> None:
    """storage_outage_during_persist: the agent's writes of the round failed (the outage notes were used
    up), unless a node agent was killed after the fault, before it wrote anything."""
    for i in outcome.fired():
        if outcome.schedule.faults[i].kind != "storage_outage_during_persist":
            continue
        killed_later = any((outcome.out / "markers" / f"durable_{j}").exists() for j in outcome.fired() if j > i)
        left = sorted(os.listdir(outcome.out / OUTAGE))
        assert killed_later or not left, f"the injected storage outage was never hit: {left} left"


def check_tier_full(outcome: Outcome) -> None:
    """A tier smaller than one checkpoint: every checkpoint goes from the worker to storage, with one
    warning per worker (rank 0 reports them all). Any other setting: no warning (the default tier never
    fills here, and without a tier there is nothing to warn about)."""
    full = outcome.schedule.memory_tier_bytes == TIER_FULL_BYTES
    for attempt in range(len(outcome.attempts())):
        for rank in (0, 1):
            count = outcome.rank_log(attempt, rank).count(TIER_FULL_WARNING)
            assert count <= (1 if full and rank == 0 else 0), \
                f"attempt {attempt} rank {rank} warned {count} times of a full memory tier"
    if full and outcome.error is None:
        # The last attempt's rank 0 committed a checkpoint, so it warned (its log is complete: it ended).
        last = len(outcome.attempts()) - 1
        checkpoints = [e for e in outcome.metrics_entries() if e["attempt"] == last
                       and e["metrics"]["step"] in checkpoint_steps(outcome.schedule.every)]
        if checkpoints:
            assert outcome.rank_log(last, 0).count(TIER_FULL_WARNING) == 1, outcome.rank_log(last, 0)[-3000:]


def check_tiers(outcome: Outcome) -> None:
    """No memory tier is left behind (run after check_processes: the run's agents are gone). An agent
    removes its tier when it ends; one SIGKILLed cannot, and the next agent on the host removes it when
    it makes its own (minitrain/storage/memory_tier.py). So exactly one is left when the run's last attempt
    ended with its agent SIGKILLed and a tier (no agent came after it); it is removed here. The tier
    directory is the session's (tests/conftest.py): only the tiers this run made count."""
    outcome.tiers_after = _tiers()
    left = sorted(outcome.tiers_after - outcome.tiers_before)
    charged = outcome.charged()
    last_killed = outcome.error is not None and outcome.schedule.memory_tier_bytes != 0 and bool(charged) \
        and (outcome.out / "markers" / f"durable_{charged[-1]}").exists()
    for name in left:
        shutil.rmtree(os.path.join(tier_parent(), name), ignore_errors=True)
    assert len(left) == (1 if last_killed else 0), \
        f"memory tiers left in {tier_parent()}: {left} (the last attempt's agent was killed: {last_killed})"


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
            "memory_tier_bytes": schedule.memory_tier_bytes, "lost_rounds": len(outcome.lost_rounds()),
            "committed": len(_committed_steps(outcome))}
    with open(path, "a") as handle:
        handle.write(json.dumps(line) + "\n")


def run_and_check(schedule: Schedule, reference_params: str, *more_checks, root: Optional[Path] = None) -> Outcome:
    """Run `schedule` and check every invariant, then `more_checks` (each called with the outcome while
    its files are still there); the example's directory (`root`: a new temporary one by default) is
    removed afterwards."""
    keep = os.environ.get("MINITRAIN_FAULTS_KEEP") == "1"
    root = root or Path(tempfile.mkdtemp(prefix="mt-faults-"))
    outcome = None
    try:
        outcome = run_schedule(schedule, root)
        try:
            check_processes(outcome)
            check_tiers(outcome)
            check_outcome(outcome)
            check_checkpoints(outcome)
            check_acknowledged_checkpoints_survive(outcome)
            check_returned_reports_committed(outcome)
            check_lost_rounds(outcome)
            check_storage_outage(outcome)
            check_tier_full(outcome)
            check_other_users(outcome)
            check_success(outcome, reference_params)
            for check in more_checks:
                check(outcome)
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
    # The tier first (the default one twice as often: it is what runs get), then kinds that fit it.
    tier = TIER_SETTINGS[draw(st.sampled_from(["tier", "tier", "no_tier", "tier_full"]))]
    faults = []
    for _ in range(draw(st.integers(0, 3))):
        kinds = kinds_for(tier)
        kind = draw(st.sampled_from(kinds))
        if kind in CHECKPOINT_KINDS + TIER_KINDS:
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
        elif kind == "kill_after_tier_report":
            arg = draw(st.sampled_from([0, 1]))  # SYNC, ASYNC
        faults.append(Fault(rank, step, kind, arg))
    return Schedule(faults=tuple(faults), max_failures=draw(st.sampled_from([0, 1, 2, 3])), every=every,
                    num_to_keep=draw(st.sampled_from([1, 2, None])),
                    killed_driver=draw(st.sampled_from([0, 0, 0, 1, 2, 3])),
                    rival=draw(st.sampled_from([False, False, False, True])), memory_tier_bytes=tier)


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

NO_TIER = TIER_SETTINGS["no_tier"]
# (fault, the schedule's memory_tier_bytes): every kind once, with the default tier unless it needs the
# worker's own upload; kill_during_checkpoint_report both ways (the kill lands in the copy into the tier and
# the wait for the commit in memory, or in the upload to storage).
REGRESSIONS = [
    (Fault(1, 2, "exception"), None),
    (Fault(0, 4, "exit_code", 3), None),
    (Fault(1, 5, "sigkill"), None),
    (Fault(0, 2, "sigsegv"), None),
    (Fault(1, 4, "hang_sigstop"), None),
    (Fault(0, 5, "hang_loop"), None),
    (Fault(1, 3, "agent_sigkill"), None),
    (Fault(0, 3, "upload_fails"), None),
    (Fault(0, 5, "upload_partial_then_die"), None),
    (Fault(0, 3, "kill_during_checkpoint_report", 10), None),
    (Fault(0, 3, "kill_during_checkpoint_report", 10), NO_TIER),
    (Fault(1, 4, "after_report_exception"), None),
    (Fault(EVERY_RANK, 4, "after_report_exception"), None),
    (Fault(EVERY_RANK, 3, "after_report_exit"), None),
    (Fault(0, 3, "agent_sigstop_slow_upload"), NO_TIER),
    (Fault(0, 3, "kill_after_tier_report", 0), None),
    (Fault(0, 3, "kill_after_tier_report", 1), None),
    (Fault(0, 3, "agent_sigkill_during_persist"), None),
    (Fault(0, 3, "storage_outage_during_persist"), None),
]


def _regression_id(fault: Fault, tier: Optional[int]) -> str:
    name = f"{fault.kind}-rank{'s' if fault.rank == EVERY_RANK else fault.rank}"
    if fault.kind == "kill_after_tier_report":
        name += "-ASYNC" if fault.arg else "-SYNC"
    return name + ("-no_tier" if tier == NO_TIER else "")


IDS = [_regression_id(fault, tier) for fault, tier in REGRESSIONS]
# The matrix's entries in the default run: a rank killed mid-training, the group restarted, and the run ends
# bit-identical to a fault-free one; and rank 0 SIGKILLed 0 ms after its SYNC report of a checkpoint returned,
# which must cost nothing committed (the restart resumes from that round, read back from the memory tier).
# The other kinds are the soak tier's.
SURVIVED_IN_THE_DEFAULT_RUN = ("sigkill-rank1", "kill_after_tier_report-rank0-SYNC")


@pytest.mark.parametrize("fault,tier", [
    pytest.param(fault, tier, id=name, marks=() if name in SURVIVED_IN_THE_DEFAULT_RUN else pytest.mark.soak)
    for (fault, tier), name in zip(REGRESSIONS, IDS)])
def test_each_fault_kind_is_survived_once(fault, tier, reference_params):
    def more(outcome: Outcome) -> None:
        assert outcome.fired() == [0] and outcome.error is None
        # SYNC's report returned once the round was committed in memory; ASYNC's needs rank 1's report too,
        # which all but always returned before the coordinator stops rank 1 (check the round when it did).
        if fault.kind == "kill_after_tier_report" and (_tier_round_committed(outcome, 0) or not fault.arg):
            assert _tier_round_committed(outcome, 0) and outcome.attempts()[1]["resume_step"] == fault.step
            assert outcome.attempts()[1]["checkpoint"].startswith(tier_parent() + os.sep), \
                f"the restart did not read the round from the memory tier: {outcome.attempts()[1]}"
        if fault.kind == "agent_sigkill_during_persist" and (outcome.out / "markers" / "durable_0").exists():
            assert len(outcome.lost_rounds()) == 1, outcome.lost_rounds()  # that round (check_lost_rounds), only

    run_and_check(Schedule(faults=(fault,), max_failures=1, every=2, num_to_keep=1, memory_tier_bytes=tier),
                  reference_params, more)


@pytest.mark.soak
@pytest.mark.parametrize("fault,tier", [(fault, tier) for fault, tier in REGRESSIONS if fault.kind not in FREE_KINDS],
                         ids=[name for (fault, _), name in zip(REGRESSIONS, IDS) if fault.kind not in FREE_KINDS])
def test_each_fault_kind_spends_a_zero_budget_and_is_named(fault, tier, reference_params):
    outcome = run_and_check(Schedule(faults=(fault,), max_failures=0, every=2, num_to_keep=2,
                                     memory_tier_bytes=tier), reference_params)
    assert outcome.fired() == [0] and outcome.error is not None


@pytest.mark.soak
def test_a_storage_outage_shorter_than_the_retries_costs_no_failure(reference_params):
    # Rank 0's checkpoint of step 1 is committed in memory; its agent's writes to storage fail twice (and
    # are retried), and the run goes on: with max_failures=0 it succeeds, every round durable. Then rank 1
    # raises at step 4, in the same attempt: the restart reads step 3 back, nothing lost.
    def more(outcome: Outcome) -> None:
        assert outcome.fired() == [0, 1] and outcome.error is None
        assert [outcome.attempt_of(i) for i in (0, 1)] == [0, 0]
        assert outcome.attempts()[1]["resume_step"] == 3

    run_and_check(Schedule(faults=(Fault(0, 1, "storage_outage_during_persist"), Fault(1, 4, "exception")),
                           max_failures=1, every=2, num_to_keep=None), reference_params, more)


@pytest.mark.soak
def test_tier_full_uploads_from_the_worker_with_one_warning(reference_params):
    # A tier of TIER_FULL_BYTES (smaller than one checkpoint): every checkpoint falls back to rank 0's own
    # upload, with one warning per worker (check_tier_full), in both attempts around a killed rank.
    def more(outcome: Outcome) -> None:
        assert outcome.error is None
        for attempt in (0, 1):
            assert outcome.rank_log(attempt, 0).count(TIER_FULL_WARNING) == 1, attempt
            checkpoint = outcome.attempts()[attempt]["checkpoint"]
            assert checkpoint is None or not checkpoint.startswith(tier_parent() + os.sep), checkpoint

    run_and_check(Schedule(faults=(Fault(1, 4, "sigkill"),), max_failures=1, every=2, num_to_keep=2,
                           memory_tier_bytes=TIER_FULL_BYTES), reference_params, more)


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



# ---------------------------------------------------------------------------------- in a driver process of its own
TESTS_DIR = str(Path(__file__).resolve().parents[1])
CHILD_VAR = "MINITRAIN_FAULTS_CHILD"  # every process of a driver process run in its own has it in its environment


def run_and_check_in_a_driver_process(schedule: Schedule, reference_params: str, timeout_s: float) -> None:
    """run_and_check(schedule) in a Python process of its own, SIGKILLed (and everything it started ended)
    after `timeout_s`: for a schedule under which fit() may never return. The in-process watchdog cannot
    end a coordinator that loops without looking at interrupts, and neither can pytest-timeout."""
    root = Path(tempfile.mkdtemp(prefix="mt-faults-"))
    marker = uuid.uuid4().hex
    code = (f"import sys; sys.path[:0] = [{FAULTS_DIR!r}, {TESTS_DIR!r}]; from pathlib import Path; "
            "import conftest, test_fault_injection as t; from fault_training import Fault, Schedule; "
            f"t.run_and_check({schedule!r}, {reference_params!r}, root=Path({str(root)!r}))")
    tiers_before = _tiers()
    child = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, CHILD_VAR: marker},
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = child.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        output, _ = child.communicate()
        # Its agents lose their lease to the dead driver and stop their workers; what is left is ended here.
        left = wait_until_gone(_processes_with(CHILD_VAR, marker), timeout=EARLIER_DRIVER_CLEANUP_S)
        for pid in left:
            _kill_pid(pid)
        for note in (root / "out" / "daemons").glob("*") if (root / "out" / "daemons").exists() else ():
            if not note.name.endswith(".tmp"):
                _kill_noted_daemon(int(note.name))
        for name in _tiers() - tiers_before:  # a killed agent's tier, swept by no later agent
            shutil.rmtree(os.path.join(tier_parent(), name), ignore_errors=True)
        raise AssertionError(f"fit() did not return within {timeout_s:g} s under {schedule} (the driver was "
                             f"SIGKILLed; processes still alive then: {left}):\n{output[-6000:]}") from None
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert child.returncode == 0, f"the schedule {schedule} broke an invariant:\n{output[-12000:]}"


def _processes_with(name: str, value: str) -> list[int]:
    """Pids of living processes whose environment has `name`=`value`."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get(name) == value and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process.pid)
        except (psutil.Error, OSError):
            continue
    return found


def _kill_pid(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.mark.soak
def test_the_node_agent_killed_twice_while_it_persists(reference_params):
    # Round 1 is lost with the first agent (attempt 0), round 5 of attempt 1 with the relaunched one: each
    # logged by name; the run resumes from what is on storage each time and trains past both.
    run_and_check_in_a_driver_process(
        Schedule(faults=(Fault(0, 1, "agent_sigkill_during_persist"), Fault(0, 5, "agent_sigkill_during_persist")),
                 max_failures=2, every=2, num_to_keep=None), reference_params, timeout_s=120.0)
