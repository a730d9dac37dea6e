"""The agent's signal handlers take no lock (minitrain.agent.agent.install_signal_handlers): a handler
runs on the main thread between two bytecodes, possibly while that thread holds the lock it would
need. Found by the fault suite: SIGTERM (parent-death signal) and SIGHUP arriving together deadlocked
the agent of a SIGKILLed driver inside Event.set(), and it never exited."""

from __future__ import annotations

import faulthandler
import os
import signal
import threading

import pytest

from minitrain.agent.agent import NodeAgent, install_signal_handlers


@pytest.fixture
def agent():
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers are installed from the main thread only")
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    node_agent = NodeAgent("127.0.0.1:1", "node", "run", "token")
    install_signal_handlers(node_agent)
    # A regression deadlocks this thread: end the process with every stack rather than hang the suite.
    faulthandler.dump_traceback_later(30, exit=True)
    try:
        yield node_agent
    finally:
        faulthandler.cancel_dump_traceback_later()
        for signum, handler in saved.items():
            signal.signal(signum, handler)


def test_signals_inside_a_held_lock_are_noted_without_taking_it(agent):
    with agent._stream._ended._cond:  # the main thread is inside Event.set() or wait() when the signals land
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGHUP)
        for _ in range(1000):  # the handlers run between bytecodes of this thread
            if agent._signalled is not None:
                break
    assert agent._signalled == "received SIGTERM"
    assert not agent._stream.ended  # the command loop acts on it, outside any handler


def test_a_preemption_signal_is_noted_and_wakes_the_loop_without_stopping_the_agent(agent):
    saved = signal.getsignal(signal.SIGUSR2)
    try:
        agent._install_preemption_handlers(("SIGUSR2", "SIGTERM"))
        with agent._stream._ended._cond:  # inside a held lock, as above
            os.kill(os.getpid(), signal.SIGUSR2)
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):
                if len(agent._preemptions) == 2:
                    break
        assert [name for name, _ in agent._preemptions] == ["SIGUSR2", "SIGTERM"]
        assert agent._signalled is None and not agent._stream.ended  # the coordinator decides, not the agent
        assert agent._stream.next_command(timeout_s=0.0) is None  # the handler woke the command loop
    finally:
        signal.signal(signal.SIGUSR2, saved)


def test_sigterm_after_the_parent_died_stops_the_agent_as_before(agent):
    agent._install_preemption_handlers(("SIGTERM",))
    agent._parent_pid = -1  # as if the parent that started it were gone (the parent-death signal)
    os.kill(os.getpid(), signal.SIGTERM)
    for _ in range(1000):
        if agent._signalled is not None:
            break
    assert agent._signalled == "received SIGTERM" and not agent._preemptions
