"""What the controller tells the driver-side observers of a run, and the one fan-out that tells them.

Every driver-side consumer of a run's progress is a `RunObserver`: Ray's `UserCallback` adapter and the
tracker callbacks (`RunConfig.callbacks`), the run monitor behind the console and the dashboard, and
the benchmarks' report tap. The controller calls `Observers` at these points, on its own thread:

    on_run_start      once, before the agents are waited for
    on_state          every move of the run's state, in order, as it is made: (previous, next, reason,
                      attempt) with `RunState` values, PENDING -> LAUNCHING first and the terminal
                      state last (Ray's `after_controller_state_update`). A move to STARTING comes
                      before its attempt's on_attempt_start; RESTARTING -> STARTING after the old
                      attempt's on_attempt_end
    on_attempt_start  each attempt, once its ranks are placed and started
    on_report         every report of every rank of the current attempt, as it arrives (before it is
                      recorded); a report of a stale attempt is never passed on
    on_telemetry      every telemetry sample of a rank of the current attempt (about one per rank and
                      second while it trains, unless MINITRAIN_TELEMETRY=0), with its host, pid and
                      phase filled in by the controller
    on_round          a report round every rank has answered, after its checkpoint (if any) was
                      committed: Ray's `after_report` granularity (committed in memory, when its files
                      are in the nodes' memory tiers)
    on_durable        a checkpoint committed in memory is on storage and in the index (in round order)
    on_attempt_end    each attempt that started, once it is over (failed, or the run's last: after
                      the move to the terminal state)
    on_run_end        once, however the run ended (also on Ctrl-C and on an unsatisfiable request)
    on_resize         an elastic run's attempt started at another size than the previous one
                      (`coordinator.elastic.Resize`: the sizes and why), after its on_attempt_start
    on_stacks         a rank's thread stacks, each time some were taken (asked for by the hang
                      detection or through `RunInfo.request_stacks`, e.g. the dashboard's button)

Observers run on the controller's thread, so each call must be quick (an observer that does I/O hands
the work to a thread of its own). An exception an observer raises is logged and the run goes on: what
watches a run never changes its outcome.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence as SequenceABC
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Mapping, Optional, Sequence

from minitrain.records import ReportRecord, RunOutcome, WorkerFailure
# Telemetry records live in L0 (the worker builds them too); re-exported here for the observers' users.
from minitrain.records import GpuSample, TelemetrySample  # noqa: F401
from minitrain.run_state import RunState
from minitrain.storage.retention import CheckpointRecord

if TYPE_CHECKING:
    from minitrain.coordinator.policy.elastic import Resize

logger = logging.getLogger("minitrain")


@dataclass(frozen=True)
class RunInfo:
    """The run as it starts: `run_path` is the run directory's URL (`<storage_path>/<name>`).
    `request_stacks(rank)` may be called from any thread while the run goes on: it asks that rank of
    the current attempt for every thread's stack and returns at once; the answer comes to `on_stacks`
    (none when the rank is not running). None where no controller runs."""

    run_id: str
    experiment_name: str
    run_path: str
    num_workers: int
    started_at: float
    request_stacks: Optional[Callable[[int], None]] = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class StackDump:
    """Every thread's stack of one rank, as its faulthandler wrote them ("" when it did not answer)."""

    attempt: int
    rank: int
    text: str


@dataclass(frozen=True)
class AttemptInfo:
    """One attempt as it starts: `hosts[r]` is the node that runs rank r; `host_memory_bytes` maps each
    of those hosts to its total memory in bytes, as its node agent's hello said (what a memory plot
    is drawn against; empty where not known)."""

    attempt: int
    hosts: tuple[str, ...]
    started_at: float
    host_memory_bytes: Mapping[str, int] = field(default_factory=dict, hash=False)

    @property
    def world_size(self) -> int:
        """The number of ranks of the attempt."""
        return len(self.hosts)


class RankMetrics(SequenceABC):
    """Every rank's metrics of one round, as a read-only sequence: `[r]` is rank r's metrics dict, or
    None for a rank that finished without reporting the round. Each rank's metrics are parsed from the
    JSON it sent when first read, then kept: most observers read rank 0's only, and parsing every rank's
    at every round cost the coordinator more than the rest of a report at thousands of ranks.

    `texts` maps rank -> its metrics' JSON text (absent: None); `size` is the number of ranks."""

    __slots__ = ("_texts", "_size", "_parsed")

    def __init__(self, texts: Mapping[int, str], size: int):
        self._texts = texts
        self._size = size
        self._parsed: dict[int, Optional[dict]] = {}

    def __len__(self) -> int:
        return self._size

    def __getitem__(self, index):
        if isinstance(index, slice):
            return tuple(self[i] for i in range(*index.indices(self._size)))
        if index < 0:
            index += self._size
        if not 0 <= index < self._size:
            raise IndexError(f"rank {index} out of range for {self._size} ranks")
        try:
            return self._parsed[index]
        except KeyError:
            text = self._texts.get(index)
            parsed = self._parsed[index] = None if text is None else json.loads(text)
            return parsed

    def __eq__(self, other) -> bool:
        if isinstance(other, SequenceABC) and not isinstance(other, str):
            return tuple(self) == tuple(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # a sequence compared by content

    def __repr__(self) -> str:
        return f"RankMetrics({list(self)!r})"


@dataclass(frozen=True)
class RoundInfo:
    """A report round every rank answered. `index` counts rounds across attempts and resumes (the
    `report_index` of checkpoints); `metrics_by_rank[r]` is rank r's metrics, or None for a rank that
    finished without reporting this round (a tuple or a `RankMetrics`); `checkpoint` is the checkpoint
    the round committed. `redone`: an earlier attempt of this fit() had already completed a round at
    the same place in the training (this attempt resumed from an older checkpoint, or from none): the
    round repeats work (the goodput ledger's lost_work)."""

    attempt: int
    index: int
    metrics_by_rank: Sequence[Optional[dict]]
    checkpoint: Optional[CheckpointRecord]
    completed_at: float
    redone: bool = False


@dataclass(frozen=True)
class AttemptEnd:
    """An attempt that is over. `failures` lists its failures in the order they were learned (empty
    when it succeeded or was stopped without one) and `root_cause` names the one that caused the
    others (see `minitrain.errors.render_failures`); `exceptions` maps a failed rank to its pickled exception,
    as the worker sent it over the authenticated channel; `restarting` is True when another attempt
    follows."""

    attempt: int
    failures: tuple[WorkerFailure, ...]
    root_cause: str
    restarting: bool
    ended_at: float
    exceptions: Mapping[int, bytes] = field(default_factory=dict)


class RunObserver:
    """Base of the driver-side observers: every method does nothing; override the ones you need.
    Calls come from the controller's thread, in the order listed in the module docstring."""

    def on_run_start(self, run: RunInfo) -> None:
        """The run starts."""

    def on_state(self, previous: RunState, next_state: RunState, reason: str, attempt: int) -> None:
        """The run's state moved from `previous` to `next_state`, for `reason`, during `attempt`."""

    def on_attempt_start(self, attempt: AttemptInfo) -> None:
        """An attempt's ranks were placed and started."""

    def on_report(self, report: ReportRecord) -> None:
        """One rank's report of the current attempt arrived."""

    def on_telemetry(self, sample: TelemetrySample) -> None:
        """A rank of the current attempt sent a telemetry sample."""

    def on_worker_phase(self, attempt: int, rank: int, phase: str) -> None:
        """A rank of the current attempt moved to `phase` (a `records.Phase` name: STARTUP once it
        connected, DIST_INIT during rendezvous, TRAINING, FINISHING)."""

    def on_round(self, round_: RoundInfo) -> None:
        """Every rank answered a report round; its checkpoint, if any, is committed (in memory when its
        files are in the nodes' memory tiers: `on_durable` follows once it is on storage)."""

    def on_durable(self, checkpoint: CheckpointRecord, at: float) -> None:
        """A checkpoint committed in memory is now durable: on storage and in the index, at `at`."""

    def on_attempt_end(self, end: AttemptEnd) -> None:
        """An attempt is over."""

    def on_run_end(self, outcome: RunOutcome) -> None:
        """The run is over (`outcome.state` says how)."""

    def on_resize(self, resize: "Resize") -> None:
        """An elastic run's attempt started at another size than the previous one."""

    def on_stacks(self, dump: StackDump) -> None:
        """A rank's stacks were taken."""


class Observers(RunObserver):
    """The fan-out the controller calls: each observer in turn, each failure logged and contained.

    An observer may implement any subset of `RunObserver`'s methods (a plain object with `on_report`
    is one: the benchmarks' tap); one that kept `RunObserver`'s own no-op is not called at all. The
    fan-out is itself a `RunObserver`: each hook is a method (`observers.on_state(...)`), and
    `report_fan_out` is `on_report` bound once, for the report path that calls it per report."""

    def __init__(self, observers: Sequence[object] = ()):
        self._observers = tuple(observers)
        # Each hook's calls, bound once: a hook no observer has costs one dict lookup.
        self._calls = {name: _fan_out(self._observers, name) for name in _HOOKS}

    @property
    def report_fan_out(self) -> Optional[Callable[[ReportRecord], None]]:
        """`on_report` of every observer that has it, as one callable (None when none has it): the
        lookups are made once, not per report."""
        return self._calls["on_report"]

    def _tell(self, hook: str, *args) -> None:
        calls = self._calls[hook]
        if calls is not None:
            calls(*args)

    def on_run_start(self, run: RunInfo) -> None:
        self._tell("on_run_start", run)

    def on_state(self, previous: RunState, next_state: RunState, reason: str, attempt: int) -> None:
        self._tell("on_state", previous, next_state, reason, attempt)

    def on_attempt_start(self, attempt: AttemptInfo) -> None:
        self._tell("on_attempt_start", attempt)

    def on_report(self, report: ReportRecord) -> None:
        self._tell("on_report", report)

    def on_telemetry(self, sample: TelemetrySample) -> None:
        self._tell("on_telemetry", sample)

    def on_worker_phase(self, attempt: int, rank: int, phase: str) -> None:
        self._tell("on_worker_phase", attempt, rank, phase)

    def on_round(self, round_: RoundInfo) -> None:
        self._tell("on_round", round_)

    def on_durable(self, checkpoint: CheckpointRecord, at: float) -> None:
        self._tell("on_durable", checkpoint, at)

    def on_attempt_end(self, end: AttemptEnd) -> None:
        self._tell("on_attempt_end", end)

    def on_run_end(self, outcome: RunOutcome) -> None:
        self._tell("on_run_end", outcome)

    def on_resize(self, resize: "Resize") -> None:
        self._tell("on_resize", resize)

    def on_stacks(self, dump: StackDump) -> None:
        self._tell("on_stacks", dump)

    def __bool__(self) -> bool:
        return bool(self._observers)


def _fan_out(observers: tuple, hook: str) -> Optional[Callable[..., None]]:
    """`hook(*args)` of every observer that has it, each failure logged and contained, as one callable
    (None when none has it). An observer that kept `RunObserver`'s own no-op is left out."""
    noop = getattr(RunObserver, hook)
    calls = [getattr(o, hook) for o in observers
             if getattr(o, hook, None) is not None and getattr(type(o), hook, None) is not noop]
    if not calls:
        return None

    def tell_each(*args) -> None:
        for call in calls:
            try:
                call(*args)
            except Exception:  # noqa: BLE001 - an observer never breaks the run
                logger.exception("run observer %r failed in %s", getattr(call, "__self__", call), hook)
    return tell_each


_HOOKS = tuple(name for name in vars(RunObserver) if name.startswith("on_"))
