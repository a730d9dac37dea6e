"""What a trial process and the sweep loop say to each other, and the one codec of the wire (L3).

A trial process (minitrain.tune.trial_process) writes `TrialMessage`s on its report pipe, one JSON
object a line: `TrialStarting` whenever a fit() of the trial moves to another start-up phase before its
first result, a `TrialReported` per result, then exactly one of `TrialFinished`, `TrialFailed`,
`TrialInterrupted` before it exits. The sweep loop (minitrain.tune.sweep_loop) answers each
`TrialReported` with one `Decision` line on the trial's stdin. Only this module turns these records
into text and back: `encode`/`decode` for the report pipe, `encode_decision`/`decode_decision` for
the answers. The pipe carries JSON only; a `TrialFailed` may hold the exception pickled (base64), which
the tuner unpickles only to hand it back to the caller who started this trial process (as fit() does
with a worker's exception), never from storage.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, Optional, Union

from minitrain.storage.sweep_state import TrialError


@dataclass(frozen=True)
class TrialStarting:
    """A fit() of the trial is starting: `phase` says what it is doing, in the run's own start-up words
    (`minitrain.monitoring.diagnoses.startup_phase`). Nothing answers it."""

    phase: str


@dataclass(frozen=True)
class TrialReported:
    """One result of the trial: its metrics (JSON values) and the checkpoint directory it reported
    with them, if any. The trial waits for the loop's `Decision` before it goes on."""

    metrics: dict
    checkpoint: Optional[str] = None


@dataclass(frozen=True)
class TrialFinished:
    """The trainable returned (`stopped`: False), or ended because the loop answered STOP (True)."""

    stopped: bool


@dataclass(frozen=True)
class TrialFailed:
    """The trainable raised: `error` is the exception as text (the trial may be retried); `pickled` the
    exception itself (cloudpickle bytes, base64), when it could be pickled."""

    error: TrialError
    pickled: Optional[str] = None


@dataclass(frozen=True)
class TrialInterrupted:
    """The trial was stopped by Ctrl-C (SIGINT from the tuner) before it finished: resumable."""


TrialMessage = Union[TrialStarting, TrialReported, TrialFinished, TrialFailed, TrialInterrupted]


class Decision(str, Enum):
    """The loop's answer to a `TrialReported`: go on, or stop the trial (the scheduler's STOP, the
    time budget, Ctrl-C)."""

    CONTINUE = "continue"
    STOP = "stop"


class MalformedMessage(ValueError):
    """A line on the report pipe that is not a `TrialMessage` (names the line and what is wrong)."""


# The wire name of each message ("type" in its JSON object) and how its fields become JSON values.
_ENCODERS: dict[type, tuple[str, Callable[[Any], dict]]] = {
    TrialStarting: ("starting", lambda m: {"phase": m.phase}),
    TrialReported: ("result", lambda m: {"metrics": m.metrics, "checkpoint": m.checkpoint}),
    TrialFinished: ("done", lambda m: {"stopped": m.stopped}),
    TrialFailed: ("error", lambda m: {"exc_type": m.error.exc_type, "message": m.error.message,
                                      "traceback": m.error.traceback,
                                      **({"pickled": m.pickled} if m.pickled else {})}),
    TrialInterrupted: ("interrupted", lambda m: {}),
}


def encode(message: TrialMessage) -> str:
    """`message` as one line of the report pipe (ends with a newline). ValueError/TypeError when the
    metrics are not JSON values."""
    kind, fields = _ENCODERS[type(message)]
    return json.dumps({"type": kind, **fields(message)}) + "\n"


def _field(data: dict, name: str, kinds: tuple, optional: bool = False) -> Any:
    value = data.get(name)
    if value is None and optional:
        return None
    if not isinstance(value, kinds):
        wanted = " or ".join(k.__name__ for k in kinds)
        raise MalformedMessage(f"field {name!r} must be {wanted}, got {type(value).__name__}")
    return value


_DECODERS: dict[str, Callable[[dict], TrialMessage]] = {
    "starting": lambda d: TrialStarting(_field(d, "phase", (str,))[:200]),
    "result": lambda d: TrialReported(_field(d, "metrics", (dict,)), _field(d, "checkpoint", (str,), optional=True)),
    "done": lambda d: TrialFinished(_field(d, "stopped", (bool,))),
    "error": lambda d: TrialFailed(TrialError(_field(d, "exc_type", (str,)), _field(d, "message", (str,)),
                                              _field(d, "traceback", (str,))),
                                   _field(d, "pickled", (str,), optional=True)),
    "interrupted": lambda d: TrialInterrupted(),
}


def decode(line: str) -> TrialMessage:
    """The message of one report-pipe line; `MalformedMessage` (a ValueError) naming the line when it
    is not JSON, not an object, of an unknown type or with a missing or mistyped field."""
    try:
        data = json.loads(line)
    except ValueError as exc:
        raise MalformedMessage(f"not JSON ({exc}): {line[:200]!r}") from None
    if not isinstance(data, dict):
        raise MalformedMessage(f"not a JSON object: {line[:200]!r}")
    kind = data.get("type")
    decoder = _DECODERS.get(kind) if isinstance(kind, str) else None
    if decoder is None:
        raise MalformedMessage(f"unknown message type {data.get('type')!r}: {line[:200]!r}")
    try:
        return decoder(data)
    except MalformedMessage as exc:
        raise MalformedMessage(f"{kind} message: {exc}: {line[:200]!r}") from None


def encode_decision(decision: Decision) -> bytes:
    """`decision` as one line of the trial's stdin."""
    return (Decision(decision).value + "\n").encode()


def decode_decision(line: Any) -> Decision:
    """The decision of one stdin line (bytes or str). Anything but CONTINUE, an empty line (the loop
    is gone) included, is STOP: a trial never outlives its sweep."""
    text = (line.decode(errors="replace") if isinstance(line, bytes) else str(line)).strip()
    return Decision.CONTINUE if text == Decision.CONTINUE.value else Decision.STOP
