"""`RunMonitor`: the driver's one in-memory record of what a run shows (console, dashboard, Result).

It is a `RunObserver`: the controller's thread feeds it (run and attempt starts and ends, every move
of the run's state, rank-0 report rounds, checkpoints, every rank's telemetry); the console and the
dashboard's threads read it. Every public method returns plain JSON-able dicts and lists, copies made
under one lock; each method's docstring gives its form. The run's state is the controller's, as
`on_state` told it (never derived here); it is shown as `run_state.ray_status` words.

History is bounded: the last SAMPLES_PER_RANK telemetry samples of each rank (about half an hour at
one a second), fewer with many ranks so that all of them hold at most MAX_SAMPLES (a sample takes
about 0.7 KiB: 2000 a rank would be 5.6 GiB at 4096 ranks; see `samples_per_rank`), and the last
MAX_REPORTS rank-0 reports; the full history is in the run directory.

Files (names in `minitrain.storage.layout`), appended through the run's `Storage` by a thread of
the monitor's own (`jsonl_files.JsonlAppender`), at most every `jsonl_files.FLUSH_S` and when the run ends:
- `telemetry.jsonl`: one sample dict a line (`samples()`' form);
- `events.jsonl`: one dict a line, {"time", "kind", ...}: kind "run_started" (the `run()` fields
  but the state), "state_changed" ({"previous", "next", "reason", "attempt"}), "attempt_started" /
  "attempt_ended" (the `attempts()` fields), "checkpoint_committed" (the `checkpoints()` fields),
  "checkpoint_durable" ({"dir", "index", "durable_at"}: the checkpoint is on storage and in the index),
  "straggler" (the `stragglers()` fields and "cleared": bool), "resize" (an elastic run's, the
  `resizes()` fields), "run_ended" ({"state", "ended_at"}), "resource_waited" ({"since", "until"}:
  the wait for hosts before the run started); "attempt_ended" also holds "timing", the goodput
  ledger's per-rank facts of the attempt (`GoodputLedger.facts`' form, for `goodput.replay`);
  states as `run()` shows them.
A write that fails is logged once and the monitor goes on in memory: watching never breaks the run.
`RunMonitor.from_run_dir(storage)` rebuilds the same read API from those files, metrics.jsonl and
the checkpoint index, for a finished (or running) run.

Stragglers are judged on every telemetry sample by `minitrain.monitoring.stragglers` (on each
rank's own work: step time minus its report and collective waits, "work_time_s" in the samples);
one warning is logged when a rank starts straggling and one when it stops.

Steps/s counts rank-0 report rounds: while the run lasts, the rounds of the current attempt that
completed in the last RATE_WINDOW_S seconds (stretched back to the last round before them, so slow
steps still show) over the time from there to now, None while that span is under MIN_RATE_SPAN_S
(rounds may complete in bursts: the driver commits several at once when a late rank catches up);
once the run has ended, the rounds of this run over its whole duration.
"""

from __future__ import annotations

import bisect
import json
import logging
import statistics
import threading
import time
from collections import deque
from typing import Any, Callable, Iterable, Optional

from minitrain.monitoring import diagnoses, goodput
from minitrain.monitoring.goodput import GoodputLedger
from minitrain.monitoring.jsonl_files import JsonlAppender, read_jsonl
from minitrain.coordinator.observers import (
    AttemptEnd, AttemptInfo, RoundInfo, RunInfo, RunObserver, TelemetrySample,
)
from minitrain.monitoring.stragglers import StragglerDetector, StragglerRule, work_time
from minitrain.records import ReportRecord, RunOutcome
from minitrain.errors import root_cause
from minitrain.run_state import RunState, from_ray_status, ray_status
from minitrain.storage.layout import EVENTS_NAME, INDEX_NAME, METRICS_NAME, TELEMETRY_NAME, split_metrics_lines

logger = logging.getLogger("minitrain")

SAMPLES_PER_RANK = 2000
MAX_SAMPLES = 400_000  # every rank's together: about 300 MiB
MIN_SAMPLES_PER_RANK = 60  # a minute of history per rank, however many ranks
MAX_REPORTS = 10000
RATE_WINDOW_S = 30.0  # live steps/s: over the rounds of about the last this many seconds
MIN_RATE_SPAN_S = 2.0  # ... and never over less (no rate from a near-zero interval)
MAX_RATE_ROUNDS = 100_000  # round times kept for it (a bound on memory for very fast steps)
# The live goodput ledger is recomputed at most every this many seconds, and every RANKS_PER_GOODPUT_S
# ranks add one: a snapshot costs about 20 us per rank of the current attempt under the monitor's lock
# (80 ms at 4,096 ranks), which the controller's thread waits for; the dashboard asks every 2 s.
GOODPUT_REFRESH_S = 1.0
RANKS_PER_GOODPUT_S = 1024
_RANK_KEYS = ("rank", "host", "pid", "phase", "step_time_s", "report_wait_s", "collective_wait_s",
              "data_wait_s", "work_time_s", "cpu_percent", "rss_bytes", "gpus")


def samples_per_rank(num_workers: int) -> int:
    """How many samples of each rank the monitor keeps: SAMPLES_PER_RANK, or MAX_SAMPLES shared by
    `num_workers` ranks when that is fewer (at least MIN_SAMPLES_PER_RANK)."""
    return max(MIN_SAMPLES_PER_RANK, min(SAMPLES_PER_RANK, MAX_SAMPLES // max(1, num_workers)))


def sample_dict(sample: TelemetrySample) -> dict:
    """A telemetry sample as `samples()` returns it and telemetry.jsonl stores it; "work_time_s" is
    the rank's own work per step (`stragglers.work_time`: step time minus report and collective
    waits)."""
    return {
        "time": sample.time, "attempt": sample.attempt, "rank": sample.rank, "host": sample.host,
        "pid": sample.pid, "phase": sample.phase, "reports": sample.reports, "step_time_s": sample.step_time_s,
        "report_wait_s": sample.report_wait_s, "collective_wait_s": sample.collective_wait_s,
        "data_wait_s": sample.data_wait_s,
        "work_time_s": work_time(sample.step_time_s, sample.report_wait_s, sample.collective_wait_s),
        "cpu_percent": sample.cpu_percent, "rss_bytes": sample.rss_bytes,
        "gpus": [{"index": g.index, "util_percent": g.util_percent, "memory_used_bytes": g.memory_used_bytes,
                  "memory_total_bytes": g.memory_total_bytes} for g in sample.gpus],
        "total": sample.total,
    }


class RunMonitor(RunObserver):
    """See the module doc. `storage`: the run directory's Storage (None: in memory only);
    `kept_dir_names`: returns the kept checkpoints' directory names (asked on the controller's thread
    after each commit); `rule`: the straggler rule (default: from the environment)."""

    def __init__(self, storage: Any = None, kept_dir_names: Optional[Callable[[], Iterable[str]]] = None,
                 rule: Optional[StragglerRule] = None, clock: Callable[[], float] = time.time):
        self._lock = threading.RLock()
        self._clock = clock
        self._writer = JsonlAppender(storage)
        self._kept_dir_names = kept_dir_names
        self._detector = StragglerDetector(rule or StragglerRule.from_env())
        self._run: dict = {"run_id": "", "name": "", "run_path": "", "started_at": None, "ended_at": None,
                           "attempt": 0, "num_workers": 0}
        self._waiting: Optional[str] = None  # what the run waits for before it starts (note_waiting)
        self._state = RunState.PENDING  # the controller's, as on_state told it
        self._state_since: Optional[float] = None  # when the run moved to it
        self._state_reason = ""  # why (the controller's words: "starting node agents")
        self._worker_phases: dict[int, tuple[str, float]] = {}  # rank -> (phase, since), current attempt
        self._attempts: list[dict] = []
        self._checkpoints: list[dict] = []
        self._reports: deque = deque(maxlen=MAX_REPORTS)
        self._round_times: deque = deque(maxlen=MAX_RATE_ROUNDS)  # completions, current attempt
        self._rounds_done = 0  # run-wide index of the last round + 1 (a resumed run's included)
        self._rounds_seen = 0  # rounds completed in this run (this fit())
        self._total: Optional[int] = None
        self._samples: dict[int, deque] = {}
        self._per_rank = SAMPLES_PER_RANK  # set by on_run_start from the number of ranks
        self._latest: dict[int, dict] = {}  # rank -> its latest sample of the current attempt
        # rank -> the time of its first sample with a report in the current attempt: where its memory
        # warm-up starts (diagnoses.memory_hint), kept apart because the bounded history drops it.
        self._first_step_at: dict[int, float] = {}
        self._report_counts: dict[int, int] = {}
        self._last_report_at: dict[int, float] = {}
        self._straggler_log: list[dict] = []  # every straggler episode of the run, for Result
        self._resizes: list[dict] = []  # an elastic run's resizes, for Result and the dashboard
        # rank -> its open episode (in _straggler_log) while the detector flags it: exactly the
        # detector's flagged ranks; their figures are brought up to date when read.
        self._open_episodes: dict[int, dict] = {}
        # Every worker-second by cause (`goodput()`); the wait for hosts is timed here (note_waiting).
        self._ledger = GoodputLedger()
        self._waiting_since: Optional[float] = None
        self._goodput: Optional[tuple[float, bool, dict]] = None  # (when, after the run's end, goodput())

    # ------------------------------------------------------------------ observer side

    def on_run_start(self, run: RunInfo) -> None:
        with self._lock:
            self._run.update(run_id=run.run_id, name=run.experiment_name, run_path=run.run_path,
                             started_at=run.started_at, num_workers=run.num_workers)
            self._per_rank = samples_per_rank(run.num_workers)
            self._ledger.run_started(run.started_at, run.num_workers)
            entry = dict(self._run)
        self._event("run_started", run.started_at, entry)

    def note_waiting(self, text: Optional[str]) -> None:
        """What the run waits for before it starts (`minitrain.hosts.reserve`'s line), or None once it got
        it: `run()["waiting"]`, which the dashboard shows."""
        now = self._clock()
        waited = None
        with self._lock:
            self._waiting = text
            if text is not None and self._waiting_since is None:
                self._waiting_since = now
            elif text is None and self._waiting_since is not None:
                waited, self._waiting_since = {"since": self._waiting_since, "until": now}, None
                self._ledger.waited(waited["since"], waited["until"])
        if waited is not None:
            self._event("resource_waited", now, waited)

    def on_state(self, previous: RunState, next_state: RunState, reason: str, attempt: int) -> None:
        now = self._clock()
        with self._lock:
            self._state = next_state
            self._state_since, self._state_reason = now, reason
            if next_state in (RunState.RESTARTING, RunState.STOPPING):
                self._ledger.stopping(attempt, now)
        self._event("state_changed", now, {"previous": ray_status(previous), "next": ray_status(next_state),
                                           "reason": reason, "attempt": attempt})

    def on_attempt_start(self, attempt: AttemptInfo) -> None:
        with self._lock:
            self._run.update(attempt=attempt.attempt)
            record = {"attempt": attempt.attempt, "started_at": attempt.started_at, "ended_at": None,
                      "hosts": list(attempt.hosts), "host_memory_bytes": dict(attempt.host_memory_bytes),
                      "failures": [], "root_cause": "", "restarting": False}
            self._attempts.append(record)
            self._ledger.attempt_started(attempt.attempt, attempt.started_at, attempt.world_size)
            self._latest.clear()
            self._first_step_at.clear()
            self._worker_phases.clear()
            self._report_counts.clear()
            self._last_report_at.clear()
            self._round_times.clear()  # the rate restarts with the attempt: the gap is no step
            self._forget_stragglers()
        self._event("attempt_started", attempt.started_at, dict(record))

    def on_resize(self, resize: Any) -> None:
        """An elastic run's attempt started at another size (`coordinator.elastic.Resize`)."""
        fields = resize.as_dict()
        with self._lock:
            self._resizes.append(fields)
        self._event("resize", resize.time, dict(fields))

    def on_report(self, report: ReportRecord) -> None:
        with self._lock:
            count = self._report_counts[report.rank] = self._report_counts.get(report.rank, 0) + 1
            now = self._last_report_at[report.rank] = self._clock()
            if count == 1:
                self._ledger.report(report.attempt, report.rank, now)

    def on_worker_phase(self, attempt: int, rank: int, phase: str) -> None:
        now = self._clock()
        with self._lock:
            current = self._attempts[-1] if self._attempts else None
            if current is not None and current["attempt"] == attempt:
                self._worker_phases[rank] = (phase, now)
                self._ledger.phase(attempt, rank, phase, now)

    def on_telemetry(self, sample: TelemetrySample) -> None:
        entry = sample_dict(sample)
        started = cleared = ()
        with self._lock:
            samples = self._samples.get(sample.rank)
            if samples is None:
                samples = self._samples[sample.rank] = deque(maxlen=self._per_rank)
            samples.append(entry)
            current = self._attempts[-1] if self._attempts else None
            # A late sample of an attempt that is over is history only (a straggler episode opened now
            # would never be closed, and the ranks' rows belong to the next attempt).
            if current is None or (current["attempt"] == sample.attempt and current["ended_at"] is None):
                self._latest[sample.rank] = entry
                self._ledger.sample(sample.attempt, sample.rank, sample.time, sample.step_time_s,
                                    sample.report_wait_s, sample.collective_wait_s, sample.data_wait_s)
                if sample.reports and sample.rank not in self._first_step_at:
                    self._first_step_at[sample.rank] = sample.time
                if sample.total is not None and (sample.rank == 0 or self._total is None):
                    self._total = sample.total
                self._detector.add(sample.rank, sample.host, sample.step_time_s, sample.data_wait_s,
                                   sample.report_wait_s, sample.collective_wait_s)
                started, cleared = self._detector.evaluate(sample.time)
                for straggler in started:
                    episode = dict(straggler.as_dict(), attempt=sample.attempt, until=None)
                    self._straggler_log.append(episode)
                    self._open_episodes[straggler.rank] = episode
                for straggler in cleared:  # its figures as of the last sample that flagged it
                    episode = self._open_episodes.pop(straggler.rank)
                    episode.update(straggler.as_dict(), since=episode["since"], until=sample.time)
        self._writer.add(TELEMETRY_NAME, entry)
        for straggler in started:
            logger.warning("rank %d on %s is a straggler: its step time %.3g s (waits for other ranks excluded) "
                           "is %.2fx the other ranks' median (%.3g s); cause: %s", straggler.rank, straggler.host,
                           straggler.step_time_s,
                           straggler.slower_by, straggler.median_step_time_s, straggler.cause)
            self._event("straggler", sample.time, dict(straggler.as_dict(), cleared=False))
        for straggler in cleared:
            logger.warning("rank %d on %s is no longer a straggler", straggler.rank, straggler.host)
            self._event("straggler", sample.time, dict(straggler.as_dict(), cleared=True))

    def _refresh_open_episodes(self) -> None:
        """Give each open episode of the current attempt its straggler's latest figures. (They are
        copied when read, not at every sample: the detector keeps them, and copying each open
        episode's figures at every sample cost O(stragglers) per sample.) Caller holds the lock."""
        flagged = self._detector.flagged
        for rank, episode in self._open_episodes.items():
            episode.update(flagged[rank].as_dict(), since=episode["since"])

    def _update_episode(self, fields: dict, rank: Optional[int] = None) -> None:
        """Replay: update the latest open episode of `rank` (default: fields["rank"])."""
        rank = fields["rank"] if rank is None else rank
        for episode in reversed(self._straggler_log):
            if episode["rank"] == rank and episode["until"] is None:
                episode.update(fields, since=episode["since"])
                return

    def on_round(self, round_: RoundInfo) -> None:
        kept = None
        if round_.checkpoint is not None and self._kept_dir_names is not None:
            try:
                kept = set(self._kept_dir_names())
            except Exception:  # noqa: BLE001 - the kept flags are a view; they must not break the run
                kept = None
        with self._lock:
            self._rounds_done = max(self._rounds_done, round_.index + 1)
            self._rounds_seen += 1
            self._add_round_time(round_.completed_at)
            self._ledger.round(round_.attempt, round_.completed_at, getattr(round_, "redone", False))
            metrics = round_.metrics_by_rank[0] if round_.metrics_by_rank else None
            if metrics is not None:
                self._reports.append({"index": round_.index, "attempt": round_.attempt,
                                      "time": round_.completed_at, "metrics": metrics})
            record = None
            if round_.checkpoint is not None:
                c = round_.checkpoint
                record = {"dir": c.dir_name, "index": c.report_index, "attempt": c.attempt, "metrics": c.metrics,
                          "committed_at": c.committed_at or round_.completed_at, "durable_at": None, "kept": True}
                self._checkpoints.append(record)
                if kept is not None:
                    for entry in self._checkpoints:
                        entry["kept"] = entry["dir"] in kept
        if record is not None:
            self._event("checkpoint_committed", record["committed_at"], dict(record))

    def on_durable(self, checkpoint, at: float) -> None:
        fields = {"dir": checkpoint.dir_name, "index": checkpoint.report_index, "durable_at": at}
        with self._lock:
            self._mark_durable(fields)
        self._event("checkpoint_durable", at, fields)

    def _mark_durable(self, fields: dict) -> None:
        for entry in reversed(self._checkpoints):
            if entry.get("dir") == fields.get("dir") and entry.get("index") == fields.get("index"):
                entry["durable_at"] = fields.get("durable_at")
                return

    def on_attempt_end(self, end: AttemptEnd) -> None:
        failures = [{"rank": f.rank, "host": f.node, "kind": f.kind.value,
                     "exc_type": f.exc_type, "message": f.message, "consequence": bool(f.consequence)}
                    for f in end.failures]
        with self._lock:
            record = self._attempt(end.attempt)
            if record is None:
                return
            root = None
            if end.failures:  # the root cause as the end-of-run summary groups it (by host)
                cause = root_cause(list(end.failures))
                root = {"host": cause.node, "rank": cause.rank, "phase": cause.phase.name, "cause": cause.cause}
            record.update(ended_at=end.ended_at, failures=failures, root_cause=end.root_cause,
                          restarting=end.restarting, root=root)
            timing = self._ledger.facts(end.attempt)
            self._ledger.attempt_ended(end.attempt, end.ended_at)
            self._refresh_open_episodes()
            closing = []
            for episode in self._straggler_log:
                if episode["attempt"] == end.attempt and episode["until"] is None:
                    episode["until"] = end.ended_at
                    closing.append({k: v for k, v in episode.items() if k not in ("attempt", "until")})
            self._forget_stragglers()
            entry = dict(record)
        for fields in closing:  # the episode's last figures, so that a post-hoc view shows the same
            self._event("straggler", end.ended_at, dict(fields, cleared=True))
        if timing is not None:  # in the file only: what `goodput.replay` needs, not an `attempts()` field
            entry["timing"] = timing
        self._event("attempt_ended", end.ended_at, entry)

    def on_run_end(self, outcome: RunOutcome) -> None:
        now = self._clock()
        with self._lock:
            self._run.update(ended_at=now)
            self._ledger.run_ended(now)
            state = ray_status(self._state)
        self._event("run_ended", now, {"state": state, "ended_at": now})
        self._writer.close()

    def _forget_stragglers(self) -> None:
        """A new attempt, or the end of one: the detector starts over; an episode still open keeps
        its last figures. Caller holds the lock."""
        self._refresh_open_episodes()
        self._open_episodes.clear()
        self._detector.reset()

    def _add_round_time(self, completed_at: float) -> None:
        times = self._round_times
        times.append(completed_at)
        while len(times) > 2 and times[1] <= completed_at - RATE_WINDOW_S:
            times.popleft()  # keeps the last round before the window

    def _event(self, kind: str, when: float, fields: dict) -> None:
        self._writer.add(EVENTS_NAME, {"time": when, "kind": kind, **fields})

    def _attempt(self, attempt: int) -> Optional[dict]:
        for record in reversed(self._attempts):
            if record["attempt"] == attempt:
                return record
        return None

    # ------------------------------------------------------------------ read side

    def run(self) -> dict:
        """{"run_id", "name", "run_path", "state", "started_at", "ended_at", "attempt", "num_workers", "waiting",
        "total", "progress", "eta_s", "steps_per_s", "rounds", "state_since", "state_reason"}; state is the controller's run state as
        `run_state.ray_status` words it (PENDING, LAUNCHING, STARTING, RUNNING, RESTARTING, STOPPING,
        FINISHED, ERRORED or ABORTED); steps_per_s as the module doc says, None when not known."""
        now = self._clock()
        with self._lock:
            info = dict(self._run, state=ray_status(self._state), state_since=self._state_since,
                        state_reason=self._state_reason, waiting=self._waiting)
            rate = self._steps_per_s(now)
            total = self._total
            progress = eta = None
            if total:
                progress = min(self._rounds_done / total, 1.0)
                if rate:
                    eta = max(total - self._rounds_done, 0) / rate
            info.update(total=total, progress=progress, eta_s=eta, steps_per_s=rate,
                        rounds=self._rounds_done)
            return info

    def _steps_per_s(self, now: float) -> Optional[float]:
        started, ended = self._run.get("started_at"), self._run.get("ended_at")
        if ended is not None:  # the run is over: its rounds over its whole duration
            if started is None or not self._rounds_seen or ended - started <= 0:
                return None
            return self._rounds_seen / (ended - started)
        times = list(self._round_times)
        if len(times) < 2:
            return None
        # From the last round at or before the window's start (else the attempt's first round kept).
        origin = max(bisect.bisect_right(times, now - RATE_WINDOW_S) - 1, 0)
        span = now - times[origin]
        if span < MIN_RATE_SPAN_S:
            return None
        return (len(times) - 1 - origin) / span

    def attempts(self) -> list[dict]:
        """One dict per attempt: {"attempt", "started_at", "ended_at", "hosts", "host_memory_bytes" ({host:
        its total memory}; absent in runs written before it existed), "failures": [{"rank", "host", "kind",
        "exc_type", "message", "consequence"}], "root_cause", "restarting", "root" ({"host", "rank", "phase",
        "cause"} of a failed attempt's root cause, as the end-of-run summary groups it; None otherwise)}."""
        with self._lock:
            return json.loads(json.dumps(self._attempts, default=str))

    def checkpoints(self) -> list[dict]:
        """Committed checkpoints in commit order: {"dir", "index", "attempt", "metrics",
        "committed_at", "durable_at", "kept"} (`committed_at`: committed, in memory when the files went
        through the nodes' memory tiers; `durable_at`: on storage and in the index, None until then)."""
        with self._lock:
            return json.loads(json.dumps(self._checkpoints, default=str))

    def reports(self) -> list[dict]:
        """Rank-0 metric reports in order (the last MAX_REPORTS): {"index", "attempt", "time", "metrics"}."""
        with self._lock:
            return json.loads(json.dumps(list(self._reports), default=str))

    def ranks(self) -> list[dict]:
        """The latest of each rank of the current attempt: {"rank", "host", "pid", "phase",
        "step_time_s", "report_wait_s", "collective_wait_s", "data_wait_s", "work_time_s",
        "cpu_percent", "rss_bytes", "gpus", "reports", "last_report_age_s", "straggler"}; null where
        not measured. Once the attempt has ended, "phase" is ENDED (FAILED for a rank that failed) and
        "last_report_age_s" is counted to the attempt's end; once the run has ended, "straggler" stays
        true for a rank that was one in the last attempt (what the live page showed last)."""
        now = self._clock()
        with self._lock:
            current = self._attempts[-1] if self._attempts else {}
            hosts = current.get("hosts") or []
            ended_at = current.get("ended_at")
            failed = {f.get("rank") for f in current.get("failures") or () if not f.get("consequence")}
            flagged = set(self._detector.flagged)
            if self._run.get("ended_at") is not None:
                flagged |= {e["rank"] for e in self._straggler_log if e.get("attempt") == current.get("attempt")}
            rows = []
            for rank in range(max(len(hosts), max(self._latest, default=-1) + 1)):
                latest = self._latest.get(rank, {})
                row = {key: latest.get(key) for key in _RANK_KEYS}
                row["rank"] = rank
                if row["work_time_s"] is None:  # a sample written before the field existed
                    row["work_time_s"] = work_time(row["step_time_s"], row["report_wait_s"],
                                                   row["collective_wait_s"])
                row["host"] = row["host"] or (hosts[rank] if rank < len(hosts) else "")
                if rank in self._worker_phases and not latest:
                    row["phase"] = self._worker_phases[rank][0]
                if ended_at is not None:
                    row["phase"] = "FAILED" if rank in failed else "ENDED"
                row["gpus"] = json.loads(json.dumps(latest.get("gpus") or []))
                row["reports"] = self._report_counts.get(rank, latest.get("reports") or 0)
                last = self._last_report_at.get(rank)
                row["last_report_age_s"] = None if last is None else max((ended_at or now) - last, 0.0)
                row["straggler"] = rank in flagged
                rows.append(row)
            return rows

    def nodes(self) -> list[dict]:
        """The current attempt's hosts, by name: [{"host", "memory_bytes"}] (the host's total memory,
        as its node agent said; the memory plots are drawn against it). [] before the first attempt."""
        with self._lock:
            current = self._attempts[-1] if self._attempts else {}
            memory = current.get("host_memory_bytes") or {}
            return [{"host": host, "memory_bytes": memory[host]} for host in sorted(memory)]

    def samples(self, rank: Optional[int] = None, since: Optional[float] = None) -> list[dict]:
        """Telemetry history (bounded), oldest first, of one rank or all; only samples after `since`."""
        with self._lock:
            pools = [self._samples.get(rank, ())] if rank is not None else list(self._samples.values())
            chosen = [s for pool in pools for s in pool if since is None or s["time"] > since]
            chosen.sort(key=lambda s: (s["time"], s["rank"]))
            return json.loads(json.dumps(chosen))

    def hints(self) -> list[dict]:
        """`diagnoses.hints` of the current attempt's recent samples (and when each rank's steps began):
        [{"kind", "ranks", "message"}]."""
        with self._lock:
            attempt = self._run.get("attempt")
            recent = [s for pool in self._samples.values() for s in list(pool)[-diagnoses.MEMORY_WINDOW:]]
            return diagnoses.hints(recent, attempt, dict(self._first_step_at))

    def stragglers(self) -> list[dict]:
        """The current stragglers: {"rank", "host", "slower_by", "step_time_s",
        "median_step_time_s", "cause", "since"}."""
        with self._lock:
            return [s.as_dict() for _, s in sorted(self._detector.flagged.items())]

    def straggler_history(self) -> list[dict]:
        """Every straggler episode of the run, in order: the `stragglers()` fields (latest figures)
        plus "attempt" and "until" (None while it lasts)."""
        with self._lock:
            self._refresh_open_episodes()
            return [dict(episode) for episode in self._straggler_log]

    def goodput(self) -> dict:
        """The goodput ledger (`minitrain.monitoring.goodput`) as of now, or of the run's end once it
        ended: `Goodput.as_dict()`'s form, {"share", "worker_seconds", "wall_s", "total": {cause: s},
        "by_attempt": [{"attempt", "world_size", "started_at", "ended_at", "seconds"}], "by_rank":
        [{"rank", "seconds"}]}. While the run lasts it is recomputed at most every GOODPUT_REFRESH_S
        (more with many ranks: see RANKS_PER_GOODPUT_S); once the run ended it is final."""
        now = self._clock()
        with self._lock:
            ended = self._run.get("ended_at") is not None
            refresh_s = max(GOODPUT_REFRESH_S, (self._run.get("num_workers") or 0) / RANKS_PER_GOODPUT_S)
            cached = self._goodput
            if cached is None or (not cached[1] and (ended or now - cached[0] >= refresh_s)):
                cached = self._goodput = (now, ended, self._ledger.snapshot(now).as_dict())
            return json.loads(json.dumps(cached[2]))

    def resizes(self) -> list[dict]:
        """An elastic run's resizes, in order: {"attempt", "from_workers", "to_workers", "reason", "time"}."""
        with self._lock:
            return [dict(resize) for resize in self._resizes]

    # ------------------------------------------------------------------ post hoc

    @classmethod
    def from_run_dir(cls, storage: Any) -> "RunMonitor":
        """A monitor rebuilt from a run directory's events.jsonl, telemetry.jsonl, metrics.jsonl and
        checkpoint index (a torn last line is ignored). Writes nothing."""
        monitor = cls(storage=None, rule=StragglerRule())
        events = read_jsonl(storage, EVENTS_NAME)
        samples = read_jsonl(storage, TELEMETRY_NAME)
        with monitor._lock:
            for event in events:
                monitor._replay(event)
            current = monitor._run["attempt"]
            # A resumed run's directory holds every run (fit()) in turn, each numbering its attempts
            # from 0: the current attempt's figures are those since the last run started.
            started = monitor._run.get("started_at")

            def this_run(entry: dict) -> bool:
                return started is None or (entry.get("time") is not None and entry["time"] >= started)

            per_rank = samples_per_rank(monitor._run.get("num_workers") or 1)
            for entry in samples:
                monitor._samples.setdefault(entry.get("rank", 0), deque(maxlen=per_rank)).append(entry)
                if entry.get("attempt") == current and this_run(entry):
                    monitor._latest[entry.get("rank", 0)] = entry
                    if entry.get("reports") and entry.get("time") is not None:
                        monitor._first_step_at.setdefault(entry.get("rank", 0), entry["time"])
                if entry.get("total"):
                    monitor._total = entry["total"]
            if storage.exists(METRICS_NAME):
                for entry in split_metrics_lines(storage.read_text(METRICS_NAME))[0]:
                    monitor._reports.append({"index": entry.get("report_index"), "attempt": entry.get("attempt"),
                                             "time": entry.get("time"), "metrics": entry["metrics"]})
                    monitor._rounds_done = max(monitor._rounds_done, (entry.get("report_index") or 0) + 1)
                    if this_run(entry):
                        monitor._rounds_seen += 1
                        if entry.get("attempt") == current and entry.get("time") is not None:
                            monitor._add_round_time(entry["time"])
                            monitor._replay_round(entry["time"])
            monitor._ledger = goodput.replay(events, samples)
            kept = _kept_in_index(storage)
            if kept is not None:
                for record in monitor._checkpoints:
                    record["kept"] = record["dir"] in kept
        return monitor

    def _replay_round(self, when: float) -> None:
        """Replay: every rank of the current attempt reported a round at `when` (rounds are
        committed only once every rank reported them)."""
        hosts = (self._attempts[-1].get("hosts") or []) if self._attempts else []
        for rank in range(len(hosts)):
            self._report_counts[rank] = self._report_counts.get(rank, 0) + 1
            self._last_report_at[rank] = when

    def _replay(self, event: dict) -> None:
        kind = event.get("kind")
        fields = {k: v for k, v in event.items() if k not in ("time", "kind")}
        if kind == "run_started":
            self._run.update({k: v for k, v in fields.items() if k in self._run})
            self._state = RunState.PENDING  # a resumed run's directory holds each fit() in turn
        elif kind == "state_changed":
            self._state = from_ray_status(fields.get("next")) or self._state
            self._state_since, self._state_reason = event.get("time"), fields.get("reason") or ""
        elif kind == "attempt_started":
            self._attempts.append(fields)
            self._run.update(attempt=fields.get("attempt", 0))
            self._latest.clear()
            self._report_counts.clear()
            self._last_report_at.clear()
        elif kind == "attempt_ended":
            fields.pop("timing", None)  # the goodput ledger's (goodput.replay), no attempts() field
            record = self._attempt(fields.get("attempt"))
            if record is not None:
                record.update(fields)
            for episode in self._straggler_log:  # as on_attempt_end (runs written before it said so)
                if episode["attempt"] == fields.get("attempt") and episode["until"] is None:
                    episode["until"] = fields.get("ended_at")
        elif kind == "checkpoint_committed":
            self._checkpoints.append(fields)
        elif kind == "checkpoint_durable":
            self._mark_durable(fields)
        elif kind == "resize":
            self._resizes.append(fields)
        elif kind == "straggler":
            cleared = fields.pop("cleared", False)
            if cleared:
                self._update_episode(dict(fields, until=event.get("time")), rank=fields.get("rank"))
            else:
                self._straggler_log.append(dict(fields, attempt=self._run["attempt"], until=None))
        elif kind == "run_ended":
            self._state = from_ray_status(fields.get("state")) or self._state
            self._run.update(ended_at=fields.get("ended_at"))


def _kept_in_index(storage: Any) -> Optional[set]:
    """The checkpoint directories the run's index keeps, or None when it cannot be read."""
    try:
        data = json.loads(storage.read_text(INDEX_NAME))
        return {record["checkpoint_dir_name"] for record in data["checkpoint_results"]}
    except Exception:  # noqa: BLE001 - a view of an unreadable index shows every checkpoint as kept
        return None


def step_time_summary(ranks: list[dict]) -> Optional[dict]:
    """{"min", "median", "max", "slowest_rank"} of the ranks' work times per step (step time minus the
    time waiting for the others, as the straggler rule judges: a rank blocked at a checkpoint round
    for a slow peer is not the slowest), or None when none is known."""
    known = []
    for r in ranks:
        work = r.get("work_time_s")
        if work is None:
            work = work_time(r.get("step_time_s"), r.get("report_wait_s"), r.get("collective_wait_s"))
        if work is not None:
            known.append((work, r["rank"]))
    if not known:
        return None
    times = [t for t, _ in known]
    return {"min": min(times), "median": statistics.median(times), "max": max(times),
            "slowest_rank": max(known)[1]}
