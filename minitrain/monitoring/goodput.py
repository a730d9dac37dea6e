"""The goodput ledger: every worker-second of a run attributed to one named cause, per rank and attempt.

A pure accumulator (no I/O, no clock, no threads): `RunMonitor` feeds it what the controller's observer
hooks tell (and `RunMonitor.from_run_dir` feeds it the same facts back from the run directory), and
`GoodputLedger.snapshot(now)` returns a `Goodput`.

What is counted. Each attempt owns the interval from the end of the attempt before it (the first one:
from the start of the run, or of its wait for hosts) to its own end, times its number of ranks; the
last attempt also owns the tail from its end to the run's end. So the causes sum to wall time x ranks
(the ranks of the attempt that owns each interval: an elastic run's size changes at its attempts).
Within an attempt, rank r's time splits at its own moments, each clamped to lie in order:

    owned from .. attempt start        resource_wait (the run waiting for hosts in the ledger; first
                                       attempt only), startup (the rest before the first attempt),
                                       restarting (later attempts: until the next attempt's workers run)
    attempt start .. DIST_INIT         startup: spawn, imports, connecting, unpickling the function
    DIST_INIT .. TRAINING              dist_init: the process-group init (rendezvous)
    TRAINING .. first report           first_step
    first report .. stop               training: compute, data_wait, collective_wait, report_wait,
                                       lost_work
    stop .. attempt end                stopping: the failure or stop until its processes exited
    (last attempt) end .. run end      stopping

A phase a rank never reached takes no time (its span goes to the next phase it reached). A rank's
stop is the earliest of its FINISHING phase, the attempt's move to RESTARTING or STOPPING, and the
attempt's end.

The training span is split by the rank's telemetry samples: each sample gives, for the steps it
covers, the shares of its step time spent waiting on data, in `minitrain.collective` and in
`report()`, and the rest is compute; each share is weighted by the wall time the sample covers (from
the previous sample, the first from the rank's first report). These are estimates: a wait is measured
exactly, but its share of the span between two samples is extrapolated from the steps that ended in
it. A training span with no sample (telemetry off, or a rank that trained for less than a sample
interval) cannot be split and goes to `unaccounted`, as does anything else not observed: nothing is
dropped, and the causes sum to wall x ranks up to float rounding.

`lost_work` is the time an attempt spent redoing rounds an earlier attempt had already completed (it
resumed from an older checkpoint): from each rank's first report to the completion of the attempt's
last redone round (`RoundInfo.redone`), carved out of its training span in proportion (the other
training causes shrink by the same factor).

`compute` is what counts as productive: the goodput share is compute / (wall x ranks). Time inside
torch.distributed's own collectives (DDP's all-reduce, FSDP's gathers) is not measured by telemetry
yet: it is inside compute.

Memory: the current attempt holds a few floats per rank; a finished attempt is folded into one dict of
seconds per cause for the attempt and the per-rank totals.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional

CAUSES = ("compute", "data_wait", "collective_wait", "report_wait", "lost_work", "startup", "dist_init",
          "first_step", "resource_wait", "restarting", "stopping", "unaccounted")
PRODUCTIVE = "compute"
_TRAINING = ("compute", "data_wait", "collective_wait", "report_wait")  # the causes split from samples
_PHASES = ("STARTUP", "DIST_INIT", "TRAINING", "FINISHING")
LINE_MIN_SHARE = 0.001  # the fit() line names causes above 0.1% of the worker-seconds


def _zero() -> dict[str, float]:
    return dict.fromkeys(CAUSES, 0.0)


@dataclass(frozen=True)
class Goodput:
    """A run's ledger. `total`: worker-seconds by cause (every name of CAUSES); `by_attempt`: one dict
    per attempt, in order, {"attempt", "world_size", "started_at", "ended_at" (None while it runs),
    "seconds": {cause: s}}; `by_rank`: rank -> {cause: s} summed over the attempts the rank was in;
    `worker_seconds`: the sum of the causes (wall x ranks); `wall_s`: the run's wall time, from its
    start (or its wait for hosts) to its end (or to now); `share`: compute / worker_seconds (0.0 when
    nothing was counted)."""

    total: Mapping[str, float]
    by_attempt: tuple
    by_rank: Mapping[int, Mapping[str, float]]
    worker_seconds: float
    wall_s: float
    share: float

    def as_dict(self) -> dict:
        """JSON-able: the fields, `by_rank` as a list of {"rank", "seconds"} in rank order."""
        return {"share": self.share, "worker_seconds": self.worker_seconds, "wall_s": self.wall_s,
                "total": dict(self.total), "by_attempt": [dict(a, seconds=dict(a["seconds"])) for a in self.by_attempt],
                "by_rank": [{"rank": r, "seconds": dict(s)} for r, s in sorted(self.by_rank.items())]}

    @classmethod
    def from_dict(cls, data: dict) -> "Goodput":
        """From `as_dict()`'s form (`RunMonitor.goodput()`)."""
        return cls(total=dict(data["total"]), by_attempt=tuple(data["by_attempt"]),
                   by_rank={int(e["rank"]): dict(e["seconds"]) for e in data["by_rank"]},
                   worker_seconds=data["worker_seconds"], wall_s=data["wall_s"], share=data["share"])

    def line(self) -> str:
        """"goodput 93.1%: compute 93.1%, restarting 4.2%, report_wait 1.5%": the share, then every cause
        above LINE_MIN_SHARE of the worker-seconds, largest first."""
        return line(self.total, self.worker_seconds, self.share)


def line(total: Mapping[str, float], worker_seconds: float, share: float) -> str:
    """`Goodput.line` of these figures (also for `as_dict()`'s form)."""
    if worker_seconds <= 0:
        return "goodput: nothing measured"
    parts = [(seconds / worker_seconds, cause) for cause, seconds in total.items()
             if seconds / worker_seconds > LINE_MIN_SHARE]
    parts.sort(key=lambda item: (-item[0], CAUSES.index(item[1]) if item[1] in CAUSES else 99))
    return f"goodput {share:.1%}: " + ", ".join(f"{cause} {frac:.1%}" for frac, cause in parts)


@dataclass
class _Rank:
    """One rank of the current attempt: its phase times, first report and the sample-weighted training
    shares (wall seconds by cause of the samples after its first)."""

    phases: dict = field(default_factory=dict)  # phase name -> when it was first entered
    first_report: Optional[float] = None
    first_sample: Optional[tuple] = None  # (time, shares) of its first sample with step figures
    last_sample_at: Optional[float] = None
    last_shares: Optional[tuple] = None
    weighted: list = field(default_factory=lambda: [0.0] * len(_TRAINING))


@dataclass
class _Attempt:
    attempt: int
    owned_from: float
    started_at: float
    world_size: int
    first: bool  # the run's first attempt: what comes before it is start-up and resource wait
    ranks: dict = field(default_factory=dict)
    stop_at: Optional[float] = None
    redone_until: Optional[float] = None
    redone_rounds: int = 0
    ended_at: Optional[float] = None


def _shares(step_s, report_s, collective_s, data_s) -> Optional[tuple]:
    """(compute, data, collective, report) shares of one sample's step time; None without a step time."""
    if not step_s or step_s <= 0:
        return None
    waits = [max(w or 0.0, 0.0) / step_s for w in (data_s, collective_s, report_s)]
    busy = sum(waits)
    if busy > 1.0:  # waits measured separately may overlap by a hair: scale them to the step
        waits = [w / busy for w in waits]
        busy = 1.0
    return (1.0 - busy, *waits)


class GoodputLedger:
    """See the module doc. Feed it in the order the hooks come (`run_started` first); every method is
    O(1) but `attempt_ended` and `snapshot`, O(ranks of the attempt). Not thread-safe (the monitor
    holds its lock around it)."""

    def __init__(self) -> None:
        self._run_started: Optional[float] = None
        self._num_workers = 0
        self._wait: Optional[tuple[float, float]] = None  # (since, until) of the wait for hosts
        self._current: Optional[_Attempt] = None
        self._last_end: Optional[float] = None  # the latest attempt's end
        self._last_size = 0
        self._run_ended: Optional[float] = None
        self._total = _zero()
        self._by_attempt: list[dict] = []
        self._by_rank: dict[int, dict[str, float]] = {}

    # ------------------------------------------------------------------ facts

    def run_started(self, at: float, num_workers: int) -> None:
        """The run (fit()) started at `at` with `num_workers` ranks requested; a new run starts a new
        ledger, keeping a wait for hosts already noted."""
        wait = self._wait
        self.__init__()
        self._wait = wait
        self._run_started, self._num_workers = at, num_workers

    def waited(self, since: float, until: float) -> None:
        """The run waited for its hosts from `since` to `until` (before its first attempt)."""
        if until > since:
            self._wait = (since, until)

    @property
    def _origin(self) -> Optional[float]:
        starts = [t for t in (self._run_started, self._wait[0] if self._wait else None) if t is not None]
        return min(starts) if starts else None

    def attempt_started(self, attempt: int, at: float, world_size: int) -> None:
        """An attempt's `world_size` ranks were placed and started at `at`."""
        if self._current is not None:
            self.attempt_ended(self._current.attempt, at)
        first = self._last_end is None and not self._by_attempt
        owned_from = self._last_end if self._last_end is not None else self._origin
        self._current = _Attempt(attempt, at if owned_from is None else min(owned_from, at), at,
                                 max(world_size, 0), first)

    def _of(self, attempt: int) -> Optional[_Attempt]:
        current = self._current
        return current if current is not None and current.attempt == attempt else None

    def _rank(self, attempt: int, rank: int) -> Optional[_Rank]:
        current = self._of(attempt)
        if current is None or rank < 0:
            return None
        track = current.ranks.get(rank)
        if track is None:
            track = current.ranks[rank] = _Rank()
        return track

    def phase(self, attempt: int, rank: int, name: str, at: float) -> None:
        """Rank `rank` of `attempt` entered phase `name` (STARTUP, DIST_INIT, TRAINING, FINISHING) at `at`;
        only the first entry of each counts."""
        track = self._rank(attempt, rank)
        if track is not None and name in _PHASES:
            track.phases.setdefault(name, at)

    def report(self, attempt: int, rank: int, at: float) -> None:
        """Rank `rank` of `attempt` reported at `at` (only its first report counts)."""
        current = self._current
        if current is None or current.attempt != attempt:
            return
        track = current.ranks.get(rank)
        if track is None or track.first_report is None:
            track = self._rank(attempt, rank)
            if track is not None and track.first_report is None:
                track.first_report = at

    def sample(self, attempt: int, rank: int, at: float, step_time_s: Optional[float],
               report_wait_s: Optional[float], collective_wait_s: Optional[float],
               data_wait_s: Optional[float]) -> None:
        """A telemetry sample of rank `rank` of `attempt`, taken at `at` (its fields as
        `TelemetrySample`'s). A sample taken after the rank's stop, when known, is left out."""
        track = self._rank(attempt, rank)
        if track is None:
            return
        stop = self._current.stop_at
        finishing = track.phases.get("FINISHING")
        if (stop is not None and at > stop) or (finishing is not None and at > finishing):
            return
        shares = _shares(step_time_s, report_wait_s, collective_wait_s, data_wait_s)
        if shares is not None:
            if track.first_sample is None:
                track.first_sample = (at, shares)  # weighted from the first report, at the end
            elif track.last_sample_at is not None and at > track.last_sample_at:
                span = at - track.last_sample_at
                for i, share in enumerate(shares):
                    track.weighted[i] += span * share
            track.last_shares = shares
        track.last_sample_at = at if track.last_sample_at is None else max(track.last_sample_at, at)

    def round(self, attempt: int, completed_at: float, redone: bool) -> None:
        """A report round of `attempt` completed at `completed_at`; `redone`: an earlier attempt had
        completed a round at the same position (`RoundInfo.redone`)."""
        current = self._of(attempt)
        if current is not None and redone:
            current.redone_rounds += 1
            current.redone_until = max(current.redone_until or completed_at, completed_at)

    def stopping(self, attempt: int, at: float) -> None:
        """`attempt` is being stopped from `at` (the run moved to RESTARTING or STOPPING); the first
        call counts."""
        current = self._of(attempt)
        if current is not None and current.stop_at is None and at >= current.started_at:
            current.stop_at = at

    def attempt_ended(self, attempt: int, at: float) -> None:
        """`attempt`'s processes are gone at `at`: its seconds are folded into the totals."""
        current = self._of(attempt)
        if current is None:
            return
        current.ended_at = max(at, current.started_at)
        self._fold(current, self._attempt_seconds(current, current.ended_at))
        self._current = None
        self._last_end, self._last_size = current.ended_at, current.world_size

    def run_ended(self, at: float) -> None:
        """The run ended at `at` (an attempt still open ends there)."""
        if self._current is not None:
            self.attempt_ended(self._current.attempt, at)
        self._run_ended = at
        self._fold_tail(at, "stopping", into=(self._total, self._by_rank, self._by_attempt))

    def facts(self, attempt: int) -> Optional[dict]:
        """The current attempt's per-rank facts, JSON-able, for `replay_attempt` (None when `attempt` is
        not the current one): {"attempt", "phases": {name: [time or None per rank]}, "first_report_at":
        [...], "stop_at", "redone_rounds", "redone_until"}."""
        current = self._of(attempt)
        if current is None:
            return None
        size = max([current.world_size, *(r + 1 for r in current.ranks)])
        tracks = [current.ranks.get(r) for r in range(size)]
        return {"attempt": attempt,
                "phases": {name: [t.phases.get(name) if t else None for t in tracks] for name in _PHASES},
                "first_report_at": [t.first_report if t else None for t in tracks],
                "stop_at": current.stop_at, "redone_rounds": current.redone_rounds,
                "redone_until": current.redone_until}

    def replay_attempt(self, facts: dict) -> None:
        """Give the current attempt the facts `facts()` returned for it (a rebuilt run, before its samples)."""
        attempt = facts.get("attempt")
        for name, times in (facts.get("phases") or {}).items():
            for rank, at in enumerate(times or ()):
                if at is not None:
                    self.phase(attempt, rank, name, at)
        for rank, at in enumerate(facts.get("first_report_at") or ()):
            if at is not None:
                self.report(attempt, rank, at)
        if facts.get("stop_at") is not None:
            self.stopping(attempt, facts["stop_at"])
        current = self._of(attempt)
        if current is not None and facts.get("redone_until") is not None:
            current.redone_rounds = int(facts.get("redone_rounds") or 0)
            current.redone_until = facts["redone_until"]

    # ------------------------------------------------------------------ figures

    def _attempt_seconds(self, a: _Attempt, end: float) -> dict[int, dict[str, float]]:
        """Rank -> seconds by cause of attempt `a` over [a.owned_from, end]."""
        end = max(end, a.started_at)
        stop = end if a.stop_at is None else min(max(a.stop_at, a.started_at), end)
        before = a.started_at - a.owned_from
        waited = 0.0
        if a.first and self._wait is not None:  # the part of the wait inside what the attempt owns
            waited = max(0.0, min(self._wait[1], a.started_at) - max(self._wait[0], a.owned_from))
        rows = {}
        for rank in range(max([a.world_size, *(r + 1 for r in a.ranks)])):
            row = _zero()
            if a.first:
                row["resource_wait"] = waited
                row["startup"] = before - waited
            else:
                row["restarting"] = before
            self._split_rank(a, a.ranks.get(rank) or _Rank(), stop, end, row)
            rows[rank] = row
        return rows

    @staticmethod
    def _split_rank(a: _Attempt, track: _Rank, stop: float, end: float, row: dict) -> None:
        finishing = track.phases.get("FINISHING")
        own_stop = stop if finishing is None else max(min(finishing, stop), a.started_at)
        points = [track.phases.get("DIST_INIT"), track.phases.get("TRAINING"), track.first_report]
        for i in range(len(points) - 1, -1, -1):  # a phase never reached ends where the next one starts
            if points[i] is None:
                points[i] = points[i + 1] if i + 1 < len(points) else own_stop
        previous = a.started_at
        for i, at in enumerate(points):
            points[i] = previous = min(max(at, previous), own_stop)
        dist_init, training, first_report = points
        row["startup"] += dist_init - a.started_at
        row["dist_init"] += training - dist_init
        row["first_step"] += first_report - training
        row["stopping"] += end - own_stop
        span = own_stop - first_report
        if span <= 0:
            return
        lost = 0.0
        if a.redone_until is not None:
            lost = min(max(a.redone_until - first_report, 0.0), span)
        row["lost_work"] += lost
        rest = span - lost
        weights = list(track.weighted)
        if track.first_sample is not None:
            first_at, shares = track.first_sample
            for i, share in enumerate(shares):
                weights[i] += max(first_at - first_report, 0.0) * share
        covered = sum(weights)
        if covered <= 0 and track.last_shares is not None:  # samples, but each at the span's very start
            weights, covered = list(track.last_shares), 1.0
        if covered <= 0:
            row["unaccounted"] += rest
            return
        for cause, weight in zip(_TRAINING, weights):
            row[cause] += rest * weight / covered

    def _fold(self, a: _Attempt, rows: dict, into: Optional[tuple] = None) -> None:
        total, by_rank, by_attempt = into or (self._total, self._by_rank, self._by_attempt)
        seconds = _zero()
        for rank, row in rows.items():
            mine = by_rank.setdefault(rank, _zero())
            for cause, value in row.items():
                seconds[cause] += value
                mine[cause] += value
                total[cause] += value
        by_attempt.append({"attempt": a.attempt, "world_size": a.world_size, "started_at": a.started_at,
                           "ended_at": a.ended_at, "seconds": seconds})

    def _fold_tail(self, at: float, cause: str, into: tuple) -> None:
        """The time after the last attempt's end up to `at` (`cause`: stopping once the run ended,
        restarting while the next attempt is awaited), or, with no attempt, the whole run (waiting for
        hosts, then start-up)."""
        total, by_rank, by_attempt = into
        if self._last_end is not None:
            tail = max(at - self._last_end, 0.0)
            if tail > 0:
                for rank in range(self._last_size):
                    by_rank.setdefault(rank, _zero())[cause] += tail
                total[cause] += tail * self._last_size
                if by_attempt:
                    by_attempt[-1]["seconds"][cause] += tail * self._last_size
            return
        origin = self._origin
        if origin is None or self._current is not None:
            return
        span = max(at - origin, 0.0)
        waited = 0.0
        if self._wait is not None:
            waited = max(0.0, min(self._wait[1], at) - max(self._wait[0], origin))
        for rank in range(self._num_workers):
            row = by_rank.setdefault(rank, _zero())
            row["resource_wait"] += waited
            row["startup"] += span - waited
        total["resource_wait"] += waited * self._num_workers
        total["startup"] += (span - waited) * self._num_workers

    def snapshot(self, now: float) -> Goodput:
        """The ledger as of `now` (the run's end once it ended): an attempt still running counts up to
        `now`, stopped there."""
        total = dict(self._total)
        by_rank = {rank: dict(row) for rank, row in self._by_rank.items()}
        by_attempt = [dict(entry, seconds=dict(entry["seconds"])) for entry in self._by_attempt]
        end = self._run_ended if self._run_ended is not None else now
        if self._run_ended is None:
            if self._current is not None:
                current = self._current
                self._fold(current, self._attempt_seconds(current, max(now, current.started_at)),
                           into=(total, by_rank, by_attempt))
            else:
                self._fold_tail(now, "restarting", into=(total, by_rank, by_attempt))
        worker_seconds = sum(total.values())
        origin = self._origin
        wall = max(end - origin, 0.0) if origin is not None else 0.0
        share = total[PRODUCTIVE] / worker_seconds if worker_seconds > 0 else 0.0
        return Goodput(total=total, by_attempt=tuple(by_attempt), by_rank=by_rank,
                       worker_seconds=worker_seconds, wall_s=wall, share=share)


def replay(events: list, samples: list) -> GoodputLedger:
    """The ledger of the last run (fit()) of a run directory, rebuilt from its events.jsonl and
    telemetry.jsonl lines (`RunMonitor`'s forms): the wait for hosts noted just before the run started,
    each attempt's start, its timing facts, its samples (in the order they were written) and
    its end, and the run's end. The facts of an attempt are the "timing" of its "attempt_ended" line;
    an attempt without one (the driver died) counts as one whose ranks never reported: start-up."""
    starts = [i for i, e in enumerate(events) if e.get("kind") == "run_started"]
    first = starts[-1] if starts else 0
    ledger = GoodputLedger()
    for event in reversed(events[:first]):  # the wait for hosts comes before the run's start
        if event.get("kind") == "run_ended":
            break
        if event.get("kind") == "resource_waited":
            ledger.waited(event["since"], event["until"])
            break
    mine = events[first:]
    started_at = mine[0].get("started_at") if starts else None
    timings = {e.get("attempt"): e["timing"] for e in mine
               if e.get("kind") == "attempt_ended" and isinstance(e.get("timing"), dict)}
    by_attempt: dict = {}
    for sample in samples:
        if started_at is None or (sample.get("time") is not None and sample["time"] >= started_at):
            by_attempt.setdefault(sample.get("attempt"), []).append(sample)
    for event in mine:
        kind = event.get("kind")
        if kind == "run_started":
            ledger.run_started(event.get("started_at") or event.get("time"), event.get("num_workers") or 0)
        elif kind == "attempt_started":
            attempt = event.get("attempt", 0)
            ledger.attempt_started(attempt, event.get("started_at") or event.get("time"),
                                   len(event.get("hosts") or ()))
            if attempt in timings:
                ledger.replay_attempt(timings[attempt])
            for s in by_attempt.get(attempt, ()):
                ledger.sample(attempt, s.get("rank", 0), s["time"], s.get("step_time_s"), s.get("report_wait_s"),
                              s.get("collective_wait_s"), s.get("data_wait_s"))
        elif kind == "attempt_ended":
            ledger.attempt_ended(event.get("attempt", 0), event.get("ended_at") or event.get("time"))
        elif kind == "run_ended":
            ledger.run_ended(event.get("ended_at") or event.get("time"))
    return ledger
