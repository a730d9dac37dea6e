"""The live trial table on the console (L3).

On a terminal the table (status, parameters, latest metric, iterations) is redrawn in place at most
every `interval_s`; off a terminal (a log file, CI) each trial's start and end is one plain line,
and the table is printed once at the end.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Optional, TextIO

from minitrain.storage.retention import flatten_metrics
from minitrain.tune import trials as tr

MAX_ROWS = 30


def _flat(values: Any) -> dict:
    """A trial's config with nested dicts as "a/b" keys; {} for a config that is not a dict."""
    return flatten_metrics(values) if isinstance(values, dict) else {}


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    text = str(value)
    return text if len(text) <= 24 else text[:21] + "..."


def render_table(trials: list[tr.Trial], metric: Optional[str], param_keys: Optional[list[str]] = None) -> str:
    """The table as text: one row per trial (the first MAX_ROWS, then a count of the rest)."""
    counts: dict[str, int] = {}
    for trial in trials:
        counts[trial.status] = counts.get(trial.status, 0) + 1
    summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    if param_keys is None:
        keys: dict[str, None] = {}
        for trial in trials:
            for key in _flat(trial.config):
                keys.setdefault(key, None)
        param_keys = list(keys)[:6]
    header = ["Trial name", "status", *param_keys, "iter", "total time (s)"] + ([metric] if metric else [])
    rows = []
    for trial in trials[:MAX_ROWS]:
        config = _flat(trial.config)
        status = trial.status + (" (stopped early)" if trial.stop_reason and "early" in trial.stop_reason else "")
        row = [trial.name, status, *(_cell(config.get(k, "")) for k in param_keys), str(trial.iteration),
               f"{trial.time_total_s:.1f}"]
        if metric:
            row.append(_cell((trial.last_result or {}).get(metric, "")))
        rows.append(row)
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = [f"Trial status: {summary or 'no trials yet'}",
             "  ".join(h.ljust(w) for h, w in zip(header, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)) for r in rows]
    if len(trials) > MAX_ROWS:
        lines.append(f"... and {len(trials) - MAX_ROWS} more trials")
    return "\n".join(lines)


class ProgressReporter:
    """Shows the sweep on `stream` (stderr by default): a table redrawn in place on a TTY, plain lines
    otherwise. `verbose=0` shows nothing."""

    def __init__(self, metric: Optional[str], stream: Optional[TextIO] = None, interval_s: float = 2.0,
                 verbose: int = 1):
        self.metric = metric
        self.stream = stream if stream is not None else sys.stderr
        self.interval_s, self.verbose = interval_s, verbose
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last_draw = 0.0
        self._drawn_lines = 0

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # a closed console never stops the sweep
            self.verbose = 0

    def update(self, trials: list[tr.Trial]) -> None:
        """Redraw the table if the terminal's copy is older than `interval_s`."""
        if not self.verbose or not self.tty or time.monotonic() - self._last_draw < self.interval_s:
            return
        self._draw(trials)

    def _draw(self, trials: list[tr.Trial]) -> None:
        table = render_table(trials, self.metric)
        erase = f"\x1b[{self._drawn_lines}F\x1b[J" if self._drawn_lines else ""
        self._write(erase + table + "\n")
        self._drawn_lines = table.count("\n") + 1
        self._last_draw = time.monotonic()

    def trial_changed(self, trial: tr.Trial) -> None:
        """One plain line off a TTY when a trial starts or ends."""
        if not self.verbose or self.tty:
            return
        line = f"Trial {trial.name} {trial.status}"
        if trial.status == tr.RUNNING:
            line += f" with config {trial.config}"
            if trial.iteration:
                line += f" (resumed at iteration {trial.iteration})"
        else:
            line += f" after {trial.iteration} iterations"
            if self.metric and trial.last_result and self.metric in trial.last_result:
                line += f", {self.metric}={_cell(trial.last_result[self.metric])}"
            if trial.stop_reason:
                line += f" ({trial.stop_reason})"
            if trial.error and trial.status == tr.ERROR:
                line += f": {trial.error.get('exc_type')}: {trial.error.get('message', '').splitlines()[:1]}"
            elif trial.error and trial.status == tr.PENDING:
                line += f" (failed: {trial.error.get('exc_type')}; retry {trial.num_failures})"
        self._write(line + "\n")

    def finish(self, trials: list[tr.Trial]) -> None:
        """The final table."""
        if self.verbose:
            if self.tty:
                self._draw(trials)
            else:
                self._write(render_table(trials, self.metric) + "\n")
