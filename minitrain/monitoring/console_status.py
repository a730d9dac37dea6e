"""The live status of a run on the driver's console, drawn from its `RunMonitor`.

`ConsoleStatus` is a run observer with a thread of its own: from the run's start to its end it
renders the monitor every REFRESH_S into the `LiveConsole`'s status block (on a terminal), or every
`MINITRAIN_STATUS_INTERVAL_S` seconds (default 30) as one summary line (off a terminal). At the end
the final status is left on screen (block) or written as a last line.

What it shows: the attempt and state, the time since the run started, steps/s (rank-0 report rounds
per second), progress and ETA when the training function declared its total with
`minitrain.set_progress_total(n)`, the ranks' step times excluding their waits for the other ranks
(min / median / max, the slowest rank named: as the straggler rule judges, so a rank blocked at a
checkpoint round by a slow peer is not the one named), the stragglers, and the last committed
checkpoint. Steps/s is the monitor's: over about the last 30 s while the run lasts, over the whole
run in the last status.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Mapping, Optional, Sequence

from minitrain import knobs
from minitrain.coordinator.observers import RunInfo, RunObserver
from minitrain.driver.console import LiveConsole
from minitrain.monitoring.diagnoses import startup_status, startup_text
from minitrain.monitoring.monitor import RunMonitor, step_time_summary
from minitrain.records import RunOutcome
from minitrain.run_state import RunState, ray_status

logger = logging.getLogger("minitrain")

REFRESH_S = 0.5


def line_interval_s(environ: Optional[Mapping[str, str]] = None) -> float:
    """Seconds between summary lines off a terminal: MINITRAIN_STATUS_INTERVAL_S in `environ` (default:
    os.environ), else 30; ConfigError naming a value that is not a positive number."""
    return knobs.STATUS_INTERVAL_S.get(environ)


def _duration(seconds: Optional[float]) -> str:
    if seconds is None:
        return "?"
    seconds = int(max(seconds, 0))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}"


def status_parts(run: dict, ranks: list[dict], stragglers: list[dict], checkpoints: list[dict],
                 now: float, hints: Sequence[dict] = (), resizes: Sequence[dict] = ()) -> list[str]:
    """The status as short parts: the block shows one a line, the summary line joins them. Until
    the first step, the steps part is the start-up phase and how long it has taken; `hints` are
    `diagnoses.hints` (one "hint: ..." part each); `resizes` an elastic run's (`RunMonitor.resizes`),
    of which the latest is shown."""
    started = run.get("started_at")
    ended = run.get("ended_at")
    elapsed = None if started is None else (ended or now) - started
    parts = [f"minitrain: {run.get('name') or 'run'} | attempt {run.get('attempt', 0)} {run.get('state', '')} | "
             f"{_duration(elapsed)} elapsed"]
    rate = run.get("steps_per_s")
    steps = f"{run.get('rounds', 0)} steps"
    if run.get("total"):
        steps = f"{run.get('rounds', 0)}/{run['total']} steps ({100 * (run.get('progress') or 0):.1f}%)"
    progress = f"{steps} | {rate:.2f} steps/s" if rate else f"{steps} | - steps/s"
    if run.get("eta_s") is not None and run.get("state") == ray_status(RunState.RUNNING):
        progress += f" | ETA {_duration(run['eta_s'])}"
    startup = startup_status(run, ranks, now)
    parts.append(progress if startup is None else startup_text(startup))
    summary = step_time_summary(ranks)
    if summary is not None:
        parts.append(f"step time excl. waits min {summary['min']:.3f} s | median {summary['median']:.3f} s | max "
                     f"{summary['max']:.3f} s (slowest: rank {summary['slowest_rank']})")
    for s in stragglers:
        parts.append(f"straggler: rank {s['rank']} on {s['host']} {s['slower_by']:.1f}x slower ({s['cause']})")
    if checkpoints:
        last = checkpoints[-1]
        committed = last.get("committed_at")
        parts.append(f"last checkpoint {last['dir']}" + ("" if committed is None else
                                                          f" ({_duration(now - committed)} ago)"))
    if resizes:
        last = resizes[-1]
        count = last["to_workers"]
        parts.append(f"{count} worker{'' if count == 1 else 's'} since attempt {last['attempt']} (resized from "
                     f"{last['from_workers']}: {last['reason']})")
    parts.extend(f"hint: {h['message']}" for h in hints)
    return parts


class ConsoleStatus(RunObserver):
    """Draws `monitor` into `console` while the run lasts (see the module doc)."""

    def __init__(self, monitor: RunMonitor, console: LiveConsole, line_every_s: Optional[float] = None,
                 clock: Callable[[], float] = time.time):
        self._monitor = monitor
        self._console = console
        self._clock = clock
        self._every_s = REFRESH_S if console.mode == "block" else (line_every_s or line_interval_s())
        self._stopped = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def parts(self) -> list[str]:
        """The current status."""
        monitor = self._monitor
        run = monitor.run()
        return status_parts(run, monitor.ranks(), monitor.stragglers(), monitor.checkpoints(), self._clock(),
                            monitor.hints(), monitor.resizes())

    def on_run_start(self, run: RunInfo) -> None:
        if self._console.mode is None:
            return
        self._thread = threading.Thread(target=self._run, name="minitrain-console-status", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(self._every_s):
            try:
                parts = self.parts()
            except Exception as exc:  # noqa: BLE001 - the status is a view: it never ends the run's output
                logger.debug("console status not drawn: %s", exc)
                continue
            if self._console.mode == "block":
                self._console.show(parts)
            else:
                self._console.line(" | ".join(parts))

    def on_run_end(self, outcome: RunOutcome) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(10.0)
        if self._console.mode is not None:
            self._console.finish(self.parts())
