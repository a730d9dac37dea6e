"""Plain-words diagnoses of a run, from the monitor's views: what start-up is doing, and the hints
the console and the dashboard show when memory climbs or the data pipeline does not keep up.

Pure functions of the monitor's `run()`, `ranks()` and `samples()` dicts (live or rebuilt from the
run directory), so the console, the page and the tests all read the same words.

- `startup_status`: until the first step (report round), the phase the run is in and how long it
  has taken: "starting node agents", "spawning workers (importing torch and your script)",
  "rendezvous (process-group init)", "waiting for the first step (report())".
- `memory_hint`: a rank whose resident memory climbs steadily after start-up, faster than the
  other ranks': "memory climbs steadily across epochs on rank(s) ...: likely a leak (tensors kept
  across steps)". Each rank is judged on its samples after its first MEMORY_WARMUP_S of steps (the
  growth of start-up, on every rank, is no leak), the last MEMORY_WINDOW of them, at least
  MEMORY_MIN_SAMPLES. Its RSS climbs steadily when the medians of the four quarters of those
  samples each rise (so a one-off rise that levels off is no climb), by at least
  MEMORY_MIN_GROWTH_BYTES and MEMORY_MIN_GROWTH_RATIO in all, and by MEMORY_NOISE_Z standard errors
  of that rise (the noise measured from the differences between successive samples, which a steady
  climb hardly spreads: noise that drifts up by chance is no climb). Such a rank is named when
  its rate (the rise of the medians over their time apart) exceeds the median rate of the ranks that
  do not climb by that growth over its samples: a leak on one rank names that rank and only it.
  When no rank stays flat (a leak that every rank's code shares, or a single rank), "the others"
  cannot tell start-up from a leak: the climb is named once it has lasted MEMORY_SHARED_MIN_SAMPLES.
- `data_wait_hint`: a rank that waits on its data iterator for at least DATA_WAIT_SHARE of its own
  work per step (its waits for the other ranks excluded; median of its last DATA_WAIT_WINDOW
  samples): "the data pipeline is not keeping up".
"""

from __future__ import annotations

import math
import statistics
from typing import Optional, Sequence

from minitrain.records import Phase

# A rank's first minute of steps is never judged: start-up grows the RSS of every rank (the first
# batches, autograd and DDP buffers, the optimizer's state at its first step, the allocator's arenas);
# measured on a 3-rank DDP job: +35 MiB in the first second of steps, then +2 MiB in the next 45 s.
MEMORY_WARMUP_S = 60.0
# Samples after the warm-up before a rank is judged (about 12 s at one a second): quarters of 3, whose
# medians a single odd sample cannot move (with 8, noise alone named a rank in 2-3 of the 1000 runs below).
MEMORY_MIN_SAMPLES = 12
MEMORY_WINDOW = 120  # the samples judged: about the last two minutes
# The least rise (over the judged samples) that is a climb: below it, allocator and page-cache noise.
MEMORY_MIN_GROWTH_BYTES = 16 * 2 ** 20
MEMORY_MIN_GROWTH_RATIO = 0.05
# ... and at least this many standard errors of the rise of the quarters' medians: with Gaussian or
# uniform noise of 20-40 MiB a sample on every rank of 3, 4 named a rank at some moment in 2-3 of 300
# scripted 150 s runs, 5 in none of 1000, while a 2 MiB/s leak in that noise was still named, a median
# 50 s after the warm-up.
MEMORY_NOISE_Z = 5.0
# With no flat rank to compare with (every rank climbs, or one rank in all), a climb is named only once
# it has lasted this many samples after the warm-up (about a minute): start-up growth that outlasts
# the warm-up levels off within it, a leak does not.
MEMORY_SHARED_MIN_SAMPLES = 60
DATA_WAIT_SHARE = 0.3
DATA_WAIT_WINDOW = 10
DATA_WAIT_MIN_SAMPLES = 3

# What a rank does in each phase, in a newcomer's words (the least advanced rank names the phase).
_PHASE_WORDS = {
    "": "spawning workers (starting Python, importing torch and your script)",
    Phase.UNSPECIFIED.name: "spawning workers (starting Python, importing torch and your script)",
    Phase.STARTUP.name: "workers connected, loading the training function",
    Phase.DIST_INIT.name: "rendezvous (process-group init)",
    Phase.TRAINING.name: "waiting for the first step (report())",
    Phase.FINISHING.name: "finishing",
}
_STATE_WORDS = {"PENDING": "preparing the run", "LAUNCHING": "starting node agents"}
_ORDER = {name: i for i, name in enumerate(["", *(p.name for p in Phase)])}


def startup_phase(state: str, rank_phases: Sequence[str]) -> tuple[str, str]:
    """(what a starting run is doing, in words; "k/n" ranks in that phase or "") for a run in `state`
    (a `RunState` name) whose current attempt's ranks are in `rank_phases` (`records.Phase` names, ""
    for a rank not connected yet): the least advanced rank names the phase."""
    if words := _STATE_WORDS.get(state):
        return words, ""
    if state == "RUNNING":
        return _PHASE_WORDS[Phase.TRAINING.name], ""
    if not rank_phases:
        return _PHASE_WORDS[""], ""
    least = min(rank_phases, key=lambda p: _ORDER.get(p, 0))
    return _PHASE_WORDS.get(least, least.lower()), f"{list(rank_phases).count(least)}/{len(rank_phases)}"


def startup_status(run: dict, ranks: list[dict], now: float) -> Optional[dict]:
    """{"phase": words, "ranks_in_phase": "k/n" or "", "elapsed_s": since the run started,
    "phase_elapsed_s": since the run's state last moved (None if unknown)} while no step has been
    reported and the run has not ended; None otherwise."""
    if run.get("rounds") or run.get("ended_at") is not None:
        return None
    started, since = run.get("started_at"), run.get("state_since")
    phase, in_phase = startup_phase(run.get("state") or "", [r.get("phase") or "" for r in ranks])
    return {"phase": phase, "ranks_in_phase": in_phase,
            "elapsed_s": None if started is None else max(now - started, 0.0),
            "phase_elapsed_s": None if since is None else max(now - since, 0.0)}


def _duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def startup_text(status: dict) -> str:
    """One line: "starting: rendezvous (process-group init), 2/2 ranks, for 0:00:07" (the time in the
    run's current state; the time since the run started is shown beside it by the console and the page)."""
    ranks = f", {status['ranks_in_phase']} ranks" if status.get("ranks_in_phase") else ""
    phase_for = status.get("phase_elapsed_s")
    return f"starting: {status['phase']}{ranks}" + ("" if phase_for is None else f", for {_duration(phase_for)}")


def _by_rank(samples: list[dict], attempt: Optional[int]) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for s in samples:
        if attempt is None or s.get("attempt") == attempt:
            out.setdefault(s.get("rank", 0), []).append(s)
    return out


def _mib(value: float) -> str:
    return f"{value / 2 ** 20:.0f} MiB"


def first_steps(samples: list[dict], attempt: Optional[int] = None) -> dict[int, float]:
    """{rank: the time of its first sample with a report} among `samples` (of `attempt`; None: all):
    when each rank's steps began, from which `memory_hint` counts its warm-up."""
    first: dict[int, float] = {}
    for s in samples:
        if (attempt is None or s.get("attempt") == attempt) and s.get("reports") and s.get("time") is not None:
            rank = s.get("rank", 0)
            first[rank] = min(first.get(rank, s["time"]), s["time"])
    return first


def _climb(points: list[tuple[float, float]]) -> Optional[tuple[float, float, float, bool]]:
    """(rate in bytes/s, level at the start, seconds between the first and last quarter, whether it
    climbs steadily) of one rank's judged (time, RSS) points: the medians of their four quarters
    (module doc); None when there are too few."""
    if len(points) < MEMORY_MIN_SAMPLES:
        return None
    quarter = len(points) // 4
    parts = [points[i * quarter:(i + 1) * quarter] for i in range(4)]
    levels = [statistics.median(v for _, v in part) for part in parts]
    times = [statistics.median(t for t, _ in part) for part in parts]
    growth, apart = levels[-1] - levels[0], max(times[-1] - times[0], 1e-9)
    steady = (all(b > a for a, b in zip(levels, levels[1:])) and growth >= _least_climb(levels[0])
              and growth >= MEMORY_NOISE_Z * _median_difference_error(_noise([v for _, v in points]), quarter))
    return growth / apart, levels[0], apart, steady


def _median_difference_error(noise: float, size: int) -> float:
    """The standard error of the difference of the medians of two groups of `size` samples with
    noise `noise` (a median's is sqrt(pi / 2) x the mean's, sigma / sqrt(size))."""
    return math.sqrt(math.pi / 2) * noise * math.sqrt(2 / size)


def _noise(values: list[float]) -> float:
    """The standard deviation of the noise on `values`, from their successive differences (a steady
    climb shifts them all alike, so it is not counted as noise): the larger of the estimates from
    their median and their mean absolute deviation (the median alone is often low on few samples)."""
    diffs = [b - a for a, b in zip(values, values[1:])]
    middle, mean = statistics.median(diffs), statistics.fmean(diffs)
    by_median = statistics.median(abs(d - middle) for d in diffs) * 1.4826
    by_mean = statistics.fmean(abs(d - mean) for d in diffs) * math.sqrt(math.pi / 2)
    return max(by_median, by_mean) / math.sqrt(2)  # a difference of two samples has sqrt(2) x their noise


def _least_climb(level: float) -> float:
    """The least rise that is a climb for a rank whose RSS was `level` (module doc)."""
    return max(MEMORY_MIN_GROWTH_BYTES, MEMORY_MIN_GROWTH_RATIO * level)


def memory_hint(samples: list[dict], attempt: Optional[int] = None,
                first_step_at: Optional[dict[int, float]] = None) -> Optional[dict]:
    """{"kind": "memory", "ranks": [...], "message"} when a rank's RSS climbs steadily after start-up,
    faster than the other ranks' (module doc), else None. `attempt`: judge only that attempt's samples
    (None: all). `first_step_at`: {rank: when its steps began in that attempt}, for a history that no
    longer reaches back to it (`RunMonitor` keeps a bounded one); `first_steps(samples)` by default."""
    first_step_at = {**first_steps(samples, attempt), **(first_step_at or {})}
    judged: dict[int, tuple[list, tuple[float, float, float, bool]]] = {}
    for rank, history in sorted(_by_rank(samples, attempt).items()):
        if rank not in first_step_at:
            continue  # no step yet: all of it is start-up
        after = first_step_at[rank] + MEMORY_WARMUP_S
        points = [(s["time"], s["rss_bytes"]) for s in history
                  if s.get("rss_bytes") and s.get("time") is not None and s["time"] >= after][-MEMORY_WINDOW:]
        climb = _climb(points)
        if climb is not None:
            judged[rank] = (points, climb)
    climbing = [rank for rank, (_, (_, _, _, steady)) in judged.items() if steady]
    flat_rates = [rate for rank, (_, (rate, _, _, _)) in judged.items() if rank not in climbing]
    baseline = max(statistics.median(flat_rates), 0.0) if flat_rates else None
    leaking, worst = [], None
    for rank in climbing:
        points, (rate, level, apart, _) = judged[rank]
        if baseline is None:  # no flat rank to compare with: the climb must last (module doc)
            if len(points) < MEMORY_SHARED_MIN_SAMPLES:
                continue
        elif (rate - baseline) * apart < _least_climb(level):
            continue  # not clearly faster than the ranks that stay flat
        leaking.append(rank)
        if worst is None or rate > worst[1]:
            worst = (rank, rate, points[0][1], points[-1][1], points[-1][0] - points[0][0])
    if not leaking:
        return None
    rank, rate, first, last, span = worst
    others = ("every rank climbs" if baseline is None and len(judged) > 1 else "" if baseline is None
              else f"the other ranks: {baseline * 60 / 2 ** 20:+.1f} MiB/min")
    return {"kind": "memory", "ranks": leaking,
            "message": f"memory climbs steadily across epochs on rank(s) {', '.join(map(str, leaking))} "
                       f"(rank {rank}: {_mib(first)} -> {_mib(last)} in {span:.0f} s after its first "
                       f"{MEMORY_WARMUP_S:.0f} s of steps, {rate * 60 / 2 ** 20:+.1f} MiB/min"
                       f"{'; ' + others if others else ''}): likely a leak "
                       f"(tensors kept across steps, e.g. a loss appended without .item())"}


def _data_share_of_work(sample: dict) -> Optional[float]:
    """Seconds waiting on data over the rank's own work per step (its waits for the other ranks
    excluded: a rank held up by a slow peer is not short of data)."""
    data, step = sample.get("data_wait_s"), sample.get("step_time_s")
    if data is None or not step:
        return None
    work = step - (sample.get("report_wait_s") or 0.0) - (sample.get("collective_wait_s") or 0.0)
    return min(data / work, 1.0) if work > 0 else None


def data_wait_hint(samples: list[dict], attempt: Optional[int] = None) -> Optional[dict]:
    """{"kind": "data", "ranks": [...], "message"} when a rank waits on data for at least
    DATA_WAIT_SHARE of its own work per step (module doc), else None."""
    slow, worst = [], None
    for rank, history in sorted(_by_rank(samples, attempt).items()):
        shares = [v for v in map(_data_share_of_work, history) if v is not None][-DATA_WAIT_WINDOW:]
        if len(shares) < DATA_WAIT_MIN_SAMPLES:
            continue
        share = statistics.median(shares)
        if share >= DATA_WAIT_SHARE:
            slow.append(rank)
            if worst is None or share > worst[1]:
                worst = (rank, share)
    if not slow:
        return None
    return {"kind": "data", "ranks": slow,
            "message": f"rank(s) {', '.join(map(str, slow))} wait on their data iterator for "
                       f"{worst[1] * 100:.0f}% of each step (rank {worst[0]}): the data pipeline is not keeping "
                       f"up (more DataLoader workers, prefetching, or faster storage)"}


def hints(samples: list[dict], attempt: Optional[int] = None,
          first_step_at: Optional[dict[int, float]] = None) -> list[dict]:
    """Every hint that applies, memory first (`first_step_at` as `memory_hint` takes it)."""
    return [h for h in (memory_hint(samples, attempt, first_step_at), data_wait_hint(samples, attempt))
            if h is not None]
