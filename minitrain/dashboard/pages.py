"""The dashboard's HTML, rendered here on the server.

The page is complete as served (overview, stragglers, ranks, attempts, checkpoints, with the run's
data embedded for the plots), so it reads without a script. The script (static/dashboard.js) draws
the plots with uPlot and, while the run is live, swaps in fresh sections from `/parts` every two
seconds: the tables are rendered only here, in one place. Every value from the run is escaped.
"""

from __future__ import annotations

import html
import json
import math
import time
from typing import Any, Callable, Iterable, Optional, Sequence

from minitrain.dashboard.api import RunView, goodput_of, snapshot
from minitrain.monitoring.goodput import CAUSES, line as goodput_line
from minitrain.monitoring.diagnoses import startup_status, startup_text
from minitrain.errors import render_failed_attempts
from minitrain.records import FailedAttempt, Phase
from minitrain.run_state import RunState, from_ray_status

# The colour of the state badge (a class of static/dashboard.css): "busy" for the states in between.
_STATE_TONES = {RunState.RUNNING: "running", RunState.SUCCEEDED: "ok", RunState.FAILED: "bad",
                RunState.ABORTED: "bad"}


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _seconds(value: Optional[float]) -> str:
    if value is None:
        return "–"
    if 0 < value < 1e-3:  # a wait of a fraction of a millisecond is not "0 ms"
        return f"{value * 1e6:.0f} µs"
    if value < 1:
        return f"{value * 1000:.{1 if 0 < value < 0.01 else 0}f} ms"
    if value < 120:
        return f"{value:.2f} s"
    minutes, seconds = divmod(int(value), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s"


def _bytes(value: Optional[float]) -> str:
    if value is None:
        return "–"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return "–"


def _percent(value: Optional[float]) -> str:
    return "–" if value is None else f"{value:.0f}%"


def _clock(value: Optional[float]) -> str:
    return "–" if value is None else time.strftime("%H:%M:%S", time.localtime(value))


def _value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}" if math.isfinite(value) else str(value)
    return str(value)


def _table(table_id: str, headers: Sequence[str], rows: Iterable[str], empty: str) -> str:
    body = "".join(rows) or f'<tr class="empty"><td colspan="{len(headers)}">{_e(empty)}</td></tr>'
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def overview_html(run: dict) -> str:
    """The run's state line: name, state, attempt, elapsed, steps/s, progress and ETA. `data-ended` says
    whether the run reached its terminal state (the script stops polling then)."""
    state = from_ray_status(run.get("state") or "")
    tone = _STATE_TONES.get(state, "busy")
    ended = run.get("ended_at")
    started = run.get("started_at")
    elapsed = ((ended or time.time()) - started) if started else None
    progress = run.get("progress")
    items = [
        ("State", f'<span class="state state-{tone}">{_e(run.get("state"))}</span>'),
        ("Attempt", _e(run.get("attempt"))),
        ("Workers", _e(run.get("num_workers"))),
        ("Elapsed", _e(_seconds(elapsed))),
        ("Steps/s", _e("–" if run.get("steps_per_s") is None else f"{run['steps_per_s']:.2f}")),
        ("Progress", _e("–" if progress is None else f"{progress * 100:.1f}%")),
        ("ETA", _e(_seconds(run.get("eta_s")))),
        ("Run directory", f"<code>{_e(run.get('run_path'))}</code>"),
    ]
    cells = "".join(f'<div class="item"><span class="label">{label}</span> {value}</div>' for label, value in items)
    terminal = "true" if state is not None and state.is_terminal else "false"
    return f'<div id="overview" data-state="{_e(run.get("state"))}" data-ended="{terminal}">{cells}</div>'


def stragglers_html(episodes: list[dict]) -> str:
    """A banner naming each straggler episode of the run (`RunMonitor.straggler_history`): the open
    ones first as "is", the ended ones as "was", or nothing when there was none."""
    if not episodes:
        return '<div id="stragglers"></div>'
    ordered = [e for e in episodes if e.get("until") is None] + [e for e in episodes if e.get("until") is not None]
    lines = "".join(
        f'<li data-rank="{_e(s.get("rank"))}">rank {_e(s.get("rank"))} on {_e(s.get("host"))} '
        f'{"is" if s.get("until") is None else "was"} a straggler: {_e(_value(s.get("slower_by")))}× the median '
        f'step time, waits excluded ({_e(_seconds(s.get("step_time_s")))} vs '
        f'{_e(_seconds(s.get("median_step_time_s")))}); cause: {_e(s.get("cause"))}; from '
        f'{_e(_clock(s.get("since")))}{"" if s.get("until") is None else " to " + _e(_clock(s.get("until")))}</li>'
        for s in ordered)
    return f'<div id="stragglers" class="alert"><strong>Stragglers</strong><ul>{lines}</ul></div>'


def startup_html(run: dict, ranks: list[dict]) -> str:
    """Until the first step: what start-up is doing and for how long (`diagnoses.startup_status`)."""
    if run.get("waiting"):  # before any agent: the run waits for what other runs hold on its hosts
        return f'<div id="startup" class="notice">{_e(run["waiting"])}</div>'
    status = startup_status(run, ranks, time.time())
    if status is None:
        return '<div id="startup"></div>'
    return f'<div id="startup" class="notice">{_e(startup_text(status))}</div>'


def hints_html(hints: list[dict]) -> str:
    """One line per `diagnoses` hint (memory climbing, data pipeline not keeping up), or nothing."""
    if not hints:
        return '<div id="hints"></div>'
    lines = "".join(f'<li class="hint-{_e(h.get("kind"))}">{_e(h.get("message"))}</li>' for h in hints)
    return f'<div id="hints" class="alert"><strong>Hints</strong><ul>{lines}</ul></div>'


def resizes_html(resizes: list[dict]) -> str:
    """One line per resize of an elastic run (`RunMonitor.resizes`), or nothing."""
    if not resizes:
        return '<div id="resizes"></div>'
    lines = "".join(
        f'<li data-attempt="{_e(r.get("attempt"))}">attempt {_e(r.get("attempt"))} at {_e(_clock(r.get("time")))}: '
        f'{_e(r.get("from_workers"))} → {_e(r.get("to_workers"))} workers: {_e(r.get("reason"))}</li>'
        for r in resizes)
    return f'<div id="resizes" class="notice"><strong>Resizes (elastic)</strong><ul>{lines}</ul></div>'


def ranks_html(ranks: list[dict], live: bool) -> str:
    """The per-rank table; a straggler's row has class 'straggler'; live pages get a stacks button."""
    headers = ["Rank", "Host", "PID", "Phase", "Step time (excl. waits)", "Report wait", "Data wait", "Last report",
               "CPU", "RSS", "GPU", "Reports"] + (["Stacks"] if live else [])
    rows = []
    for rank in ranks:
        gpus = rank.get("gpus") or []
        gpu = "; ".join(f'{g.get("index")}: {_percent(g.get("util_percent"))}, {_bytes(g.get("memory_used_bytes"))}'
                        f' / {_bytes(g.get("memory_total_bytes"))}' for g in gpus) or "–"
        age = rank.get("last_report_age_s")
        cells = [rank.get("rank"), rank.get("host"), rank.get("pid"), rank.get("phase"),
                 _seconds(rank.get("work_time_s")), _seconds(rank.get("report_wait_s")),
                 _seconds(rank.get("data_wait_s")), "–" if age is None else f"{_seconds(age)} ago",
                 _percent(rank.get("cpu_percent")), _bytes(rank.get("rss_bytes")), gpu, rank.get("reports")]
        row = "".join(f"<td>{_e('–' if c is None else c)}</td>" for c in cells)
        if live:
            row += (f'<td><button class="stacks" data-rank="{_e(rank.get("rank"))}">Dump stacks</button></td>')
        css = ' class="straggler"' if rank.get("straggler") else ""
        rows.append(f'<tr data-rank="{_e(rank.get("rank"))}"{css}>{row}</tr>')
    return _table("ranks", headers, rows, "no rank has reported yet")


def failed_by_host(attempts: list[dict]) -> str:
    """The failed attempts grouped by their root cause's host, as the end-of-run summary says them
    (`minitrain.errors.render_failed_attempts`: the host with the most first, each cause with how many
    attempts it ended); "" when no attempt failed."""
    failed = []
    for attempt in attempts:
        root = attempt.get("root")
        if not isinstance(root, dict):
            continue
        try:
            phase = Phase[root.get("phase")]
        except KeyError:
            phase = Phase.TRAINING
        failed.append(FailedAttempt(attempt=attempt.get("attempt") or 0, host=str(root.get("host")),
                                    rank=root.get("rank") if isinstance(root.get("rank"), int) else -1,
                                    phase=phase, cause=str(root.get("cause"))))
    return render_failed_attempts(failed)


def attempts_html(attempts: list[dict]) -> str:
    """One row per attempt, with its failures and root cause, after the failed attempts grouped by host."""
    summary = failed_by_host(attempts)
    rows = []
    for attempt in attempts:
        failures = "".join(
            f'<li class="{"consequence" if f.get("consequence") else "cause"}">rank {_e(f.get("rank"))} on '
            f'{_e(f.get("host"))}: {_e(f.get("kind"))} {_e(f.get("exc_type"))} {_e(f.get("message"))}'
            f'{" (consequence)" if f.get("consequence") else ""}</li>' for f in attempt.get("failures") or [])
        outcome = "restarting" if attempt.get("restarting") else ("running" if attempt.get("ended_at") is None
                                                                   else "ended")
        rows.append(
            f'<tr><td>{_e(attempt.get("attempt"))}</td><td>{_e(_clock(attempt.get("started_at")))}</td>'
            f'<td>{_e(_clock(attempt.get("ended_at")))}</td><td>{_e(", ".join(attempt.get("hosts") or []))}</td>'
            f'<td>{_e(outcome)}</td><td><ul class="failures">{failures}</ul></td>'
            f'<td><pre class="root-cause">{_e(attempt.get("root_cause"))}</pre></td></tr>')
    table = _table("attempts", ["Attempt", "Started", "Ended", "Hosts", "Outcome", "Failures", "Root cause"],
                   rows, "no attempt yet")
    if not summary:
        return table
    return f'<pre class="failed-by-host">{_e(summary)}</pre>{table}'


def checkpoints_html(checkpoints: list[dict]) -> str:
    """One row per committed checkpoint, with its metrics, when it was committed and when it was durable
    (on storage: "in memory" until then), and whether it is kept."""
    rows = []
    for checkpoint in checkpoints:
        metrics = ", ".join(f"{k}={_value(v)}" for k, v in (checkpoint.get("metrics") or {}).items())
        kept = bool(checkpoint.get("kept"))
        durable = checkpoint.get("durable_at", "")  # absent: a run recorded before the two levels existed
        durable_text = "in memory" if durable is None else _clock(durable) if durable else ""
        rows.append(
            f'<tr class="{"kept" if kept else "deleted"}"><td>{_e(checkpoint.get("index"))}</td>'
            f'<td><code>{_e(checkpoint.get("dir"))}</code></td><td>{_e(checkpoint.get("attempt"))}</td>'
            f'<td>{_e(_clock(checkpoint.get("committed_at")))}</td><td>{_e(durable_text)}</td><td>{_e(metrics)}</td>'
            f'<td>{"kept" if kept else "deleted"}</td></tr>')
    return _table("checkpoints", ["Report", "Directory", "Attempt", "Committed", "Durable", "Metrics", "Kept"],
                  rows, "no checkpoint committed")


def goodput_html(goodput: Optional[dict]) -> str:
    """The goodput ledger (`RunMonitor.goodput()`): its line, then one row per attempt and a total row,
    the worker-seconds of each cause any attempt had (seconds, and the share of the row's own)."""
    if not goodput or not goodput.get("worker_seconds"):
        return ('<div id="goodput">' + _table("goodput-table", ["Attempt", "Ranks", "Worker-seconds"], [],
                                              "nothing measured yet") + "</div>")
    total = goodput.get("total") or {}
    causes = [c for c in CAUSES if total.get(c)] + sorted(c for c in total if c not in CAUSES and total[c])

    def row(label: Any, ranks: Any, seconds: dict, css: str = "") -> str:
        whole = sum(seconds.values())
        cells = [_e(label), _e(ranks), _e(_seconds(whole))]
        for cause in causes:
            value = seconds.get(cause) or 0.0
            cells.append(_e(f"{_seconds(value)} ({value / whole:.1%})" if whole > 0 and value else "–"))
        return f"<tr{css}>" + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>"

    rows = [row(a.get("attempt"), a.get("world_size"), a.get("seconds") or {}) for a in goodput.get("by_attempt") or ()]
    rows.append(row("total", "", total, ' class="total"'))
    caption = goodput_line(total, goodput["worker_seconds"], goodput.get("share") or 0.0)
    return (f'<div id="goodput"><p class="goodput-line">{_e(caption)}</p>'
            + _table("goodput-table", ["Attempt", "Ranks", "Worker-seconds", *causes], rows, "") + "</div>")


def parts(view: RunView, live: bool) -> dict[str, str]:
    """The page's sections by element id, as the script swaps them in."""
    run, ranks = view.run(), view.ranks()
    return {
        "overview": overview_html(run),
        "startup": startup_html(run, ranks),
        "stragglers": stragglers_html(view.straggler_history()),
        "hints": hints_html(view.hints()),
        "resizes": resizes_html(view.resizes()),
        "ranks": ranks_html(ranks, live),
        "attempts": attempts_html(view.attempts()),
        "checkpoints": checkpoints_html(view.checkpoints()),
        "goodput": goodput_html(goodput_of(view)),
    }


# Every character that could change how the HTML around the embedded JSON parses, as a JSON escape:
# "</script>" would end the element, and "<!--" followed by "<script" puts the tokenizer into a state
# where the real "</script>" no longer ends it (the page's scripts all died). U+2028/2029 are kept out
# too, for older JavaScript parsers. JSON.parse gives back exactly the same strings.
_SCRIPT_SAFE = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026",
                              "\u2028": "\\u2028", "\u2029": "\\u2029"})


def json_for_script(value: Any, to_json: Callable[[Any], str] = json.dumps) -> str:
    """`value` as JSON to embed in `<script type="application/json">`: no value can end the element
    or change how the page parses (the characters that could are JSON escapes)."""
    return to_json(value).translate(_SCRIPT_SAFE)


def page_html(view: RunView, live: bool, to_json: Callable[[Any], str] = json.dumps) -> str:
    """The whole page for the run `view` shows; `live` adds the stacks buttons and polling."""
    run = view.run()
    sections = parts(view, live)
    title = f"minitrain · {run.get('name') or 'run'}"
    data = json_for_script({"live": live, **snapshot(view)}, to_json)
    mode = "live" if live else "from storage"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_e(title)}</title>
<link rel="stylesheet" href="static/uPlot.min.css">
<link rel="stylesheet" href="static/dashboard.css">
</head><body>
<header><h1>{_e(run.get("name"))}</h1><span class="mode">{_e(mode)}</span>
<span class="run-id">run {_e(run.get("run_id"))}</span></header>
<main>
{sections["overview"]}
{sections["startup"]}
{sections["stragglers"]}
{sections["hints"]}
{sections["resizes"]}
<section><h2>Ranks</h2>{sections["ranks"]}<pre id="stack-output" hidden></pre></section>
<section><h2>Step time per rank (own work, waits excluded)</h2><div id="timeline" class="plot"></div></section>
<section><h2>Waits per step (report() and collectives: waiting for other ranks)</h2><div id="waits" class="plot"></div></section>
<section><h2>Idle share of each step (data wait, and all waits)</h2><div id="idle" class="plot"></div></section>
<section><h2>Memory (RSS) per rank, and per node against the host's total</h2><div id="memory" class="plot"></div>
<div id="node-memory" class="plot"></div></section>
<section><h2>GPU utilisation and memory (NVML)</h2><div id="gpu-util" class="plot"></div><div id="gpu-memory" class="plot"></div></section>
<section><h2>Metrics (rank 0)</h2><div id="metric-plots" class="plots"></div></section>
<section><h2>Attempts</h2>{sections["attempts"]}</section>
<section><h2>Goodput: worker-seconds by cause</h2>{sections["goodput"]}</section>
<section><h2>Checkpoints</h2>{sections["checkpoints"]}</section>
</main>
<footer>JSON: <a href="api/run">/api/run</a> · <a href="api/ranks">/api/ranks</a> ·
<a href="api/metrics">/api/metrics</a> · <a href="api/samples">/api/samples</a> ·
<a href="api/stragglers">/api/stragglers</a> · <a href="api/attempts">/api/attempts</a> ·
<a href="api/checkpoints">/api/checkpoints</a> · <a href="api/resizes">/api/resizes</a> ·
<a href="api/goodput">/api/goodput</a> · Prometheus: <a href="metrics">/metrics</a></footer>
<script type="application/json" id="initial-data">{data}</script>
<script src="static/uPlot.iife.min.js"></script>
<script src="static/dashboard.js"></script>
</body></html>
"""
