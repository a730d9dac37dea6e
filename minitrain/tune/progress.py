"""The live trial table on the driver's console (L3).

The table goes through the process's `LiveConsole` (minitrain.driver.console), the one writer of the
terminal, like fit()'s status: on a terminal it is the console's status block, redrawn in place at
most every `interval_s`, so a concurrent fit()'s worker output, status lines and minitrain's log
lines go above it and nothing is torn. While another run (a fit() on another thread) draws the
block, or off a terminal (a log file, CI, `MINITRAIN_STATUS=lines`), each trial's start and end is
one plain line written through the console, and the table is printed once at the end.
`MINITRAIN_STATUS=0` shows nothing.
"""

from __future__ import annotations

import shutil
import time
from typing import Optional

from minitrain.driver.console import LiveConsole
from minitrain.storage import sweep_state as tr

MAX_ROWS = 30


def render_table(trials: list[tr.Trial], metric: Optional[str], param_keys: Optional[list[str]] = None,
                 max_rows: int = MAX_ROWS, now: Optional[float] = None) -> str:
    """The table as text: one row per trial (the first `max_rows`, then a count of the rest). Once a
    trial started, a "start-up" column says "starting for 0:00:07" until its first result, then how
    long that took (`now`: time.time() by default)."""
    counts: dict[str, int] = {}
    for trial in trials:
        counts[trial.status] = counts.get(trial.status, 0) + 1
    summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    if param_keys is None:
        keys: dict[str, None] = {}
        for trial in trials:
            for key in tr.flat_config(trial.config):
                keys.setdefault(key, None)
        param_keys = list(keys)[:6]
    header = ["Trial name", "status", *param_keys, "iter", "total time (s)"] + ([metric] if metric else [])
    startup = any(trial.started_at is not None for trial in trials)
    now = time.time() if now is None else now
    header += ["start-up"] if startup else []
    rows = []
    for trial in trials[:max_rows]:
        config = tr.flat_config(trial.config)
        status = trial.status + (" (stopped early)" if trial.stop_reason and "early" in trial.stop_reason else "")
        row = [trial.name, status, *(tr.table_cell(config.get(k, "")) for k in param_keys), str(trial.iteration),
               f"{trial.time_total_s:.1f}"]
        if metric:
            row.append(tr.table_cell((trial.last_result or {}).get(metric, "")))
        if startup:
            row.append(tr.startup_cell(trial, now))
        rows.append(row)
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = [f"Trial status: {summary or 'no trials yet'}",
             "  ".join(h.ljust(w) for h, w in zip(header, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)) for r in rows]
    if len(trials) > max_rows:
        lines.append(f"... and {len(trials) - max_rows} more trials")
    return "\n".join(lines)


class ProgressReporter:
    """Shows the sweep in `console` (by default `LiveConsole.for_driver()`, taken now: call `finish`,
    or `release` when the sweep never ran): the table as the status block in "block" mode, plain
    lines then the table in "lines" mode, nothing when the console is off or `verbose=0`.
    Never raises for a console that cannot be written (the table turns itself off)."""

    def __init__(self, metric: Optional[str], console: Optional[LiveConsole] = None, interval_s: float = 2.0,
                 verbose: int = 1):
        self.metric = metric
        self.console = console if console is not None else LiveConsole.for_driver()
        self.interval_s, self.verbose = interval_s, verbose
        self._last_draw: Optional[float] = None

    @property
    def _block(self) -> bool:
        return bool(self.verbose) and self.console.mode == "block"

    @property
    def _lines(self) -> bool:
        return bool(self.verbose) and self.console.mode == "lines"

    def update(self, trials: list[tr.Trial]) -> None:
        """Block mode: redraw the table if the screen's copy is older than `interval_s`."""
        if self._block and (self._last_draw is None or time.monotonic() - self._last_draw >= self.interval_s):
            self.console.show(self._table_lines(trials))
            self._last_draw = time.monotonic()

    def _table_lines(self, trials: list[tr.Trial]) -> list[str]:
        # A block taller than the screen could not be erased (its top scrolled away): fewer rows then,
        # leaving room for the header lines, the "... more" line and the cursor's line.
        rows = max(1, min(MAX_ROWS, shutil.get_terminal_size().lines - 5))
        return render_table(trials, self.metric, max_rows=rows).splitlines()

    def trial_changed(self, trial: tr.Trial) -> None:
        """Lines mode: one plain line when a trial starts or ends."""
        if not self._lines:
            return
        line = f"Trial {trial.name} {trial.status}"
        if trial.status == tr.TrialStatus.RUNNING:
            line += f" with config {trial.config}"
            if trial.iteration:
                line += f" (resumed at iteration {trial.iteration})"
        else:
            line += f" after {trial.iteration} iterations"
            if self.metric and trial.last_result and self.metric in trial.last_result:
                line += f", {self.metric}={tr.table_cell(trial.last_result[self.metric])}"
            if trial.stop_reason:
                line += f" ({trial.stop_reason})"
            if trial.error and trial.status == tr.TrialStatus.ERROR:
                line += f": {trial.error.exc_type}: {trial.error.message.splitlines()[:1]}"
            elif trial.error and trial.status == tr.TrialStatus.PENDING:
                line += f" (failed: {trial.error.exc_type}; retry {trial.num_failures})"
        self.console.line(line)

    def finish(self, trials: list[tr.Trial]) -> None:
        """The sweep is over: the final table stays on screen (block mode) or is printed (lines mode),
        and the console's status block is free for a later run. Never raises."""
        try:
            if self._block:
                self.console.finish(self._table_lines(trials))
            elif self._lines:
                # One write: a concurrent run's status block is erased and drawn again around the whole table.
                self.console.write(self.console.stderr, render_table(trials, self.metric) + "\n")
        except (OSError, ValueError):  # a closed console never stops the sweep
            self.verbose = 0
        finally:
            self.release()

    def release(self) -> None:
        """Give the terminal's status block back (idempotent; `finish` does it)."""
        self.console.release()
