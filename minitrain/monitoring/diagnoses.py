"""Plain-words diagnoses of a run, from the monitor's views: what start-up is doing, and the hints
the console and the dashboard show when memory climbs or the data pipeline does not keep up.

Pure functions of the monitor's `run()`, `ranks()` and `samples()` dicts (live or rebuilt from the
run directory), so the console, the page and the tests all read the same words.

- `startup_status`: until the first step (report round), the phase the run is in and how long it
  has taken: "starting node agents", "spawning workers (importing torch and your script)",
  "rendezvous (process-group init)", "waiting for the first step (report())".
- `memory_hint`: a rank whose resident memory climbs steadily (each quarter of its recent samples
  higher than the one before, by MEMORY_MIN_GROWTH_BYTES and MEMORY_MIN_GROWTH_RATIO in all):
  "memory climbs steadily across epochs: likely a leak (tensors kept across steps)".
- `data_wait_hint`: a rank that waits on its data iterator for at least DATA_WAIT_SHARE of its own
  work per step (its waits for the other ranks excluded; median of its last DATA_WAIT_WINDOW
  samples): "the data pipeline is not keeping up".
"""

from __future__ import annotations

import statistics
from typing import Optional, Sequence

from minitrain.records import Phase

MEMORY_MIN_SAMPLES = 8  # about 8 s of a rank's history before memory is judged
MEMORY_WINDOW = 120  # the samples judged: about the last two minutes
MEMORY_MIN_GROWTH_BYTES = 16 * 2 ** 20
MEMORY_MIN_GROWTH_RATIO = 0.05
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


def memory_hint(samples: list[dict], attempt: Optional[int] = None) -> Optional[dict]:
    """{"kind": "memory", "ranks": [...], "message"} when a rank's RSS climbs steadily (module doc),
    else None. `attempt`: judge only that attempt's samples (None: all)."""
    leaking, worst = [], None
    for rank, history in sorted(_by_rank(samples, attempt).items()):
        points = [(s["time"], s["rss_bytes"]) for s in history if s.get("rss_bytes")][-MEMORY_WINDOW:]
        if len(points) < MEMORY_MIN_SAMPLES:
            continue
        quarter = len(points) // 4
        medians = [statistics.median(v for _, v in points[i * quarter:(i + 1) * quarter]) for i in range(4)]
        growth = medians[-1] - medians[0]
        steady = all(b > a for a, b in zip(medians, medians[1:]))
        if steady and growth >= max(MEMORY_MIN_GROWTH_BYTES, MEMORY_MIN_GROWTH_RATIO * medians[0]):
            leaking.append(rank)
            span = points[-1][0] - points[0][0]
            if worst is None or growth > worst[1]:
                worst = (rank, growth, points[0][1], points[-1][1], span)
    if not leaking:
        return None
    rank, _, first, last, span = worst
    return {"kind": "memory", "ranks": leaking,
            "message": f"memory climbs steadily across epochs on rank(s) {', '.join(map(str, leaking))} "
                       f"(rank {rank}: {_mib(first)} -> {_mib(last)} in {span:.0f} s): likely a leak "
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


def hints(samples: list[dict], attempt: Optional[int] = None) -> list[dict]:
    """Every hint that applies, memory first."""
    return [h for h in (memory_hint(samples, attempt), data_wait_hint(samples, attempt)) if h is not None]
