"""One report string cannot break the dashboard's page: metric names and values holding
`<!--<script>`, `</script>`, `&` or U+2028 are embedded so that the HTML parses the same way, every script
element is intact, and the embedded JSON decodes to exactly the run's values (live and post hoc)."""

from __future__ import annotations

import json
from html.parser import HTMLParser

import pytest

from dashboard_support import FixedRun
from minitrain.dashboard import DashboardServer
from minitrain.dashboard.api import snapshot
from minitrain.dashboard.pages import json_for_script, page_html
from minitrain.dashboard.server import to_json
from minitrain.dashboard.settings import DashboardAddress

HOSTILE = ["<!--<script>", "</script><script>alert(1)</script>", "a&amp;b", "x\u2028y\u2029z", "-->", "<![CDATA["]


class _Scripts(HTMLParser):
    def __init__(self):
        super().__init__()
        self.scripts: list[dict] = []
        self._open = None

    def handle_starttag(self, tag, attrs):
        if tag == "script":
            self._open = {"attrs": dict(attrs), "text": ""}

    def handle_data(self, data):
        if self._open is not None:
            self._open["text"] += data

    def handle_endtag(self, tag):
        if tag == "script" and self._open is not None:
            self.scripts.append(self._open)
            self._open = None


def _hostile_run() -> FixedRun:
    run = FixedRun()
    run._reports.append({"index": 4, "attempt": 1, "time": run.now,
                         "metrics": {name: value for name, value in zip(HOSTILE, reversed(HOSTILE))}})
    run._reports.append({"index": 5, "attempt": 1, "time": run.now, "metrics": {"loss<!--<script>": 0.5}})
    return run


def _check_page(text: str, run: FixedRun, live: bool) -> None:
    start = text.index('<script type="application/json" id="initial-data">') + len(
        '<script type="application/json" id="initial-data">')
    end = text.index("</script>", start)
    embedded = text[start:end]
    # nothing in the data can start markup: the first "</script>" after it is its own end
    assert not set(embedded) & {"<", ">", "&", "\u2028", "\u2029"}
    parser = _Scripts()
    parser.feed(text)
    parser.close()
    sources = [s["attrs"].get("src") or s["attrs"].get("id") for s in parser.scripts]
    assert sources == ["initial-data", "static/uPlot.iife.min.js", "static/dashboard.js"]
    data = json.loads(parser.scripts[0]["text"])
    assert data == json.loads(to_json({"live": live, **snapshot(run)}))
    decoded = json.dumps(data, ensure_ascii=False)
    assert all(json.dumps(text, ensure_ascii=False) in decoded for text in HOSTILE)  # every value intact


@pytest.mark.parametrize("live", [True, False])
def test_hostile_metric_names_and_values_keep_the_page_parsing(live):
    run = _hostile_run()
    _check_page(page_html(run, live, to_json), run, live)


def test_the_served_page_embeds_the_same_way():
    import http.client

    run = _hostile_run()
    with DashboardServer(run, DashboardAddress(), live=True) as board:
        connection = http.client.HTTPConnection("127.0.0.1", board.port, timeout=30)
        connection.request("GET", "/")
        response = connection.getresponse()
        assert response.status == 200
        _check_page(response.read().decode(), run, True)
        connection.close()


def test_json_for_script_round_trips_every_string():
    for text in HOSTILE + ["plain", "ünïcödé", "\u2028"]:
        encoded = json_for_script({"k" + text: text})
        assert "<" not in encoded and ">" not in encoded and "&" not in encoded
        assert json.loads(encoded) == {"k" + text: text}
