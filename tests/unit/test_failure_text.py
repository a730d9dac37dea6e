"""A worker's failure is bounded on its way to the driver (minitrain.worker.bootstrap.capture_failure):
message and traceback cut with head and tail kept, the pickle dropped past its limit, the full
traceback returned for the rank's log."""

from __future__ import annotations

import cloudpickle

from minitrain.records import Phase
from minitrain.rpc.convert import failure_message
from minitrain.worker.bootstrap import (MAX_EXCEPTION_PICKLE_BYTES, MAX_MESSAGE_CHARS, MAX_TRACEBACK_CHARS,
                                        capture_failure)


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:  # noqa: BLE001 - any exception, with its traceback
        return caught


def test_a_small_failure_travels_whole():
    failure, exc_pickle, full = capture_failure(0, Phase.TRAINING, _raised(ValueError("bad batch 7")))
    assert failure.message == "bad batch 7" and failure.traceback == full
    assert failure.exc_type == "ValueError"
    assert str(cloudpickle.loads(exc_pickle)) == "bad batch 7"


def test_a_huge_message_is_cut_and_its_pickle_dropped():
    text = "HEAD" + "x" * (50 * 1024 * 1024) + "TAIL"
    failure, exc_pickle, full = capture_failure(0, Phase.TRAINING, _raised(RuntimeError(text)))
    assert len(failure.message) < MAX_MESSAGE_CHARS + 200
    assert failure.message.startswith("HEAD") and failure.message.endswith("TAIL")
    assert "characters left out; the full text is in this rank's log file" in failure.message
    assert len(failure.traceback) < MAX_TRACEBACK_CHARS + 200 and failure.traceback.endswith("TAIL\n")
    assert exc_pickle == b""  # over MAX_EXCEPTION_PICKLE_BYTES: the driver rebuilds it from the text
    assert len(full) > 50 * 1024 * 1024 and "HEAD" in full  # the rank's log gets everything
    assert failure_message(failure, exc_pickle).ByteSize() < MAX_MESSAGE_CHARS + MAX_TRACEBACK_CHARS + 1024


def test_a_long_chained_traceback_keeps_its_last_exception():
    def fail():
        try:
            raise OSError("cause " + "y" * 200_000)
        except OSError as cause:
            raise KeyError("innermost") from cause

    failure, _, full = capture_failure(0, Phase.TRAINING, _raised_by(fail))
    assert len(full) > MAX_TRACEBACK_CHARS and len(failure.traceback) < MAX_TRACEBACK_CHARS + 200
    assert failure.traceback.rstrip().endswith("KeyError: 'innermost'")
    assert failure.traceback.startswith("Traceback (most recent call last):")


def _raised_by(fn) -> BaseException:
    try:
        fn()
    except BaseException as caught:  # noqa: BLE001
        return caught
    raise AssertionError("did not raise")
