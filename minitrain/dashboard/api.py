"""The dashboard's JSON views: what `/api/...` answers, computed from a run monitor.

Each view is a plain function of the monitor and the query string, so it is tested without a server.
The monitor is `minitrain.monitoring.monitor.RunMonitor` (live, in the driver) or the same read API
rebuilt from a run directory (post hoc); anything with the `RunView` methods will do.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Optional, Protocol


class RunView(Protocol):
    """The read API of a run monitor the dashboard uses (see minitrain.monitoring.monitor)."""

    def run(self) -> dict: ...

    def attempts(self) -> list[dict]: ...

    def checkpoints(self) -> list[dict]: ...

    def reports(self) -> list[dict]: ...

    def ranks(self) -> list[dict]: ...

    def samples(self, rank: Optional[int] = None, since: Optional[float] = None) -> list[dict]: ...

    def stragglers(self) -> list[dict]: ...

    def straggler_history(self) -> list[dict]: ...

    def hints(self) -> list[dict]: ...

    def resizes(self) -> list[dict]: ...

    def nodes(self) -> list[dict]: ...

    def goodput(self) -> dict: ...  # optional: a view without it shows no goodput (`goodput_of`)


class BadQuery(ValueError):
    """A query parameter the view cannot use (answered with 400 and this message)."""


def _one(query: Mapping[str, list[str]], name: str, kind: Callable[[str], Any]) -> Any:
    values = query.get(name)
    if not values:
        return None
    try:
        value = kind(values[0])
    except ValueError:
        raise BadQuery(f"query parameter {name}={values[0]!r} is not a {kind.__name__}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise BadQuery(f"query parameter {name}={values[0]!r} is not a finite number")
    return value


def goodput_of(view: RunView) -> Optional[dict]:
    """The view's goodput ledger (`RunMonitor.goodput()`'s form), or None when it has none."""
    goodput = getattr(view, "goodput", None)
    return goodput() if goodput is not None else None


def _metrics(view: RunView, query: Mapping[str, list[str]]) -> list[dict]:
    """Rank 0's reports in order; `?since_index=N` keeps those with index > N (for polling)."""
    since_index = _one(query, "since_index", int)
    reports = view.reports()
    if since_index is None:
        return reports
    return [report for report in reports if report.get("index", -1) > since_index]


def _samples(view: RunView, query: Mapping[str, list[str]]) -> list[dict]:
    """Telemetry samples; `?rank=R` keeps one rank, `?since=T` those after time T (seconds since the epoch)."""
    return view.samples(rank=_one(query, "rank", int), since=_one(query, "since", float))


VIEWS: dict[str, Callable[[RunView, Mapping[str, list[str]]], Any]] = {
    "run": lambda view, query: view.run(),
    "attempts": lambda view, query: view.attempts(),
    "checkpoints": lambda view, query: view.checkpoints(),
    "metrics": _metrics,
    "ranks": lambda view, query: view.ranks(),
    "samples": _samples,
    # Every episode of the run ("until" null while it lasts): after the run, and post hoc, the page
    # still shows who straggled (the current ones alone are none once the attempt ended).
    "stragglers": lambda view, query: view.straggler_history(),
    "hints": lambda view, query: view.hints(),
    # An elastic run's resizes: {"attempt", "from_workers", "to_workers", "reason", "time"} each.
    "resizes": lambda view, query: view.resizes(),
    # The current attempt's hosts and their total memory: the node memory plot's "total" lines.
    "nodes": lambda view, query: view.nodes(),
    # Every worker-second by cause, in total, per attempt and per rank (minitrain.monitoring.goodput).
    "goodput": lambda view, query: goodput_of(view),
}


def api_view(view: RunView, name: str, query: Mapping[str, list[str]]) -> Any:
    """The JSON-able answer of `/api/<name>`; KeyError for an unknown name, BadQuery for a bad parameter."""
    return VIEWS[name](view, query)


def snapshot(view: RunView) -> dict:
    """Every view at once: embedded in the page so it renders complete before any request of its own."""
    return {name: api_view(view, name, {}) for name in VIEWS}


def numeric_metrics(reports: list[dict]) -> list[str]:
    """The names of the metrics reported with a number (not a bool) at least once, in first-seen order."""
    names: dict[str, None] = {}
    for report in reports:
        for key, value in (report.get("metrics") or {}).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                names.setdefault(key, None)
    return list(names)
