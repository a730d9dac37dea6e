"""A metric name with a lone surrogate: report() refuses it naming the key, and /metrics stays 200
for data that holds one anyway (a run directory written by an older version)."""

from __future__ import annotations

import http.client

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dashboard_support import FixedRun
from minitrain.dashboard import DashboardServer
from minitrain.dashboard.settings import DashboardAddress
from minitrain.metrics import encode_metrics

LONE = "loss\udcff"


@pytest.mark.parametrize("metrics, key", [
    ({LONE: 1.0}, LONE),
    ({"note": "bad\ud800"}, "note"),
    ({"nested": {"deep": ["ok", "x\udfff"]}}, "nested/deep[1]"),
])
def test_report_refuses_a_lone_surrogate_naming_the_key(metrics, key):
    with pytest.raises(ValueError) as info:
        encode_metrics(metrics)
    assert f"metrics[{key!r}]" in str(info.value) and "lone surrogate" in str(info.value)


def test_report_keeps_characters_outside_the_basic_plane():
    assert encode_metrics({"😀": "ok 𝄞"}) == '{"\\ud83d\\ude00": "ok \\ud834\\udd1e"}'


def test_metrics_stays_200_with_a_lone_surrogate_in_the_data():
    run = FixedRun()
    run._reports.append({"index": 4, "attempt": 1, "time": run.now, "metrics": {LONE: 2.0}})
    run._run["name"] = "run\ud800"
    with DashboardServer(run, DashboardAddress()) as board:
        for _ in range(2):  # and for the rest of the run
            connection = http.client.HTTPConnection("127.0.0.1", board.port, timeout=30)
            connection.request("GET", "/metrics")
            response = connection.getresponse()
            body = response.read().decode("utf-8")
            connection.close()
            assert response.status == 200
        families = {f.name: f for f in text_string_to_metric_families(body)}
        metrics = {s.labels["metric"]: s.value for s in families["minitrain_train_reported_metric"].samples}
        assert metrics["loss\\udcff"] == 2.0
        connection = http.client.HTTPConnection("127.0.0.1", board.port, timeout=30)
        connection.request("GET", "/")
        assert connection.getresponse().status == 200  # the page too
        connection.close()
