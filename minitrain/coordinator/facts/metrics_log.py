"""`<run>/metrics.jsonl`: every rank-0 report of the run, in order, with round, attempt and time.

Lines are buffered and appended at commits, at the end of the run, and at least every second, so a
run that reports thousands of times per second does not pay a storage write per report. A crash in
the middle of an append can leave a torn last line: readers ignore it, and `repair` (called before a
run appends) cuts it off, so the run goes on with every intact line.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Callable

from minitrain.storage.layout import METRICS_NAME, split_metrics_lines

FLUSH_INTERVAL_S = 1.0
FLUSH_LINES = 1000

logger = logging.getLogger("minitrain")


class MetricsLog:
    """Appends JSON lines to METRICS_NAME in the run directory of `storage`."""

    def __init__(self, storage: Any, clock: Callable[[], float] = time.monotonic):
        self._storage = storage
        self._clock = clock
        self._lines: list[str] = []
        self._last_flush = clock()

    def repair(self) -> None:
        """Cut off a torn last line (a crash in the middle of an append) with a warning, so appends go
        on after the last intact line. ValueError naming the line when an earlier line is damaged."""
        if not self._storage.exists(METRICS_NAME):
            return
        text = self._storage.read_text(METRICS_NAME)
        _, intact = split_metrics_lines(text)
        if intact < len(text):
            logger.warning("%s ends with a torn line (a crash in the middle of a write); removing it: %r",
                           self._storage.url(METRICS_NAME), text[intact:intact + 200])
            self._storage.write_text_atomic(METRICS_NAME, text[:intact])

    def append(self, metrics: dict, report_index: int, attempt: int, reported_at: float,
               metrics_json: str = "") -> None:
        """Queue one rank-0 report; flushes when the buffer is old or large. `metrics_json`: the JSON text
        `metrics` was parsed from, if at hand: written as it is (encoding the dict again cost 12% of the
        controller's time per report in a DDP loop), unless it spans lines, which a JSON Lines file cannot
        hold (the worker's encoder never writes one; the dict is encoded then)."""
        if metrics_json and "\n" not in metrics_json and "\r" not in metrics_json:
            line = (f'{{"metrics": {metrics_json}, "report_index": {int(report_index)}, '
                    f'"attempt": {int(attempt)}, "time": {json.dumps(reported_at)}}}\n')
        else:
            line = json.dumps({"metrics": metrics, "report_index": report_index, "attempt": attempt,
                               "time": reported_at}) + "\n"
        self._lines.append(line)
        if len(self._lines) >= FLUSH_LINES or self._clock() - self._last_flush > FLUSH_INTERVAL_S:
            self.flush()

    def flush(self) -> None:
        """Write the buffered lines (one append)."""
        if self._lines:
            self._storage.append_text(METRICS_NAME, "".join(self._lines))
            self._lines.clear()
        self._last_flush = self._clock()


def read_metrics_history(storage: Any) -> list[dict]:
    """Every intact entry of METRICS_NAME (empty when the file does not exist; a torn last line is
    ignored)."""
    if not storage.exists(METRICS_NAME):
        return []
    return split_metrics_lines(storage.read_text(METRICS_NAME))[0]
