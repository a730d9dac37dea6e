"""A relayed worker's lease on its node agent, with real processes: a stand-in agent serving a real relay
(`minitrain.agent.transport.relay.RelayServer`, the real heartbeat) and a real worker
(`python -m minitrain.worker`, bootstrapped on stdin as the agent does), which says hello, imports torch
and waits for its assignment. While the agent runs, the worker lives past a whole lease; once the agent is
frozen (SIGSTOP), the worker ends itself within the lease, by SIGKILL to its own process group, after one
line on stderr naming the cause. Without the lease it waited for its assignment (120 s), and a training
worker waited in report() for as long as the agent stayed frozen. The lease's logic on a short clock is in
tests/unit/test_agent_relay.py."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time

import pytest

from minitrain import procs
from minitrain.lease import HEARTBEAT_INTERVAL_S, LEASE_TIMEOUT_S

TOKEN = "the-run-token"
START_DEADLINE_S = 120.0  # the worker's start (the machine is shared)
MARGIN_S = 5.0  # past the lease, for a loaded machine

# A stand-in agent: a real relay; prints its address, then the pid of each worker that says hello.
AGENT = """
import sys, time
from minitrain.agent.transport.relay import RelayServer

def send_up(items):
    for item in items:
        if item.message.HasField("hello"):
            print(item.message.hello.pid, flush=True)

relay = RelayServer(sys.stdin.readline().strip(), send_up).start()
print(relay.address, flush=True)
time.sleep(600)
"""


def _line(process: subprocess.Popen, what: str) -> str:
    """The next line `process` prints, within START_DEADLINE_S."""
    ready, _, _ = select.select([process.stdout], [], [], START_DEADLINE_S)
    assert ready, f"no {what} within {START_DEADLINE_S:g} s"
    return process.stdout.readline().decode().strip()


@pytest.fixture
def processes():
    started: list[subprocess.Popen] = []
    yield started
    for process in started:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGCONT)  # a frozen agent would not take its SIGTERM
        procs.stop_process_group(process, grace_s=0.0)
        for stream in (process.stdin, process.stdout, process.stderr):
            if stream is not None and not stream.closed:
                stream.close()


def test_a_worker_outlives_a_lease_beside_a_live_agent_and_ends_within_one_once_it_is_frozen(processes):
    agent = procs.spawn([sys.executable, "-c", AGENT], env=dict(os.environ))
    processes.append(agent)
    agent.stdin.write(TOKEN.encode() + b"\n")  # the token never on a command line
    agent.stdin.close()
    address = _line(agent, "relay address")
    worker = procs.spawn([sys.executable, "-m", "minitrain.worker"], env=dict(os.environ))
    processes.append(worker)
    bootstrap = {"coordinator": address, "token": TOKEN, "tls_cert": "", "run_id": "run-1", "attempt": 0,
                 "rank": 3, "node_id": "node-a", "agent_pid": os.getpid(), "stack_fd": -1}
    worker.stdin.write(json.dumps(bootstrap).encode() + b"\n")
    worker.stdin.close()
    assert _line(agent, "worker's hello") == str(worker.pid)

    # Alive past a whole lease while its agent runs (it imports torch meanwhile, then waits).
    with pytest.raises(subprocess.TimeoutExpired):
        worker.wait(LEASE_TIMEOUT_S + 1.0)

    os.kill(agent.pid, signal.SIGSTOP)
    frozen_at = time.monotonic()
    try:
        code = worker.wait(LEASE_TIMEOUT_S + MARGIN_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the worker of a frozen agent was alive {LEASE_TIMEOUT_S + MARGIN_S:g} s later")
    waited = time.monotonic() - frozen_at
    stderr = worker.stderr.read().decode()
    assert code == -signal.SIGKILL, stderr
    # It died of the lease: not before the agent's last heartbeat had aged a lease (at most one interval old).
    assert waited >= LEASE_TIMEOUT_S - HEARTBEAT_INTERVAL_S - 0.5, waited
    [line] = [line for line in stderr.splitlines() if "node agent" in line]
    assert line.startswith("minitrain.worker: rank 3: nothing from this worker's node agent for ")
    assert line.endswith("this worker and its process group end now")
