"""`metrics.jsonl` lines written from the worker's own JSON text are the lines encoding the parsed dict
would give (the driver no longer encodes rank 0's metrics again), and text that spans lines, which a
JSON Lines file cannot hold, is encoded again instead."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minitrain.coordinator.facts.metrics_log import MetricsLog
from minitrain.metrics import encode_metrics
from minitrain.storage.filesystem import Storage
from minitrain.storage.layout import METRICS_NAME, split_metrics_lines

VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                      lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                   max_size=3), max_leaves=8)
METRICS = st.dictionaries(st.text(max_size=8), VALUES, max_size=5)


def _line(metrics, text: str, index=3, attempt=1, at=1795780000.25) -> str:
    """The line `append` queues (a clock that never moves: nothing is flushed, no storage is needed)."""
    log = MetricsLog(None, clock=lambda: 0.0)
    log.append(metrics, index, attempt, at, text)
    return log._lines[0]


@settings(max_examples=300, deadline=None)
@given(METRICS, st.floats(min_value=0, max_value=2e9))
def test_a_line_from_the_workers_text_is_the_line_of_the_parsed_dict(metrics, at):
    try:
        text = encode_metrics(metrics)
    except ValueError:  # a lone surrogate: refused by report() already
        return
    parsed = json.loads(text)
    assert _line(parsed, text, at=at) == _line(parsed, "", at=at)


def test_text_that_spans_lines_is_encoded_again_and_the_file_stays_one_entry_a_line(tmp_path):
    storage = Storage.for_run(str(tmp_path), "run")
    storage.makedirs()
    log = MetricsLog(storage)
    pretty = json.dumps({"loss": 0.5, "nested": {"a": [1, 2]}}, indent=2)
    log.append(json.loads(pretty), 0, 0, 1.0, pretty)
    log.append({"loss": math.nan}, 1, 0, 2.0, encode_metrics({"loss": math.nan}))
    log.flush()
    entries, intact = split_metrics_lines(storage.read_text(METRICS_NAME))
    assert [e["report_index"] for e in entries] == [0, 1] and entries[0]["metrics"]["nested"] == {"a": [1, 2]}
    assert math.isnan(entries[1]["metrics"]["loss"])
    assert intact == len(storage.read_text(METRICS_NAME))


@pytest.mark.parametrize("text", ["", None])
def test_without_the_text_the_dict_is_encoded(text):
    assert json.loads(_line({"x": 1}, text or "")) == {"metrics": {"x": 1}, "report_index": 3, "attempt": 1,
                                                       "time": 1795780000.25}
