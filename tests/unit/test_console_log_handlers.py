"""LiveConsole.owning_log_handlers across overlapping runs in one process (docs/internals/tune.md,
"Concurrent runs in one driver"): a handler's stream is a console's until the last overlapping owner
leaves, in either order of leaving and when a run raises, and then exactly the original again; while
owned, a log line goes around the status block of whichever run draws one. On a real pseudo-terminal
(tests/terminal_support.py's Terminal) and with real threads."""

from __future__ import annotations

import io
import logging
import random
import threading

import pytest

from minitrain.driver import console as console_module
from minitrain.driver.console import LiveConsole
from terminal_support import screen_ending_with, terminal

JOIN_TIMEOUT_S = 60.0


@pytest.fixture(autouse=True)
def nothing_left_owned():
    yield
    left = dict(getattr(console_module, "_shared_handlers", {}))
    getattr(console_module, "_shared_handlers", {}).clear()
    assert not left, "a test left log handlers owned by a console"


def logger_writing_to(stream) -> tuple[logging.Logger, logging.StreamHandler]:
    logger = logging.getLogger("minitrain.test_console_log_handlers")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    handler = logging.StreamHandler(stream)
    logger.addHandler(handler)
    return logger, handler


@pytest.fixture
def on_terminal(terminal):
    logger, handler = logger_writing_to(terminal.out)
    yield logger, handler
    logger.removeHandler(handler)


def owned(handler: logging.Handler, original) -> bool:
    """The handler writes through a console: its stream is not the original but writes it."""
    stream = handler.stream
    return stream is not original and getattr(stream, "original", None) is original


@pytest.mark.parametrize("first_out", ["block", "lines"])
@pytest.mark.parametrize("first_in", ["block", "lines"])
def test_the_original_stream_comes_back_only_when_the_last_owner_leaves(terminal, on_terminal, first_in, first_out):
    logger, handler = on_terminal
    block = LiveConsole("block", stdout=terminal.out, stderr=terminal.out)  # the run drawing the status block
    lines = LiveConsole("lines", stdout=terminal.out, stderr=terminal.out)  # another run, a line at a time
    owning = {"block": block.owning_log_handlers(logger), "lines": lines.owning_log_handlers(logger)}
    second_in = "lines" if first_in == "block" else "block"
    last_out = "lines" if first_out == "block" else "block"

    def leave(name):
        if name == "block":
            block.finish(["block run done"])  # a run's console finishes before its handlers go back
        owning[name].__exit__(None, None, None)

    owning[first_in].__enter__()
    owning[second_in].__enter__()
    block.show(["status"])
    logger.warning("both running")
    assert owned(handler, terminal.out)
    assert screen_ending_with(terminal, "status")[-2:] == ["both running", "status"]  # above the block

    leave(first_out)
    assert owned(handler, terminal.out), f"the {last_out} run still runs: its log lines must go through a console"
    logger.warning("one running")
    if last_out == "block":  # still drawn: the line goes above it, the block is drawn again below
        assert screen_ending_with(terminal, "status")[-2:] == ["one running", "status"]
    else:
        assert screen_ending_with(terminal, "one running")[-2:] == ["block run done", "one running"]

    leave(last_out)
    assert handler.stream is terminal.out  # exactly the original
    logger.warning("none running")
    done_and_one = ["block run done", "one running"] if last_out == "lines" else ["one running", "block run done"]
    assert screen_ending_with(terminal, "none running")[-3:] == done_and_one + ["none running"]


def test_a_run_that_raises_gives_the_stream_back_only_if_it_is_the_last(terminal, on_terminal):
    logger, handler = on_terminal
    block = LiveConsole("block", stdout=terminal.out, stderr=terminal.out)
    lines = LiveConsole("lines", stdout=terminal.out, stderr=terminal.out)
    raised: dict[str, BaseException] = {}

    def run(name, console, entered, go_on):
        try:
            with console.owning_log_handlers(logger):
                entered.set()
                assert go_on.wait(JOIN_TIMEOUT_S)
                raise RuntimeError(f"{name} run failed")
        except RuntimeError as exc:
            raised[name] = exc

    events = {name: (threading.Event(), threading.Event()) for name in ("lines", "block")}
    threads = {name: threading.Thread(target=run, args=(name, console, *events[name]))
               for name, console in (("lines", lines), ("block", block))}
    for name in ("lines", "block"):  # the run that raises first is the one that took the handler first
        threads[name].start()
        assert events[name][0].wait(JOIN_TIMEOUT_S)
    block.show(["status"])

    events["lines"][1].set()
    threads["lines"].join(JOIN_TIMEOUT_S)
    assert not threads["lines"].is_alive() and str(raised["lines"]) == "lines run failed"
    assert owned(handler, terminal.out)
    logger.warning("after the failed run")
    assert screen_ending_with(terminal, "status")[-2:] == ["after the failed run", "status"]

    events["block"][1].set()  # the last owner raises too
    threads["block"].join(JOIN_TIMEOUT_S)
    assert not threads["block"].is_alive() and str(raised["block"]) == "block run failed"
    assert handler.stream is terminal.out


def test_many_overlapping_runs_on_threads_leaving_in_any_order():
    out = io.StringIO()
    logger, handler = logger_writing_to(out)
    threads_n, rounds = 6, 30
    all_in = threading.Barrier(threads_n, timeout=JOIN_TIMEOUT_S)
    orders = [random.Random(round_).sample(range(threads_n), threads_n) for round_ in range(rounds)]
    turn = threading.Condition()
    left = [0]  # how many threads have left in this round
    failures: list[str] = []

    def run(index):
        console = LiveConsole("lines", stdout=out, stderr=out)
        for round_, order in enumerate(orders):
            depth = 1 + (index + round_) % 2  # sometimes one console owns twice (nested)
            contexts = [console.owning_log_handlers(logger) for _ in range(depth)]
            for context in contexts:  # all threads join at once
                context.__enter__()
            try:
                if all_in.wait() == 0:
                    left[0] = 0
                all_in.wait()
                with turn:  # then they leave one by one, in this round's order
                    if not turn.wait_for(lambda: order[left[0]] == index, JOIN_TIMEOUT_S):
                        raise TimeoutError("no turn to leave")
                    if not owned(handler, out):
                        failures.append(f"thread {index} round {round_}, leaving as number {left[0] + 1}: not owned")
                    logger.warning("thread %d round %d", index, round_)
            except (threading.BrokenBarrierError, TimeoutError) as exc:
                failures.append(f"thread {index} round {round_}: {exc!r}")
                all_in.abort()  # the others stop waiting too
                return
            finally:
                with turn:
                    for context in reversed(contexts):
                        context.__exit__(None, None, None)
                    left[0] += 1
                    turn.notify_all()

    try:
        threads = [threading.Thread(target=run, args=(index,)) for index in range(threads_n)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(JOIN_TIMEOUT_S)
        assert not any(thread.is_alive() for thread in threads)
        assert failures == []
        assert handler.stream is out
        written = out.getvalue().splitlines()
        assert sorted(written) == sorted(f"thread {i} round {r}" for i in range(threads_n) for r in range(rounds))
    finally:
        logger.removeHandler(handler)


def test_a_handler_on_another_stream_or_set_meanwhile_is_left_alone(terminal, on_terminal):
    logger, handler = on_terminal
    elsewhere = io.StringIO()
    other = logging.StreamHandler(elsewhere)
    logger.addHandler(other)
    try:
        console = LiveConsole("lines", stdout=terminal.out, stderr=terminal.out)
        with console.owning_log_handlers(logger):
            assert other.stream is elsewhere and owned(handler, terminal.out)
            replacement = io.StringIO()
            handler.setStream(replacement)  # someone else's choice while the run goes on
        assert handler.stream is replacement and other.stream is elsewhere
    finally:
        logger.removeHandler(other)
