"""The sweep on the dashboard (minitrain.dashboard.sweep): its JSON and page from a real state file,
served by the real dashboard server on 127.0.0.1 (its access rules included), live and post hoc."""

from __future__ import annotations

import http.client
import json
import re
import threading
import time

import pytest

from minitrain.dashboard import serve
from minitrain.dashboard.__main__ import main
from minitrain.dashboard.settings import DashboardAddress
from minitrain.dashboard.sweep import (is_sweep_dir, page_html, read_sweep, sweep_routes, trial_rows,
                                      trials_address_value)
from minitrain.storage import sweep_state as tr

HEADER = {"name": "sweep<1>", "trainable": "train_func", "metric": "eval_loss", "mode": "min", "total_trials": 3}


def _sweep(tmp_path) -> str:
    done = tr.new_trial("t_00000", "train_func_00000", "train_func_00000", {"train_loop_config": {"lr": 1e-3}}, 0)
    done.status, done.iteration, done.last_result = tr.TrialStatus.TERMINATED, 10, {"eval_loss": 0.25, "training_iteration": 10}
    early = tr.new_trial("t_00001", "train_func_00001", "train_func_00001", {"train_loop_config": {"lr": 1e-5}}, 1)
    early.status, early.iteration, early.last_result = tr.TrialStatus.TERMINATED, 1, {"eval_loss": 9.5}
    early.stop_reason = "stopped early by AsyncHyperBandScheduler at iteration 1"
    failed = tr.new_trial("t_00002", "<b>bad</b>", "bad", {"train_loop_config": {"lr": 5e-3}}, 2)
    failed.status, failed.error = tr.TrialStatus.ERROR, tr.TrialError("ValueError", "boom\nmore")
    tr.write_state(str(tmp_path), HEADER, [done, early, failed])
    return str(tmp_path)


def _get(port: int, target: str, host: str = "127.0.0.1") -> tuple[int, dict, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", target, headers={"Host": f"{host}:{port}"})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def test_trial_rows_carry_status_parameters_latest_metric_iterations_and_stop_reason(tmp_path):
    rows = trial_rows(*read_sweep(_sweep(tmp_path)))
    assert [(r["name"], r["status"], r["params"], r["iterations"], r["latest"], r["stopped_early"]) for r in rows] == [
        ("train_func_00000", "TERMINATED", {"train_loop_config/lr": 1e-3}, 10, 0.25, False),
        ("train_func_00001", "TERMINATED", {"train_loop_config/lr": 1e-5}, 1, 9.5, True),
        ("<b>bad</b>", "ERROR", {"train_loop_config/lr": 5e-3}, 0, None, False)]
    assert rows[1]["stop_reason"].startswith("stopped early") and rows[2]["error"] == "ValueError: ['boom']"
    assert all(r["metric"] == "eval_loss" for r in rows)


def test_before_the_first_state_file_the_sweep_is_empty(tmp_path):
    path = tmp_path / "not-yet"
    path.mkdir()
    assert read_sweep(str(path)) == ({"name": "not-yet"}, []) and not is_sweep_dir(str(path))
    assert "no trial yet" in page_html(*read_sweep(str(path)), live=True)


def test_the_page_escapes_and_reloads_only_when_live(tmp_path):
    live = page_html(*read_sweep(_sweep(tmp_path)), live=True)
    assert '<meta http-equiv="refresh" content="2">' in live and "<script" not in live
    assert "&lt;b&gt;bad&lt;/b&gt;" in live and "<b>bad</b>" not in live
    assert "TERMINATED (stopped early)" in live and "1 ERROR, 2 TERMINATED" in live and "min eval_loss" in live
    assert re.search(r"<td>train_func_00000</td><td>TERMINATED</td><td>0\.001</td><td>10</td><td>0\.0</td>"
                     r"<td>0\.25</td>", live)
    assert "http-equiv" not in page_html(*read_sweep(str(tmp_path)), live=False)


def test_the_server_serves_the_sweep_under_the_dashboards_rules(tmp_path):
    path = _sweep(tmp_path)
    server = serve(None, DashboardAddress(), live=True, routes=sweep_routes(path, live=True))
    try:
        status, headers, body = _get(server.port, "/api/trials")
        assert status == 200 and headers["Content-Type"] == "application/json"
        assert [t["trial_id"] for t in json.loads(body)] == ["t_00000", "t_00001", "t_00002"]
        status, _, body = _get(server.port, "/api/sweep")
        assert json.loads(body) == {"name": "sweep<1>", "trainable": "train_func", "metric": "eval_loss",
                                    "mode": "min", "total_trials": 3, "trials": 3,
                                    "status_counts": {"TERMINATED": 2, "ERROR": 1}}
        for page in ("/", "/tune"):
            status, headers, body = _get(server.port, page)
            assert status == 200 and b'id="trials"' in body and "Content-Security-Policy" in headers
        assert _get(server.port, "/static/dashboard.css")[0] == 200
        assert _get(server.port, "/metrics")[0] == 404 and _get(server.port, "/api/run")[0] == 404
        assert _get(server.port, "/api/trials", host="evil.example")[0] == 403  # DNS rebinding
        # The state file is read at each request: a change shows at once.
        header, trials = tr.read_state(path)
        trials[2].status = tr.TrialStatus.RUNNING
        tr.write_state(path, header, trials)
        assert json.loads(_get(server.port, "/api/trials")[2])[2]["status"] == "RUNNING"
    finally:
        server.stop()


def test_off_loopback_the_sweep_needs_the_viewer_token(tmp_path):
    server = serve(None, DashboardAddress("0.0.0.0", 0), live=True, routes=sweep_routes(_sweep(tmp_path), True))
    try:
        assert _get(server.port, "/api/trials", host="somehost")[0] == 401
        assert _get(server.port, f"/api/trials?token={server.access.token}", host="somehost")[0] == 200
    finally:
        server.stop()


def test_trials_get_a_free_port_when_the_sweep_holds_a_fixed_one():
    assert trials_address_value("127.0.0.1:8265") == "127.0.0.1:0"
    assert trials_address_value("[::1]:8265") == "[::1]:0"
    assert trials_address_value("9000") == "127.0.0.1:0"
    for unchanged in (None, "", "0", "off", "127.0.0.1", "0.0.0.0:0"):
        assert trials_address_value(unchanged) == unchanged


def test_python_m_dashboard_recognises_a_sweep_directory(tmp_path, capsys):
    path = _sweep(tmp_path)
    assert is_sweep_dir(path)
    stop = threading.Event()
    codes = []
    thread = threading.Thread(target=lambda: codes.append(main([path], stop=stop)))
    thread.start()
    try:
        deadline, printed = time.monotonic() + 30, ""
        while "http://" not in printed and time.monotonic() < deadline:
            printed += capsys.readouterr().out
            time.sleep(0.05)
        port = int(re.search(r"http://127\.0\.0\.1:(\d+)/", printed).group(1))
        status, _, body = _get(port, "/tune")
        assert status == 200 and b"sweep, from storage" in body and b"http-equiv" not in body
        assert len(json.loads(_get(port, "/api/trials")[2])) == 3
    finally:
        stop.set()
        thread.join(30)
    assert codes == [0]


def test_the_metric_set_on_the_scheduler_only_is_the_one_shown(tmp_path):
    trial = tr.new_trial("t_0", "t0", "t0", {"lr": 0.1}, 0)
    trial.status, trial.iteration, trial.last_result = tr.TrialStatus.RUNNING, 2, {"eval_loss": 0.5, "acc": 0.9}
    tr.write_state(str(tmp_path), {**HEADER, "metric": None, "mode": None, "shown_metric": "eval_loss",
                                   "shown_mode": "min"}, [trial])
    (row,) = trial_rows(*read_sweep(str(tmp_path)))
    assert row["metric"] == "eval_loss" and row["latest"] == 0.5
    assert "<th>eval_loss</th>" in page_html(*read_sweep(str(tmp_path)), live=True)
