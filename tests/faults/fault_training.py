"""The worker side of the fault-injection suite: a deterministic DDP training function that fires faults.

Kept apart from test_fault_injection.py so that workers, which import this module to unpickle
`train_fn` by reference, and node agents, which import it to unpickle the run's storage filesystem
(TierFaultFileSystem), import neither pytest nor hypothesis (less start-up per attempt), and so
that the exception types below are the same classes in the driver and in the workers.

`train_fn(config)`: N_STEPS steps of nn.Linear(4, 1) with SGD+momentum under DDP (gloo), the batch of
step s on rank r drawn from a seed of (s, r) so every attempt sees the same data. Rank 0 checkpoints
model, optimizer state and step after every step s with (s + 1) % config["every"] == 0; every attempt
resumes from `get_checkpoint()` at step + 1. Each step reports {"step": s}. At the end rank 0 writes
the exact bits of the parameters to <out>/final_params.hex. Notes under <out>: pids/<pid> (every
worker and its agent), daemons/<pid> (a setsid daemon each worker starts), attempts/<time>_<token>
(the step each attempt resumed from), markers/fault_<i> (fault i fired; holds the token of the attempt it fired in),
markers/returned_<i>_rank_<r> (after-report fault i: rank r's report returned, the fault fires next;
for a kill_after_tier_report fault, returned_<i>_rank_<r>_<token>: in that attempt), markers/durable_<i> (a fault that
kills the node agent: the latest step on storage, in the index, right before the kill),
slow_writers/<pid> (that process's uploads crawl: see SlowWriterFileSystem), and the agent-side storage
faults of TierFaultFileSystem: hold_persist/<agent pid> (that agent's writes to the staging area wait
while the worker whose pid the file holds lives), persisting/<agent pid> (that agent is held in such a
write now), outage/<n> (each file is one failed write to the staging area by an agent).

The memory tier. By default a reported checkpoint goes into the node agent's memory tier, and the agent
writes it to storage in the background (docs/guide/checkpoints.md, "The memory tier"). Each schedule
draws its tier (Schedule.memory_tier_bytes): the default tier, none (0: the worker uploads itself, as
before the tier existed), or a tier smaller than one checkpoint (TIER_FULL_BYTES: every checkpoint falls
back to the worker's upload, with one warning per worker). A kind that needs one path is only drawn with
it (`kinds_for`).
"""

from __future__ import annotations

import errno
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Optional

from fsspec.implementations.local import LocalFileSystem

import minitrain

N_STEPS = 8
CHECKPOINT_FILES = ("model.pt", "optim.pt", "meta.json")

PROCESS_KINDS = ("exception", "exit_code", "sigkill", "sigsegv", "hang_sigstop", "hang_loop", "agent_sigkill")
# Fired 0 ms after report() returned, on one rank or (rank EVERY_RANK) on every rank at once.
AFTER_REPORT_KINDS = ("after_report_exception", "after_report_exit")
# Fired by rank 0 in its report of a checkpoint. The upload faults go through the user's
# checkpoint_upload_fn, which never uses the memory tier (minitrain/worker/session.py reports through the
# tier only without one): they test the worker's own upload with or without a tier.
# kill_during_checkpoint_report lands in whatever the report does: the copy into the tier and the wait for
# the round's commit in memory with a tier, the upload to storage without one (both are drawn).
CHECKPOINT_KINDS = ("upload_fails", "upload_partial_then_die", "kill_during_checkpoint_report",
                    "agent_sigstop_slow_upload")
# The memory tier's faults, fired by rank 0 at one of its checkpoint steps (only drawn with the default tier):
# - kill_after_tier_report: rank 0 SIGKILLs itself 0 ms after its report(checkpoint) returned, SYNC
#   (arg 0) or ASYNC (arg 1): what was committed must survive;
# - agent_sigkill_during_persist: rank 0's node agent is SIGKILLed while it writes that round to storage
#   (held there by TierFaultFileSystem): the round is lost (the documented limit on one host), nothing
#   durable is, and the restart trains past it;
# - storage_outage_during_persist: the agent's writes to storage fail OUTAGE_WRITES times (pauses of 0.5
#   and 1 s between its retries, well within PERSIST_RETRY_S): nothing is lost, and it costs no failure.
TIER_KINDS = ("kill_after_tier_report", "agent_sigkill_during_persist", "storage_outage_during_persist")
KINDS = PROCESS_KINDS + AFTER_REPORT_KINDS + CHECKPOINT_KINDS + TIER_KINDS
# agent_sigstop_slow_upload needs the worker's own upload to storage (a stale writer whose slow write lands
# after its node was declared lost): with a tier, the worker's report goes into host memory and to its
# frozen agent, and nothing of it is ever written late. It is drawn only without a tier (or a full one).
UPLOAD_PATH_KINDS = ("agent_sigstop_slow_upload",)
# A fault of these kinds fires and the run goes on: it costs no failure, and the next fault may fire in the
# same attempt (at a later step).
FREE_KINDS = ("storage_outage_during_persist",)
# These kill the node agent, and with it its memory tier: the rounds it had not put on storage yet are lost.
AGENT_KILLING_KINDS = ("agent_sigkill", "agent_sigkill_during_persist")
# Schedule.memory_tier_bytes: None is CheckpointConfig's default tier, 0 none, TIER_FULL_BYTES a tier smaller
# than one checkpoint (about 4 KB: model.pt and optim.pt about 2 KB each).
TIER_FULL_BYTES = 1024
TIER_SETTINGS = {"tier": None, "no_tier": 0, "tier_full": TIER_FULL_BYTES}
# The retry budget of the agents' writes to storage (MINITRAIN_PERSIST_RETRY_S, set for every run's agents
# through the environment they inherit): far longer than the injected outage, whose OUTAGE_WRITES failed
# writes cost the agent 0.5 + 1.0 s of pauses.
PERSIST_RETRY_S = 30.0
OUTAGE_WRITES = 2
EVERY_RANK = -1
AFTER_REPORT_EXIT_CODE = 7
# agent_sigstop_slow_upload: rank 0 freezes its node agent, then uploads a checkpoint to storage that is
# slow for it alone (SlowWriterFileSystem). The node is declared lost while the upload crawls on; the
# stale rank's checkpoint carries one more file, STALE_FILE, so a late write that lands in a directory a
# later attempt committed is seen by the completeness check.
STALE_FILE = "stale_writer"
SLOW_WRITERS = "slow_writers"
HANG_KINDS = ("hang_sigstop", "hang_loop")
PARTIAL_UPLOAD_EXIT_CODE = 13
# The partial upload of an injected upload fault is written by the user's checkpoint_upload_fn
# straight into the run directory: a directory of the user's, which minitrain must never delete.
USER_UPLOAD_MARKER = "written_by_the_users_upload_fn"


def kinds_for(memory_tier_bytes: Optional[int]) -> tuple[str, ...]:
    """The kinds a schedule with that tier setting may draw: the tier's faults need the default tier, the
    worker-upload faults need none (or a full one)."""
    if memory_tier_bytes is None:
        return tuple(kind for kind in KINDS if kind not in UPLOAD_PATH_KINDS)
    return tuple(kind for kind in KINDS if kind not in TIER_KINDS)


class ImportWhenLoaded:
    """Put in train_loop_config: a worker imports `module` while it unpickles its payload, in the
    start-up phase. DDP's constructor imports torch._dynamo (about 1 s on an idle 2-core machine,
    several under load); in the training function that time counts against worker_hang_timeout_s,
    whose clock starts when the rank enters training, and a 2 s timeout would call it a hang."""

    def __init__(self, module: str):
        self.module = module

    def __reduce__(self):
        return (importlib.import_module, (self.module,))


class WaitForFile:
    """Put in train_loop_config: a worker waits (at most `timeout_s`) for `path` to exist while it
    unpickles its payload, before training and its hang clock start."""

    def __init__(self, path: str, timeout_s: float = 180.0):
        self.path, self.timeout_s = path, timeout_s

    def __reduce__(self):
        return (wait_for_file, (self.path, self.timeout_s))


def wait_for_file(path: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout_s:g} s")
        time.sleep(0.02)
    return path


class InjectedFault(Exception):
    """Raised by the training function on purpose."""


class InjectedUploadError(OSError):
    """Raised by a checkpoint_upload_fn on purpose, after copying part of the checkpoint."""


@dataclass(frozen=True)
class Fault:
    """Fire `kind` on `rank` (EVERY_RANK: on both, for AFTER_REPORT_KINDS) at `step`; `arg` is the
    exit code (exit_code), the kill delay in ms (kill_during_checkpoint_report) or the report's mode
    (kill_after_tier_report: 0 SYNC, 1 ASYNC)."""

    rank: int
    step: int
    kind: str
    arg: int = 0


@dataclass(frozen=True)
class Schedule:
    faults: tuple[Fault, ...]
    max_failures: int
    every: int  # rank 0 checkpoints at steps s with (s + 1) % every == 0
    num_to_keep: Optional[int]
    # Other users of the run directory, each drawn per example:
    killed_driver: int = 0  # > 0: an earlier driver of this run was SIGKILLed in its n-th metrics append
    rival: bool = False  # a second driver calls fit() on the same run while this one trains
    memory_tier_bytes: Optional[int] = None  # CheckpointConfig's: None the default tier, 0 none (TIER_SETTINGS)

    def __post_init__(self):
        allowed = kinds_for(self.memory_tier_bytes)
        for fault in self.faults:
            if fault.kind not in allowed:
                raise ValueError(f"Schedule: a {fault.kind!r} fault cannot fire with memory_tier_bytes="
                                 f"{self.memory_tier_bytes!r}; draw it with a tier setting of kinds_for()")


class SlowWriterFileSystem(LocalFileSystem):
    """The local filesystem, slow for the processes listed in `slow_dir`: each file a listed pid
    puts waits `delay_s` first (a frozen node's worker on a slow link to storage)."""

    def __init__(self, slow_dir: str = "", delay_s: float = 1.5, **kwargs):
        super().__init__(**kwargs)
        self.slow_dir, self.delay_s = slow_dir, delay_s

    def put_file(self, lpath, rpath, **kwargs):
        if self.slow_dir and os.path.exists(os.path.join(self.slow_dir, str(os.getpid()))):
            time.sleep(self.delay_s)
        return super().put_file(lpath, rpath, **kwargs)


HOLD_PERSIST = "hold_persist"
PERSISTING = "persisting"
OUTAGE = "outage"
STAGING_PART = "/.staging/"  # what the agents' writes of tier shards to storage have in their paths
HOLD_LIMIT_S = 60.0  # a held write goes on after this, whatever happens: a test that goes wrong never hangs


def _in_agent() -> bool:
    """Whether this process is a node agent (`python -m minitrain.agent`)."""
    with open("/proc/self/cmdline", "rb") as handle:
        return b"minitrain.agent" in handle.read().split(b"\0")


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead and not reaped yet, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


class TierFaultFileSystem(SlowWriterFileSystem):
    """SlowWriterFileSystem that also fails or holds up the node agents' writes of memory-tier shards to
    the staging area, as notes under `notes_dir` say (the agents unpickle the run's storage with this
    filesystem by reference, as the workers do: so it lives in this module, which imports no test tool):

    - outage/<n>: each such file is one write that fails (the first writer to remove it fails with EIO);
    - hold_persist/<pid of this agent>: the write notes persisting/<pid of this agent>, then waits while
      the worker whose pid that file holds lives (at most HOLD_LIMIT_S): the agent is held in the middle
      of persisting a round until the worker kills it, or, if that worker is stopped first, not at all.
    """

    def __init__(self, slow_dir: str = "", delay_s: float = 1.5, notes_dir: str = "", **kwargs):
        super().__init__(slow_dir=slow_dir, delay_s=delay_s, **kwargs)
        self.notes_dir = notes_dir

    def put_file(self, lpath, rpath, **kwargs):
        if self.notes_dir and STAGING_PART in str(rpath) and _in_agent():
            self._outage(str(rpath))
            self._hold()
        return super().put_file(lpath, rpath, **kwargs)

    def _outage(self, rpath: str) -> None:
        directory = os.path.join(self.notes_dir, OUTAGE)
        for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else ():
            try:
                os.remove(os.path.join(directory, name))
            except FileNotFoundError:
                continue  # another write took that one
            raise OSError(errno.EIO, "injected storage outage", rpath)

    def _hold(self) -> None:
        hold = os.path.join(self.notes_dir, HOLD_PERSIST, str(os.getpid()))
        try:
            worker = int(_read(hold))
        except (OSError, ValueError):
            return
        _touch(os.path.join(self.notes_dir, PERSISTING, str(os.getpid())))
        deadline = time.monotonic() + HOLD_LIMIT_S
        while _alive(worker) and os.path.exists(hold) and time.monotonic() < deadline:
            time.sleep(0.01)


RUN_NAME = "faults"
NOTE_DIRS = ("pids", "daemons", "markers", "attempts", SLOW_WRITERS, HOLD_PERSIST, PERSISTING, OUTAGE)
HANG_TIMEOUT_S = 2.0
STOP_GRACE_S = 1.0


def make_trainer(schedule: Schedule, root: str, out: str):
    """The example's TorchTrainer: run directory <root>/results/RUN_NAME, notes under `out`."""
    from minitrain import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from minitrain.torch import TorchTrainer

    for sub in NOTE_DIRS:
        os.makedirs(os.path.join(out, sub), exist_ok=True)
    results = os.path.join(root, "results")
    config = {"out": out, "faults": [vars(f) for f in schedule.faults], "every": schedule.every,
              "run_dir": os.path.join(results, RUN_NAME), "preload": ImportWhenLoaded("torch._dynamo")}
    if schedule.rival:
        config["rival_gate"] = WaitForFile(os.path.join(out, RIVAL_DONE))
    return TorchTrainer(
        train_fn, train_loop_config=config, scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name=RUN_NAME, storage_path=results,
            storage_filesystem=TierFaultFileSystem(slow_dir=os.path.join(out, SLOW_WRITERS), notes_dir=out),
            checkpoint_config=CheckpointConfig(num_to_keep=schedule.num_to_keep,
                                               memory_tier_bytes=schedule.memory_tier_bytes),
            # The property is the failure budget's: three faults in a row at one step must not end the run
            # for lack of progress before max_failures=3 is spent (that stop has tests of its own).
            failure_config=FailureConfig(max_failures=schedule.max_failures, max_attempts_without_progress=-1,
                                         worker_hang_timeout_s=HANG_TIMEOUT_S,
                                         worker_stop_grace_s=STOP_GRACE_S)))


# ---------------------------------------------------------------------------------- other drivers of the run
# Each runs in a subprocess (see other_driver) and builds the example's trainer with no faults.

KILLED_DRIVER_OUT = "killed_driver_out"
RIVAL_REFUSED = "RIVAL: refused"
RIVAL_DONE = "rival_done"  # under `out`: the workers of a schedule with a rival wait for it


def _killed_driver(root: str, nth_append: int) -> None:
    """fit() the run, SIGKILLing this driver in the middle of its n-th metrics append: the complete
    lines and half of the last one reach the file, then the kill lands."""
    from minitrain.coordinator.facts import metrics_log

    appends = [0]
    flush = metrics_log.MetricsLog.flush

    def torn_flush(log):
        if log._lines:
            appends[0] += 1
            if appends[0] == nth_append:
                text = "".join(log._lines)
                log._storage.append_text(metrics_log.METRICS_NAME, text[:len(text) - len(log._lines[-1]) // 2])
                os.kill(os.getpid(), signal.SIGKILL)
        flush(log)

    metrics_log.MetricsLog.flush = torn_flush
    schedule = Schedule(faults=(), max_failures=0, every=int(os.environ["FAULTS_EVERY"]),
                        num_to_keep=json.loads(os.environ["FAULTS_KEEP"]),
                        memory_tier_bytes=json.loads(os.environ["FAULTS_TIER"]))
    make_trainer(schedule, root, os.path.join(root, KILLED_DRIVER_OUT)).fit()


def _rival(root: str) -> None:
    """fit() a run that another driver holds: must be refused with RunLockedError, touching nothing."""
    from minitrain.storage.run_lock import RunLockedError

    schedule = Schedule(faults=(), max_failures=0, every=2, num_to_keep=None)
    try:
        make_trainer(schedule, root, os.path.join(root, "rival_out")).fit()
    except RunLockedError as exc:
        print(RIVAL_REFUSED, exc, flush=True)
        return
    raise SystemExit("RIVAL: fit() was not refused")


def other_driver(argv: list) -> None:
    """["killed_driver", ROOT, N] or ["rival", ROOT]. Called from `python -c` after an import of this
    module (never run as __main__: workers unpickle train_fn by this module's name)."""
    if argv[0] == "killed_driver":
        _killed_driver(argv[1], int(argv[2]))
    else:
        _rival(argv[1])


def checkpoint_steps(every: int) -> list[int]:
    return [s for s in range(N_STEPS) if (s + 1) % every == 0]


# ---------------------------------------------------------------------------------- in the workers


def _touch(path: str, text: str = "") -> None:
    """Write `path` atomically; both ranks may write the same note (their agent's pid) at once."""
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w") as handle:
        handle.write(text)
    os.replace(temporary, path)


def _batch(step: int, rank: int):
    """The same batch for (step, rank) in every attempt."""
    import torch

    generator = torch.Generator().manual_seed(10_000 + 100 * step + rank)
    x = torch.randn(16, 4, generator=generator)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1 * torch.randn(16, 1, generator=generator)
    return x, y


def _claim_fault(config: dict, rank: int, step: int, token: str) -> tuple[int, Optional[Fault]]:
    """The fault due at (rank, step) in this attempt and its index, marked as fired; (-1, None) when
    none is due."""
    markers = os.path.join(config["out"], "markers")
    for i, fields in enumerate(config["faults"]):
        fault = Fault(**fields)
        marker = os.path.join(markers, f"fault_{i}")
        if os.path.exists(marker):
            if fault.rank == EVERY_RANK and fault.step == step and _read(marker) == token:
                return i, fault  # the other rank claimed it first, in this attempt: fire here too
            continue
        if i > 0 and _read(os.path.join(markers, f"fault_{i - 1}")) == token:
            previous = Fault(**config["faults"][i - 1])
            # The previous fault fired in this attempt: only a later attempt may fire this one, or, after a
            # fault that costs no failure, a later step of this one (never the same step: the other rank
            # may not have seen the previous fault fire yet).
            if previous.kind not in FREE_KINDS or step <= previous.step:
                return -1, None
        if fault.step != step or fault.rank not in (rank, EVERY_RANK):
            return -1, None
        _touch(marker, token)
        return i, fault
    return -1, None


def _read(path: str) -> str:
    with open(path) as handle:
        return handle.read()


def _latest_durable_step(config: dict) -> int:
    """The step of the latest checkpoint on storage (named by the run's index); -1 when none is."""
    try:
        with open(os.path.join(config["run_dir"], "checkpoint_manager_snapshot.json")) as handle:
            latest = json.load(handle).get("latest_checkpoint_result")
    except (OSError, ValueError):
        return -1
    return latest["metrics"]["step"] if latest else -1


def _kill_agent(config: dict, index: int, agent: int) -> None:
    """SIGKILL this worker's node agent, noting first (markers/durable_<index>) the latest step on storage:
    the agent's death may lose the rounds it had not put there, never one that is there."""
    _touch(os.path.join(config["out"], "markers", f"durable_{index}"), str(_latest_durable_step(config)))
    os.kill(agent, signal.SIGKILL)


def _fire(fault: Fault, config: dict, index: int) -> None:
    """Fire a fault that is not about checkpoints; never returns normally."""
    kind = fault.kind
    if kind in ("exception", "after_report_exception"):
        rank = minitrain.get_context().get_world_rank()
        raise InjectedFault(f"injected on rank {rank} at step {fault.step}")
    if kind == "after_report_exit":
        sys.exit(AFTER_REPORT_EXIT_CODE)
    if kind == "exit_code":
        os._exit(fault.arg)
    if kind == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind == "sigsegv":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif kind == "hang_sigstop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif kind == "agent_sigkill":
        _kill_agent(config, index, os.getppid())  # a worker's parent is its node agent
    elif kind != "hang_loop":
        raise AssertionError(f"unknown fault kind {kind!r}")
    while True:  # hung (or waiting for the signal to land); never carry on training
        time.sleep(0.05)


def _partial_upload(run_dir: str, kind: str):
    """A checkpoint_upload_fn that copies one file, half of another, then fails or dies."""

    def upload(checkpoint, dir_name):
        target = os.path.join(run_dir, dir_name)
        os.makedirs(target, exist_ok=True)
        open(os.path.join(target, USER_UPLOAD_MARKER), "w").close()
        shutil.copyfile(os.path.join(checkpoint.path, "model.pt"), os.path.join(target, "model.pt"))
        with open(os.path.join(checkpoint.path, "optim.pt"), "rb") as handle:
            data = handle.read()
        with open(os.path.join(target, "optim.pt"), "wb") as handle:
            handle.write(data[: len(data) // 2])
        if kind == "upload_fails":
            raise InjectedUploadError(f"injected upload failure of {dir_name} after a partial copy")
        os._exit(PARTIAL_UPLOAD_EXIT_CODE)

    return upload


def _wait_until(condition, timeout_s: float) -> bool:
    """Poll `condition` until it holds (True) or `timeout_s` passed (False)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _kill_agent_while_it_persists(config: dict, index: int, step: int, previous: int, checkpoint) -> None:
    """agent_sigkill_during_persist: report this step's checkpoint (committed in memory when it returns),
    then SIGKILL the node agent while it writes it to storage. Its earlier rounds (`previous`: the step of
    the latest checkpoint this attempt resumed from or reported) are let become durable first, so that the
    round of `step` is the one in the agent's hands (best effort: the kill may take more rounds, which the
    checks allow for)."""
    out = config["out"]
    _wait_until(lambda: _latest_durable_step(config) >= previous, 1.0)
    agent = _agent_pid()
    _touch(os.path.join(out, HOLD_PERSIST, str(agent)), str(os.getpid()))  # its writes wait while we live
    minitrain.report({"step": step}, checkpoint=checkpoint)
    # Within the hang deadline (HANG_TIMEOUT_S) of the peer waiting in the next all-reduce.
    _wait_until(lambda: os.path.exists(os.path.join(out, PERSISTING, str(agent))), 1.0)
    _kill_agent(config, index, agent)
    while True:  # this rank dies with its agent (parent-death signal)
        time.sleep(0.05)


def _report_checkpoint(config: dict, module, optimizer, step: int, fault: Optional[Fault], index: int,
                       token: str, previous: int) -> None:
    """Rank 0's report of `step` with a checkpoint, firing `fault` (fault number `index`) in it when one
    is due; `previous`: the step of the latest checkpoint this attempt resumed from or reported."""
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        torch.save({"model": module.state_dict(), "step": step}, os.path.join(tmp, "model.pt"))
        torch.save({"optimizer": optimizer.state_dict(), "step": step}, os.path.join(tmp, "optim.pt"))
        with open(os.path.join(tmp, "meta.json"), "w") as handle:
            json.dump({"step": step}, handle)
        checkpoint = minitrain.Checkpoint.from_directory(tmp)
        kind = fault.kind if fault is not None else None
        if kind is None:
            minitrain.report({"step": step}, checkpoint=checkpoint)
        elif kind == "agent_sigstop_slow_upload":
            with open(os.path.join(tmp, STALE_FILE), "w") as handle:
                handle.write(f"written by pid {os.getpid()}, whose node agent is frozen")
            _touch(os.path.join(config["out"], SLOW_WRITERS, str(os.getpid())))
            os.kill(os.getppid(), signal.SIGSTOP)  # the agent: no heartbeat, no stop from now on
            minitrain.report({"step": step}, checkpoint=checkpoint)
            while True:  # the attempt is over for this rank; its agent's end kills it (PDEATHSIG)
                time.sleep(0.05)
        elif kind == "kill_after_tier_report":
            minitrain.report({"step": step}, checkpoint=checkpoint,
                             checkpoint_upload_mode=minitrain.CheckpointUploadMode.ASYNC if fault.arg
                             else minitrain.CheckpointUploadMode.SYNC)
            _touch(os.path.join(config["out"], "markers", f"returned_{index}_rank_0_{token}"))
            os.kill(os.getpid(), signal.SIGKILL)  # 0 ms after report() returned
            while True:
                time.sleep(0.05)
        elif kind == "agent_sigkill_during_persist":
            _kill_agent_while_it_persists(config, index, step, previous, checkpoint)
        elif kind == "storage_outage_during_persist":
            for n in range(OUTAGE_WRITES):  # the agent's next writes to storage fail, this round's among them
                _touch(os.path.join(config["out"], OUTAGE, str(n)))
            minitrain.report({"step": step}, checkpoint=checkpoint)
        elif kind == "kill_during_checkpoint_report":
            # The kill lands in the copy into the memory tier (or, without one, the upload to storage), the
            # wait for the round's commit, or just after report().
            threading.Timer(fault.arg / 1000.0, os.kill, (os.getpid(), signal.SIGKILL)).start()
            minitrain.report({"step": step}, checkpoint=checkpoint)
            while True:  # the kill is at most 30 ms away: never carry on training
                time.sleep(0.05)
        else:
            minitrain.report({"step": step}, checkpoint=checkpoint,
                             checkpoint_upload_fn=_partial_upload(config["run_dir"], kind))
            raise AssertionError("the injected upload fault did not end the report")


# ---------------------------------------------------------------------------------- the "preemption signal" kind
# A schedule of preemptions (tests/faults/test_preemption_faults.py): fit() number i fires preemption i,
# from rank 0 at its step, to the driver or to rank 0's node agent, once or twice, before the step's report
# or while rank 0 uploads a checkpoint of that step (its uploads made slow, the signal 0.3 s into them).
PREEMPTED_EXIT = 143


def _agent_pid() -> int:
    import psutil

    for parent in psutil.Process().parents():
        if "minitrain.agent" in " ".join(parent.cmdline()):
            return parent.pid
    raise AssertionError("no node agent above this worker")


def _send_preemption(target_pid: int, twice: bool) -> None:
    os.kill(target_pid, signal.SIGUSR2)
    if twice:  # 0.2 s later: two signals pending at once are one signal (POSIX merges them)
        threading.Timer(0.2, os.kill, (target_pid, signal.SIGUSR2)).start()


def _preempt_if_due(config: dict, step: int) -> bool:
    """Rank 0: fire this fit()'s preemption if it is due at `step` (once: a marker notes it). Returns
    True when this step's report must carry a checkpoint (the signal lands during its upload)."""
    preemptions = config.get("preemptions") or []
    index = config.get("fit_index", 0)
    if index >= len(preemptions) or preemptions[index]["step"] != step:
        return False
    marker = os.path.join(config["out"], "markers", f"preemption_{index}")
    if os.path.exists(marker):
        return False
    _touch(marker)
    due = preemptions[index]
    target = config["driver_pid"] if due["target"] == "driver" else _agent_pid()
    if not due["during_upload"]:
        _send_preemption(target, due["twice"])
        return False
    _touch(os.path.join(config["out"], SLOW_WRITERS, str(os.getpid())))  # this rank's uploads crawl
    threading.Timer(0.3, _send_preemption, (target, due["twice"])).start()
    return True


def preemption_driver(root: str, schedule: dict, fit_index: int) -> int:
    """One fit() of a preemption schedule ({"every", "preemptions": [...]}): prints PREEMPTED <json> (exit
    143) or FINISHED <json> (exit 0). Called from `python -c` (workers unpickle train_fn by module)."""
    from minitrain import CheckpointConfig, FailureConfig, PreemptionError, RunConfig, ScalingConfig
    from minitrain.torch import TorchTrainer

    out = os.path.join(root, "out")
    for sub in NOTE_DIRS:
        os.makedirs(os.path.join(out, sub), exist_ok=True)
    preemptions = schedule["preemptions"]
    # A preemption "during the upload" needs the worker's own upload to storage: with the memory tier, the
    # report returns once the files are in host memory, long before the signal lands 0.3 s later. That
    # fit() runs without a tier; the run's other fits use the default one.
    during_upload = fit_index < len(preemptions) and preemptions[fit_index]["during_upload"]
    results = os.path.join(root, "results")
    config = {"out": out, "faults": [], "every": schedule["every"], "run_dir": os.path.join(results, RUN_NAME),
              "preload": ImportWhenLoaded("torch._dynamo"), "preemptions": preemptions,
              "fit_index": fit_index, "driver_pid": os.getpid()}
    trainer = TorchTrainer(
        train_fn, train_loop_config=config, scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name=RUN_NAME, storage_path=results,
                             storage_filesystem=SlowWriterFileSystem(slow_dir=os.path.join(out, SLOW_WRITERS)),
                             checkpoint_config=CheckpointConfig(memory_tier_bytes=0 if during_upload else None),
                             failure_config=FailureConfig(worker_stop_grace_s=STOP_GRACE_S,
                                                          preemption_timeout_s=30.0)))
    try:
        result = trainer.fit()
    except PreemptionError as exc:
        print("PREEMPTED " + json.dumps({"round": exc.preemption_info.round, "drain_timed_out": exc.drain_timed_out,
                                         "checkpoint_dir": exc.checkpoint_dir, "resumable": exc.resumable}),
              flush=True)
        return PREEMPTED_EXIT
    print("FINISHED " + json.dumps({"metrics": result.metrics}), flush=True)
    return 0


def _start_daemon(out: str) -> None:
    """What user code does now and then: a daemon in a session of its own (out of the worker's process
    group) with an environment of its own (no run tag: only its noted pid finds it). The agent must end
    it with the attempt (minitrain/agent/descendants.py); daemons/<pid> notes it."""
    quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    daemon = subprocess.Popen([sys.executable, "-S", "-c", "import time; time.sleep(3600)"],
                              start_new_session=True, env={}, **quiet)
    _touch(os.path.join(out, "daemons", str(daemon.pid)))


def _note_returned_before_tier_kill(config: dict, step: int, token: str) -> None:
    """Rank 1, right after its report of `step` returned: when a kill_after_tier_report fault is due at
    `step`, note it (markers/returned_<i>_rank_1_<this attempt's token>). With ASYNC, rank 0's report
    returns before the round is committed; the round is committed once this report is in too."""
    for i, fields in enumerate(config["faults"]):
        if fields["kind"] == "kill_after_tier_report" and fields["step"] == step:
            _touch(os.path.join(config["out"], "markers", f"returned_{i}_rank_1_{token}"))


def train_fn(config: dict):
    """Deterministic DDP regression: N_STEPS steps, rank 0 checkpoints every config['every'] steps."""
    import torch
    import torch.distributed as dist
    from torch import nn

    from minitrain.torch import prepare_model

    rank = minitrain.get_context().get_world_rank()
    out = config["out"]
    for pid in (os.getpid(), os.getppid()):
        _touch(os.path.join(out, "pids", str(pid)))
    _start_daemon(out)
    token = [uuid.uuid4().hex if rank == 0 else None]
    dist.broadcast_object_list(token, src=0)  # one token per attempt, the same on both ranks
    token = token[0]

    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    resume_step, optimizer_state = -1, None
    checkpoint = minitrain.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            saved_model = torch.load(os.path.join(directory, "model.pt"))
            saved_optimizer = torch.load(os.path.join(directory, "optim.pt"))
        model.load_state_dict(saved_model["model"])
        optimizer_state = saved_optimizer["optimizer"]
        resume_step = saved_model["step"]
        assert saved_optimizer["step"] == resume_step
    if rank == 0:
        _touch(os.path.join(out, "attempts", f"{time.time_ns():020d}_{token}"),
               json.dumps({"resume_step": resume_step, "checkpoint": checkpoint and checkpoint.path}))
    model = prepare_model(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if optimizer_state is not None:
        optimizer.load_state_dict(optimizer_state)
    module = getattr(model, "module", model)

    previous = resume_step  # the latest checkpoint this attempt resumed from or reported
    for step in range(resume_step + 1, N_STEPS):
        x, y = _batch(step, rank)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        index, fault = _claim_fault(config, rank, step, token)
        if fault is not None and fault.kind in PROCESS_KINDS:
            _fire(fault, config, index)
        forced = rank == 0 and _preempt_if_due(config, step)  # the "preemption signal" kind
        preempted = minitrain.get_preemption_info() is not None
        if rank == 0 and (forced or preempted or (step + 1) % config["every"] == 0):
            _report_checkpoint(config, module, optimizer, step,
                               fault if fault is not None and fault.kind in CHECKPOINT_KINDS + TIER_KINDS else None,
                               index, token, previous)
            previous = step
        else:
            minitrain.report({"step": step})
            if rank == 1:
                _note_returned_before_tier_kill(config, step, token)
        if fault is not None and fault.kind in AFTER_REPORT_KINDS:
            _touch(os.path.join(out, "markers", f"returned_{index}_rank_{rank}"))
            _fire(fault, config, index)  # 0 ms after report() returned

    if rank == 0:
        bits = b"".join(p.detach().numpy().tobytes() for p in module.parameters()).hex()
        _touch(os.path.join(out, "final_params.hex"), bits)
