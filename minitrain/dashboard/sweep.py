"""A minitrain.tune sweep on the web dashboard (L3): the trial table as a page and as JSON.

Served by `minitrain.dashboard`'s server (same access rules: loopback without a token by default,
any other address only with the viewer token) through extra routes:

    GET /  and  /tune     the trial table (status, parameters, latest metric, iterations, start-up,
                          stop reason);
                          a live page reloads itself every 2 s (a meta refresh: the page runs no script)
    GET /api/trials       the same rows as JSON, one object per trial
    GET /api/sweep        the sweep: name, metric, mode, trial counts by status

Both read the sweep's `tuner_state.json` (minitrain.storage.sweep_state), which the tuner replaces
atomically after every change, so the live page (`Tuner.fit()` serves it at `MINITRAIN_DASHBOARD`'s
address while the sweep runs) and the post-hoc one (`python -m minitrain.dashboard SWEEP_PATH`) are
the same code. Each trial's own
fit() serves its own run dashboard on a free port (its URL is in the trial's `.tune/<trial>.log`).
This module imports nothing of minitrain.tune: the tuner uses it (`live_sweep_dashboard`,
`trials_address_value`), and the dashboard's CLI serves a finished sweep with it.
"""

from __future__ import annotations

import contextlib
import html
import os
import time
from typing import Any, Iterator, Optional

from minitrain.dashboard import live_dashboard
from minitrain.dashboard.server import DashboardServer, Route, to_json
from minitrain.dashboard.settings import parse_address
from minitrain.storage import sweep_state as tr

REFRESH_S = 2
_HTML = "text/html; charset=utf-8"
_JSON = "application/json"


def is_sweep_dir(path: str) -> bool:
    """True when `path` is a local directory holding a tuning run's state file."""
    return "://" not in path and os.path.isfile(os.path.join(path, tr.STATE_FILE))


def read_sweep(experiment_path: str) -> tuple[dict, list[tr.Trial]]:
    """The sweep's header and trials as its state file has them now; an empty sweep (named after the
    directory) before the tuner wrote the file for the first time."""
    try:
        return tr.read_state(experiment_path)
    except FileNotFoundError:
        return {"name": os.path.basename(experiment_path.rstrip(os.sep))}, []


def _metric_of(header: dict) -> Optional[str]:
    """The metric the table shows: TuneConfig's, else the scheduler's or searcher's."""
    return header.get("shown_metric") or header.get("metric")


def trial_rows(header: dict, trials: list[tr.Trial], now: Optional[float] = None) -> list[dict]:
    """One JSON-able object per trial, in trial order: the console table's columns and a little more
    (`now`, time.time() by default, for "starting for ...")."""
    metric = _metric_of(header)
    now = time.time() if now is None else now
    rows = []
    for trial in trials:
        last = trial.last_result or {}
        error = trial.error
        rows.append({
            "trial_id": trial.trial_id,
            "name": trial.name,
            "status": trial.status,
            "stopped_early": bool(trial.stop_reason and "early" in trial.stop_reason),
            "stop_reason": trial.stop_reason,
            "params": tr.flat_config(trial.config) if isinstance(trial.config, dict) else {"config": trial.config},
            "iterations": trial.iteration,
            "metric": metric,
            "latest": last.get(metric) if metric else None,
            "last_result": last,
            "time_total_s": trial.time_total_s,
            "num_failures": trial.num_failures,
            "error": f"{error.exc_type}: {error.message.splitlines()[:1]}" if error else None,
            "checkpoint": trial.checkpoint,
            "started_at": trial.started_at,  # its latest process's start (time.time())
            "startup_s": trial.startup_s,  # from there to its first result; None until then
            "startup": tr.startup_cell(trial, now),  # "starting for 0:00:07", then "0:00:07"
        })
    return rows


def sweep_summary(header: dict, trials: list[tr.Trial]) -> dict:
    """The sweep as a whole: name, metric, mode, how many trials (of how many) in each status."""
    counts: dict[str, int] = {}
    for trial in trials:
        counts[trial.status] = counts.get(trial.status, 0) + 1
    return {"name": header.get("name"), "trainable": header.get("trainable"), "metric": _metric_of(header),
            "mode": header.get("shown_mode") or header.get("mode"), "total_trials": header.get("total_trials"), "trials": len(trials),
            "status_counts": counts}


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def page_html(header: dict, trials: list[tr.Trial], live: bool, now: Optional[float] = None) -> str:
    """The trial table page; `live` adds the reload every REFRESH_S seconds (`now`: as `trial_rows`)."""
    rows = trial_rows(header, trials, now)
    summary = sweep_summary(header, trials)
    metric = summary["metric"]
    keys: dict[str, None] = {}
    for row in rows:
        for key in row["params"]:
            keys.setdefault(key, None)
    param_keys = list(keys)
    startup = any(row["started_at"] is not None for row in rows)
    headers = (["Trial", "Status", *param_keys, "Iterations", "Total time (s)"] + ([metric] if metric else [])
               + (["Start-up"] if startup else []) + ["Note"])
    body = []
    for row in rows:
        status = row["status"] + (" (stopped early)" if row["stopped_early"] else "")
        note = row["error"] or row["stop_reason"] or ""
        cells = [row["name"], status, *(tr.table_cell(row["params"].get(k, "")) for k in param_keys), row["iterations"],
                 f"{row['time_total_s']:.1f}"] + ([tr.table_cell(row["latest"]) if row["latest"] is not None else ""]
                                                   if metric else []) + ([row["startup"]] if startup else []) + [note]
        body.append(f'<tr class="trial status-{_e(row["status"])}">' + "".join(f"<td>{_e(c)}</td>" for c in cells)
                    + "</tr>")
    if not body:
        body.append(f'<tr class="empty"><td colspan="{len(headers)}">no trial yet</td></tr>')
    counts = ", ".join(f"{n} {status}" for status, n in sorted(summary["status_counts"].items())) or "no trials yet"
    refresh = f'<meta http-equiv="refresh" content="{REFRESH_S}">\n' if live else ""
    mode = "live" if live else "from storage"
    goal = f"{_e(summary['mode'])} {_e(metric)}" if metric else "no metric set"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
{refresh}<title>minitrain sweep · {_e(summary["name"])}</title>
<link rel="stylesheet" href="static/dashboard.css">
</head><body>
<header><h1>{_e(summary["name"])}</h1><span class="mode">sweep, {_e(mode)}</span></header>
<main>
<section id="overview"><span><span class="label">Trials</span> {_e(counts)}</span>
<span><span class="label">Goal</span> {goal}</span></section>
<section><h2>Trials</h2><table id="trials"><thead><tr>{"".join(f"<th>{_e(h)}</th>" for h in headers)}</tr></thead>
<tbody>{"".join(body)}</tbody></table></section>
</main>
<footer>JSON: <a href="api/trials">/api/trials</a> · <a href="api/sweep">/api/sweep</a></footer>
</body></html>
"""


def sweep_routes(experiment_path: str, live: bool) -> dict[str, Route]:
    """The extra routes of a dashboard server showing the sweep in `experiment_path`."""

    def page(query: dict) -> tuple[bytes, str]:
        return page_html(*read_sweep(experiment_path), live=live).encode(), _HTML

    def trials_api(query: dict) -> tuple[bytes, str]:
        return to_json(trial_rows(*read_sweep(experiment_path))).encode(), _JSON

    def sweep_api(query: dict) -> tuple[bytes, str]:
        return to_json(sweep_summary(*read_sweep(experiment_path))).encode(), _JSON

    return {"/": page, "/index.html": page, "/tune": page, "/api/trials": trials_api, "/api/sweep": sweep_api}


@contextlib.contextmanager
def live_sweep_dashboard(experiment_path: str) -> Iterator[Optional[DashboardServer]]:
    """Serve the sweep's page while the block runs, at `MINITRAIN_DASHBOARD`'s address (its rules and
    its off switch), and stop it however the block ends. Yields the server, or None when turned off."""
    with live_dashboard(None, routes=sweep_routes(experiment_path, live=True), what="sweep dashboard") as server:
        yield server


def trials_address_value(environ_value: Optional[str]) -> Optional[str]:
    """The MINITRAIN_DASHBOARD a trial process gets: the sweep's page holds a fixed port, so each trial's
    own run dashboard listens on a free port of the same host ("HOST:0"); unset, empty and off pass on."""
    address = parse_address(environ_value)
    if address is None or address.port == 0:
        return environ_value
    host = f"[{address.host}]" if ":" in address.host else address.host
    return f"{host}:0"
