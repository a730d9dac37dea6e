"""The dashboard in process: its address setting, access rules, JSON views, page and /metrics, served
by the real server on 127.0.0.1 (or on every interface for the token rules) over a fixed run."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import urllib.parse

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dashboard_support import FixedRun
from minitrain.dashboard import DashboardServer, live_dashboard
from minitrain.dashboard.auth import ACTION_HEADER, COOKIE, Access
from minitrain.dashboard.pages import overview_html, ranks_html
from minitrain.dashboard.prometheus import RUN_STATES
from minitrain.dashboard.settings import DashboardAddress, parse_address
from minitrain.errors import ConfigError
from minitrain.run_state import RunState, ray_status


# ---------------------------------------------------------------------------------- the address


@pytest.mark.parametrize(("value", "expected"), [
    (None, DashboardAddress("127.0.0.1", 0)),
    ("", DashboardAddress("127.0.0.1", 0)),
    ("8265", DashboardAddress("127.0.0.1", 8265)),
    (":8265", DashboardAddress("127.0.0.1", 8265)),
    ("0.0.0.0:8265", DashboardAddress("0.0.0.0", 8265)),
    ("node-1.example.com", DashboardAddress("node-1.example.com", 0)),
    ("[::1]:9000", DashboardAddress("::1", 9000)),
    ("localhost:0", DashboardAddress("localhost", 0)),
])
def test_addresses_it_accepts(value, expected):
    assert parse_address(value) == expected


@pytest.mark.parametrize("value", ["0", "off", "OFF", "false", "no"])
def test_values_that_turn_it_off(value):
    assert parse_address(value) is None


@pytest.mark.parametrize(("value", "why"), [
    ("127.0.0.1:http", "the port 'http'"),
    ("127.0.0.1:70000", "the port '70000'"),
    ("::1:80", "IPv6 address in brackets"),
    ("[::1", "bracketed IPv6"),
    ("bad host:1", "'bad host' is not a host name"),
])
def test_bad_values_name_the_variable_the_value_and_the_forms(value, why):
    with pytest.raises(ConfigError) as info:
        parse_address(value)
    message = str(info.value)
    assert f"MINITRAIN_DASHBOARD={value!r}" in message and why in message and "HOST:PORT" in message


def test_loopback_is_judged_by_address():
    assert DashboardAddress("127.0.0.1").is_loopback and DashboardAddress("::1").is_loopback
    assert DashboardAddress("localhost").is_loopback and DashboardAddress("127.3.2.1").is_loopback
    assert not DashboardAddress("0.0.0.0").is_loopback and not DashboardAddress("myhost").is_loopback


# ---------------------------------------------------------------------------------- access rules (pure)


def test_loopback_access_needs_a_loopback_host_header():
    access = Access(None)
    assert access.check("GET", {}, {"Host": "127.0.0.1:8265"}).status == 200
    assert access.check("GET", {}, {"Host": "localhost:8265"}).status == 200
    assert access.check("GET", {}, {"Host": "[::1]:8265"}).status == 200
    assert access.check("GET", {}, {"Host": "evil.example.com:8265"}).status == 403  # DNS rebinding
    assert access.check("GET", {}, {}).status == 403


def test_token_access_takes_bearer_query_or_cookie_and_nothing_else():
    access = Access("s3cret-token")
    host = {"Host": "node:8265"}
    assert access.check("GET", {}, host).status == 401
    assert access.check("GET", {}, {**host, "Authorization": "Bearer wrong"}).status == 401
    assert access.check("GET", {"token": ["s3cret-tokeX"]}, host).status == 401
    assert access.check("GET", {}, {**host, "Authorization": "Bearer s3cret-token"}).status == 200
    by_url = access.check("GET", {"token": ["s3cret-token"]}, host)
    assert by_url.status == 200 and by_url.set_cookie
    assert access.check("GET", {}, {**host, "Cookie": f"other=1; {COOKIE}=s3cret-token"}).status == 200
    assert access.check("GET", {}, {**host, "Cookie": f"{COOKIE}=nope"}).status == 401
    assert "HttpOnly" in access.cookie_header() and "SameSite=Strict" in access.cookie_header()


def test_actions_need_the_header_and_a_same_origin():
    access = Access(None)
    host = {"Host": "127.0.0.1:8265"}
    assert access.check("POST", {}, host).status == 403
    assert access.check("POST", {}, {**host, ACTION_HEADER: "1"}).status == 200
    assert access.check("POST", {}, {**host, ACTION_HEADER: "1", "Origin": "http://127.0.0.1:8265"}).status == 200
    assert access.check("POST", {}, {**host, ACTION_HEADER: "1", "Origin": "http://evil.example"}).status == 403


# ---------------------------------------------------------------------------------- the server


def _request(server: DashboardServer, method: str, target: str, headers: dict | None = None,
             host: str = "127.0.0.1") -> tuple[int, dict, bytes]:
    connection = http.client.HTTPConnection(host, server.port, timeout=30)
    try:
        connection.request(method, target, headers=headers or {})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


@pytest.fixture
def run_view():
    return FixedRun()


@pytest.fixture
def stacks_asked():
    return []


@pytest.fixture
def server(run_view, stacks_asked):
    def dump(rank: int) -> str:
        stacks_asked.append(rank)
        if rank > 1:
            raise LookupError(f"rank {rank} is not running")
        return f'Thread 0x1 (most recent call first):\n  File "train.py", line 3 in step of rank {rank}'

    with DashboardServer(run_view, DashboardAddress(), dump_stacks=dump) as started:
        yield started


@pytest.mark.parametrize("name", ["run", "attempts", "checkpoints", "ranks", "stragglers", "nodes"])
def test_every_view_is_the_monitors_answer(server, run_view, name):
    status, headers, body = _request(server, "GET", f"/api/{name}")
    assert status == 200 and headers["Content-Type"] == "application/json"
    # /api/stragglers lists every episode of the run (what the page shows after the run too).
    method = {"stragglers": "straggler_history"}.get(name, name)
    assert json.loads(body) == json.loads(json.dumps(getattr(run_view, method)()))


def test_metrics_and_samples_views_filter_for_polling(server, run_view):
    status, _, body = _request(server, "GET", "/api/metrics")
    assert status == 200 and [r["index"] for r in json.loads(body)] == [0, 1, 2, 3]
    _, _, body = _request(server, "GET", "/api/metrics?since_index=1")
    assert [r["index"] for r in json.loads(body)] == [2, 3]
    _, _, body = _request(server, "GET", "/api/samples?rank=1")
    samples = json.loads(body)
    assert len(samples) == 5 and {s["rank"] for s in samples} == {1}
    since = samples[2]["time"]
    _, _, body = _request(server, "GET", f"/api/samples?since={since}")
    assert {(s["rank"], s["time"]) for s in json.loads(body)} == {
        (r, t) for t in (samples[3]["time"], samples[4]["time"]) for r in (0, 1)}


def test_bad_queries_and_unknown_paths(server):
    status, _, body = _request(server, "GET", "/api/samples?rank=one")
    assert status == 400 and b"rank='one'" in body
    assert _request(server, "GET", "/api/samples?since=nan")[0] == 400
    assert _request(server, "GET", "/api/nothing")[0] == 404
    assert _request(server, "GET", "/static/../server.py")[0] == 404
    assert _request(server, "GET", "/elsewhere")[0] == 404


def test_non_finite_metrics_are_served_as_null(server, run_view):
    run_view._reports.append({"index": 4, "attempt": 1, "time": run_view.now, "metrics": {"loss": float("nan")}})
    _, _, body = _request(server, "GET", "/api/metrics?since_index=3")
    assert json.loads(body) == [{"index": 4, "attempt": 1, "time": run_view.now, "metrics": {"loss": None}}]


def test_the_page_has_every_section_rendered_and_escaped(server, run_view):
    run_view._ranks[0]["host"] = "<img src=x onerror=alert(1)>"
    run_view._reports[0]["metrics"]["</script><script>alert(1)</script>"] = 1.0
    status, headers, body = _request(server, "GET", "/")
    page = body.decode()
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert "script-src 'self'" in headers["Content-Security-Policy"] and headers["X-Content-Type-Options"] == "nosniff"
    for element in ('id="overview"', 'id="ranks"', 'id="timeline"', 'id="metric-plots"', 'id="attempts"',
                    'id="checkpoints"', 'id="stragglers" class="alert"', 'id="initial-data"'):
        assert element in page
    assert '<tr data-rank="1" class="straggler">' in page
    assert page.count('<button class="stacks"') == 2
    assert "rank 1 failed: RuntimeError: boom" in page and "checkpoint_000003" in page
    before_data, rest = page.split('<script type="application/json" id="initial-data">', 1)
    data, after_data = rest.split("</script>", 1)
    assert "<img src=x" not in before_data + after_data and "&lt;img src=x" in before_data
    assert "</script><script>alert(1)" not in page  # inside the JSON data block "</" is escaped
    assert json.loads(data)["live"] is True and json.loads(data)["ranks"][0]["host"].startswith("<img")


@pytest.mark.parametrize("name", ["uPlot.iife.min.js", "uPlot.min.css", "dashboard.js", "dashboard.css",
                                  "uPlot.LICENSE"])
def test_static_files_come_from_the_package(server, name):
    status, headers, body = _request(server, "GET", f"/static/{name}")
    assert status == 200 and len(body) > 500
    if name.endswith(".js"):
        assert headers["Content-Type"].startswith("text/javascript")


def test_parts_are_the_pages_sections(server):
    status, _, body = _request(server, "GET", "/parts")
    parts = json.loads(body)
    assert status == 200 and set(parts) == {"overview", "startup", "stragglers", "hints", "resizes", "ranks",
                                                 "attempts", "checkpoints", "goodput"}
    assert parts["ranks"].startswith('<table id="ranks">')


def test_stacks_action(server, stacks_asked):
    assert _request(server, "POST", "/api/ranks/1/stacks")[0] == 403  # no action header: refused
    assert stacks_asked == []
    status, _, body = _request(server, "POST", "/api/ranks/1/stacks", {ACTION_HEADER: "1"})
    assert status == 200 and b"step of rank 1" in body and stacks_asked == [1]
    status, _, body = _request(server, "POST", "/api/ranks/7/stacks", {ACTION_HEADER: "1"})
    assert status == 404 and b"rank 7 is not running" in body
    assert _request(server, "GET", "/api/ranks/1/stacks")[0] == 404


@pytest.mark.parametrize("rank", ["9" * 5000, "1" * 10, "-1", "\u0661", "x", "%31"])
def test_a_rank_that_is_no_rank_is_refused_in_one_line(server, stacks_asked, rank, caplog):
    """A 5,000-digit rank once reached int() (past Python's 4,300-digit limit) and wrote a traceback to
    the driver's log per request: it is refused with 400 and a short reason, and logs one short line."""
    caplog.set_level("DEBUG", logger="minitrain")
    status, _, body = _request(server, "POST", f"/api/ranks/{urllib.parse.quote(rank)}/stacks",
                               {ACTION_HEADER: "1"})
    assert status == 400 and b"is not a rank" in body and len(body) < 300, body
    assert stacks_asked == []
    assert not [r for r in caplog.records if r.exc_info or r.levelno > 10]
    assert all(len(r.getMessage()) < 400 for r in caplog.records)


def test_a_rank_outside_the_attempt_is_refused_without_asking(run_view):
    from minitrain.dashboard.stacks import StackDesk

    asked = []
    desk = StackDesk(wait_s=30)
    desk.on_run_start(_run_info(asked.append))
    desk.on_attempt_start(_attempt(2))
    with DashboardServer(run_view, DashboardAddress(), dump_stacks=desk.dump) as server:
        status, _, body = _request(server, "POST", "/api/ranks/2/stacks", {ACTION_HEADER: "1"})
    assert status == 400 and body == b"rank 2 is not in the run: the current attempt has ranks 0 to 1"
    assert asked == []


def test_a_post_hoc_server_has_no_actions(run_view):
    with DashboardServer(run_view, DashboardAddress(), live=False) as server:
        status, _, body = _request(server, "POST", "/api/ranks/0/stacks", {ACTION_HEADER: "1"})
        assert status == 409
        _, _, page = _request(server, "GET", "/")
        assert b'<button class="stacks"' not in page and b"from storage" in page


def test_a_loopback_server_refuses_a_foreign_host_header(server):
    status, _, body = _request(server, "GET", "/api/run", {"Host": "attacker.example:80"})
    assert status == 403 and b"loopback Host" in body


def test_every_interface_needs_the_viewer_token(run_view):
    with DashboardServer(run_view, DashboardAddress("0.0.0.0", 0), dump_stacks=lambda rank: "stacks") as server:
        token = server.access.token
        assert token and len(token) >= 43
        url = urllib.parse.urlsplit(server.url)
        assert url.query == f"token={token}" and url.hostname == socket.getfqdn()
        assert _request(server, "GET", "/")[0] == 401
        assert _request(server, "GET", "/metrics")[0] == 401
        assert _request(server, "GET", "/api/run", {"Authorization": "Bearer " + token[:-1] + "x"})[0] == 401
        status, headers, _ = _request(server, "GET", f"/?token={token}")
        assert status == 200 and headers["Set-Cookie"].startswith(f"{COOKIE}={token};")
        assert _request(server, "GET", "/api/ranks", {"Cookie": f"{COOKIE}={token}"})[0] == 200
        assert _request(server, "GET", "/metrics", {"Authorization": f"Bearer {token}"})[0] == 200
        assert _request(server, "POST", "/api/ranks/0/stacks", {"Cookie": f"{COOKIE}={token}"})[0] == 403
        assert _request(server, "POST", "/api/ranks/0/stacks",
                        {"Cookie": f"{COOKIE}={token}", ACTION_HEADER: "1"})[0] == 200


# ---------------------------------------------------------------------------------- /metrics


def _families(server: DashboardServer) -> dict:
    status, headers, body = _request(server, "GET", "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain; version=")
    return {family.name: family for family in text_string_to_metric_families(body.decode())}


def _value(family, **labels) -> float:
    matching = [s.value for s in family.samples if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(matching) == 1, (family.name, labels, family.samples)
    return matching[0]


def test_metrics_parse_with_the_prometheus_parser(server):
    families = _families(server)
    run_labels = {"ray_train_run_name": "demo<run>", "ray_train_run_id": "abc123"}
    state = families["ray_train_controller_state"]
    assert _value(state, ray_train_controller_state="RUNNING", **run_labels) == 1
    assert sum(s.value for s in state.samples) == 1
    step = families["minitrain_train_step_time_seconds"]
    # Step time is the rank's own work: its 10 ms in report() are excluded (they have their own series).
    assert _value(step, ray_train_worker_world_rank="0", host="h0") == pytest.approx(0.09)
    assert _value(step, ray_train_worker_world_rank="1", host="h0") == pytest.approx(0.79)
    throughput = families["minitrain_train_worker_steps_per_second"]
    assert _value(throughput, ray_train_worker_world_rank="1") == pytest.approx(1.25)
    assert _value(families["minitrain_train_straggler"], ray_train_worker_world_rank="1") == 1
    assert _value(families["minitrain_train_straggler"], ray_train_worker_world_rank="0") == 0
    assert _value(families["minitrain_train_attempts"]) == 2
    assert _value(families["minitrain_train_worker_failures"], kind="exception", consequence="false") == 1
    assert _value(families["minitrain_train_checkpoints_committed"]) == 2
    assert _value(families["minitrain_train_reported_metric"], metric="loss") == pytest.approx(0.25)
    assert "ok" not in {s.labels["metric"] for s in families["minitrain_train_reported_metric"].samples}
    assert _value(families["minitrain_train_worker_rss_bytes"], ray_train_worker_world_rank="0") == 200 * 2**20
    assert "minitrain_train_collective_wait_seconds" not in families or not \
        families["minitrain_train_collective_wait_seconds"].samples  # not measured: absent, not 0


def test_gpus_are_exported_per_device(server, run_view):
    run_view._ranks[0]["gpus"] = [{"index": 0, "util_percent": 87.0, "memory_used_bytes": 5e9,
                                   "memory_total_bytes": 8e10}]
    families = _families(server)
    assert _value(families["minitrain_train_gpu_utilization_percent"], ray_train_worker_world_rank="0",
                  gpu="0") == 87
    assert _value(families["minitrain_train_gpu_memory_total_bytes"], gpu="0") == 8e10


def test_two_dashboards_in_one_process_do_not_collide(server):
    other_run = FixedRun()
    other_run._run.update(run_id="zzz", name="second", state="FINISHED")
    with DashboardServer(other_run, DashboardAddress()) as other:
        first, second = _families(server), _families(other)
    assert _value(first["ray_train_controller_state"], ray_train_controller_state="RUNNING") == 1
    assert _value(second["ray_train_controller_state"], ray_train_run_id="zzz",
                  ray_train_controller_state="FINISHED") == 1


# ---------------------------------------------------------------------------------- lifecycle


def _serving_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "minitrain-dashboard" or "process_request" in t.name]


def test_live_dashboard_leaves_no_thread_or_port(monkeypatch, run_view, caplog):
    monkeypatch.delenv("MINITRAIN_DASHBOARD", raising=False)
    caplog.set_level("INFO", logger="minitrain")
    with live_dashboard(run_view, dump_stacks=None) as server:
        port = server.port
        assert _request(server, "GET", "/api/run")[0] == 200
        assert _serving_threads()
    assert [r.getMessage() for r in caplog.records if "dashboard" in r.getMessage()] == [
        f"dashboard: http://127.0.0.1:{port}/ (MINITRAIN_DASHBOARD=0 turns it off)"]
    assert not _serving_threads()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


def test_live_dashboard_stops_when_the_block_raises(monkeypatch, run_view):
    monkeypatch.delenv("MINITRAIN_DASHBOARD", raising=False)
    with pytest.raises(KeyError):
        with live_dashboard(run_view) as server:
            port = server.port
            raise KeyError("the run failed")
    assert not _serving_threads()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


def test_live_dashboard_off_and_bad_values(monkeypatch, run_view):
    monkeypatch.setenv("MINITRAIN_DASHBOARD", "0")
    with live_dashboard(run_view) as server:
        assert server is None
    monkeypatch.setenv("MINITRAIN_DASHBOARD", "127.0.0.1:notaport")
    with pytest.raises(ConfigError, match="MINITRAIN_DASHBOARD='127.0.0.1:notaport'"):
        with live_dashboard(run_view):
            pass


def test_a_port_in_use_is_a_config_error(monkeypatch, run_view):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        monkeypatch.setenv("MINITRAIN_DASHBOARD", f"127.0.0.1:{taken.getsockname()[1]}")
        with pytest.raises(ConfigError, match="cannot listen on 127.0.0.1"):
            with live_dashboard(run_view):
                pass


# ---------------------------------------------------------------------------------- stacks on demand


def _run_info(request) -> "RunInfo":
    from minitrain.coordinator.observers import RunInfo
    return RunInfo("id", "name", "/tmp/run", 2, 0.0, request_stacks=request)


def _attempt(world_size: int) -> "AttemptInfo":
    from minitrain.coordinator.observers import AttemptInfo
    return AttemptInfo(0, ("host",) * world_size, 0.0)


def test_the_stack_desk_answers_with_the_ranks_own_dump():
    from minitrain.coordinator.observers import StackDump
    from minitrain.dashboard.stacks import StackDesk

    desk = StackDesk(wait_s=30)
    asked = []

    def request(rank):  # the controller answers from its own thread, other ranks of the node first
        asked.append(rank)
        threading.Thread(target=lambda: [desk.on_stacks(StackDump(0, other, f"stack of {other}"))
                                         for other in (1 - rank, rank)]).start()

    desk.on_run_start(_run_info(request))
    desk.on_attempt_start(_attempt(2))
    assert desk.dump(1) == "stack of 1" and desk.dump(0) == "stack of 0" and asked == [1, 0]


def test_the_stack_desk_says_why_there_is_no_answer():
    from minitrain.dashboard.stacks import StackDesk

    desk = StackDesk(wait_s=0.2)
    with pytest.raises(LookupError, match="not started"):
        desk.dump(0)
    asked = []
    desk.on_run_start(_run_info(asked.append))
    with pytest.raises(LookupError, match="not started"):  # no attempt yet: no rank to ask
        desk.dump(0)
    desk.on_attempt_start(_attempt(4))
    with pytest.raises(LookupError, match="rank 3 sent no stacks"):  # a rank that is not running never answers
        desk.dump(3)
    with pytest.raises(ValueError, match="rank 4 is not in the run: the current attempt has ranks 0 to 3"):
        desk.dump(4)  # outside the attempt: refused without asking
    assert asked == [3]
    desk.on_run_end(None)
    with pytest.raises(LookupError, match="the run ended"):
        desk.dump(0)


# ---------------------------------------------------------------------------------- the post-hoc CLI


def test_the_cli_refuses_a_directory_without_a_run(tmp_path, capsys):
    from minitrain.dashboard.__main__ import main

    assert main([str(tmp_path)]) == 2
    assert "holds no minitrain run" in capsys.readouterr().err


def test_the_cli_refuses_a_bad_address(tmp_path, capsys):
    from minitrain.dashboard.__main__ import main

    assert main([str(tmp_path), "--host", "bad host"]) == 2
    assert "--host='bad host'" in capsys.readouterr().err
    assert main([str(tmp_path), "--port", "70000"]) == 2
    assert "port from 0 to 65535" in capsys.readouterr().err


def test_the_overview_marks_the_end_and_colours_the_state_from_the_run_state():
    """The page names no state itself: pages.py reads the word back into a RunState, colours the
    badge by it and marks the terminal states (the script stops polling on data-ended)."""
    S = RunState
    tones = {S.RUNNING: "running", S.SUCCEEDED: "ok", S.FAILED: "bad", S.ABORTED: "bad"}
    for state in RunState:
        page = overview_html({"state": ray_status(state)})
        assert f'data-state="{ray_status(state)}"' in page and f">{ray_status(state)}</span>" in page
        assert f'data-ended="{"true" if state.is_terminal else "false"}"' in page
        assert f'class="state state-{tones.get(state, "busy")}"' in page
    assert 'data-ended="false"' in overview_html({})


def test_the_controller_state_gauge_has_a_series_for_every_run_state():
    assert RUN_STATES == tuple(ray_status(state) for state in RunState)
    assert {"PENDING", "LAUNCHING", "STARTING", "FINISHED", "ERRORED", "ABORTED"} <= set(RUN_STATES)


def test_an_elastic_runs_resizes_are_a_section_of_their_own():
    from minitrain.dashboard.pages import resizes_html

    assert resizes_html([]) == '<div id="resizes"></div>'
    html = resizes_html([{"attempt": 1, "from_workers": 2, "to_workers": 1, "reason": "host <h1> lost", "time": 0.0}])
    assert html.startswith('<div id="resizes" class="notice">') and "2 → 1 workers: host &lt;h1&gt; lost" in html


def test_the_ranks_table_shows_sub_millisecond_waits_as_such():
    """A wait of a fraction of a millisecond reads in µs, not "0 ms"; a few milliseconds keep a decimal."""
    row = {"rank": 0, "work_time_s": 0.0123, "report_wait_s": 0.00025, "data_wait_s": 0.0034,
           "last_report_age_s": 0.0}
    cells = ranks_html([row], live=False)
    assert "<td>12 ms</td><td>250 µs</td><td>3.4 ms</td><td>0 ms ago</td>" in cells
