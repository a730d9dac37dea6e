"""The trial process <-> sweep loop messages (minitrain.tune.messages): every message survives its
one codec, a malformed line is a clear MalformedMessage (never a KeyError), and a decision line
other than CONTINUE stops the trial."""

from __future__ import annotations

import json
import math

import pytest

from minitrain.storage.sweep_state import TrialError
from minitrain.tune import messages
from minitrain.tune.messages import (Decision, MalformedMessage, TrialFailed, TrialFinished, TrialInterrupted,
                                     TrialReported, TrialStarting)

EVERY_MESSAGE = [
    TrialStarting("rendezvous (process-group init)"),
    TrialReported({"loss": 0.25, "nested": {"a": [1, 2]}, "name": "x"}, "/tmp/trial/checkpoint_000001"),
    TrialReported({"loss": 1.0}),
    TrialFinished(stopped=True),
    TrialFinished(stopped=False),
    TrialFailed(TrialError("builtins.ValueError", "boom\nsecond line", "Traceback ...\nValueError: boom")),
    TrialInterrupted(),
]


@pytest.mark.parametrize("message", EVERY_MESSAGE, ids=lambda m: type(m).__name__)
def test_every_message_round_trips_as_one_json_line(message):
    line = messages.encode(message)
    assert line.endswith("\n") and line.count("\n") == 1
    assert isinstance(json.loads(line), dict)
    assert messages.decode(line) == message


def test_every_message_kind_has_an_encoder_and_a_decoder():
    assert {type(m) for m in EVERY_MESSAGE} == set(messages._ENCODERS)
    assert {kind for kind, _ in messages._ENCODERS.values()} == set(messages._DECODERS)


def test_non_finite_metrics_round_trip():
    decoded = messages.decode(messages.encode(TrialReported({"loss": float("nan"), "x": float("inf")})))
    assert math.isnan(decoded.metrics["loss"]) and decoded.metrics["x"] == float("inf")


def test_the_wire_format_is_the_json_lines_the_trial_process_has_always_written():
    assert json.loads(messages.encode(TrialReported({"a": 1}, None))) == {"type": "result", "metrics": {"a": 1},
                                                                            "checkpoint": None}
    assert json.loads(messages.encode(TrialFinished(True))) == {"type": "done", "stopped": True}
    assert json.loads(messages.encode(TrialInterrupted())) == {"type": "interrupted"}
    assert json.loads(messages.encode(TrialFailed(TrialError("E", "m", "t")))) == {
        "type": "error", "exc_type": "E", "message": "m", "traceback": "t"}


@pytest.mark.parametrize("line, says", [
    ('{"type": "result", "metrics": {"a": 1', "not JSON"),
    ("[1, 2]", "not a JSON object"),
    ('{"metrics": {}}', "unknown message type None"),
    ('{"type": "hello"}', "unknown message type 'hello'"),
    ('{"type": ["result"]}', "unknown message type ['result']"),
    ('{"type": "result"}', "result message: field 'metrics' must be dict, got NoneType"),
    ('{"type": "result", "metrics": {}, "checkpoint": 3}', "field 'checkpoint' must be str, got int"),
    ('{"type": "done"}', "done message: field 'stopped' must be bool"),
    ('{"type": "error", "exc_type": "E", "message": "m"}', "error message: field 'traceback' must be str"),
])
def test_a_malformed_line_is_a_malformed_message_naming_what_is_wrong(line, says):
    with pytest.raises(MalformedMessage) as caught:
        messages.decode(line)
    assert says in str(caught.value) and isinstance(caught.value, ValueError)


def test_decisions_round_trip_and_anything_but_continue_is_stop():
    for decision in Decision:
        assert messages.decode_decision(messages.encode_decision(decision)) is decision
        assert messages.decode_decision(messages.encode_decision(decision).decode()) is decision
    assert messages.encode_decision(Decision.CONTINUE) == b"continue\n"
    for gone in (b"", "", b"\n", b"garbage\n"):
        assert messages.decode_decision(gone) is Decision.STOP
