"""The agent's relay with real worker processes (`python -m minitrain.worker`, bootstrapped on stdin as
the agent does): a worker SIGKILLed mid-stream ends its relayed stream with exactly one `closed`, and a
`close` from the coordinator ends the worker's stream, which then exits on its own; a SIGKILLed agent's
relay directory is removed by the next relay that starts. The relay's logic is covered in process in
tests/unit/test_agent_relay.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from relay_support import Upward

from minitrain import procs
from minitrain.agent.transport.relay import DIRECTORY_PREFIX, SOCKET_NAME, RelayServer
from minitrain.records import Phase
from minitrain.rpc import socket_directory
from minitrain.rpc._gen import minitrain_pb2 as pb

TOKEN = "the-run-token"
DEADLINE_S = 120.0  # a worker imports torch before it waits for its assignment; the machine is shared


@pytest.fixture
def upward():
    return Upward(DEADLINE_S)


@pytest.fixture
def start_worker(relay):
    started = []

    def start(rank: int) -> subprocess.Popen:
        process = procs.spawn([sys.executable, "-m", "minitrain.worker"], env=dict(os.environ))
        started.append(process)
        bootstrap = {"coordinator": relay.address, "token": TOKEN, "tls_cert": "", "run_id": "run-1",
                     "attempt": 0, "rank": rank, "node_id": "node-a", "agent_pid": os.getpid(), "stack_fd": -1}
        process.stdin.write(json.dumps(bootstrap).encode() + b"\n")  # the token never on a command line
        process.stdin.close()
        return process

    yield start
    for process in started:
        procs.stop_process_group(process, grace_s=0.0)
        process.stdout.close()
        process.stderr.close()


def _stream_of(upward: Upward, rank: int) -> int:
    upward.wait_for(lambda items: any(i.message.rank == rank and i.message.HasField("hello") for i in items),
                    f"rank {rank}'s hello")
    return next(i.stream for i in upward.items if i.message.rank == rank and i.message.HasField("hello"))


def test_a_sigkilled_worker_ends_its_stream_with_exactly_one_closed(upward, start_worker):
    killed, survivor = start_worker(0), start_worker(1)
    killed_stream, survivor_stream = _stream_of(upward, 0), _stream_of(upward, 1)
    assert killed_stream != survivor_stream
    os.kill(killed.pid, signal.SIGKILL)
    assert killed.wait(DEADLINE_S) == -signal.SIGKILL
    upward.wait_for(lambda items: any(i.closed and i.stream == killed_stream for i in items), "the killed one's end")
    closed = [i for i in upward.items if i.closed]
    assert [i.stream for i in closed] == [killed_stream], "one closed, for the killed worker only"
    # Its messages all came before its end; the survivor's stream is untouched (no closed for it).
    killed_items = [i for i in upward.items if i.stream == killed_stream]
    assert killed_items[-1].closed and killed_items[0].message.hello.pid == killed.pid
    assert survivor.poll() is None


def test_a_close_from_the_coordinator_ends_the_workers_stream_and_it_exits(relay, upward, start_worker):
    worker = start_worker(0)
    number = _stream_of(upward, 0)
    upward.wait_for(lambda items: any(i.message.HasField("phase") for i in items), "its start-up phase")
    relay.deliver(pb.RelayedDown(items=[pb.RelayedCommand(stream=number, close=True)]))
    # Waiting for its assignment, the worker sees its stream end: an attempt the coordinator ended.
    assert worker.wait(DEADLINE_S) == 0, worker.stderr.read().decode()
    upward.wait_for(lambda items: any(i.closed for i in items), "the end of the stream")
    items = [i for i in upward.items if i.stream == number]
    assert [i.message.WhichOneof("body") for i in items[:-1]] == ["hello", "phase"]
    assert items[1].message.phase.phase == int(Phase.STARTUP)
    assert sum(i.closed for i in items) == 1 and items[-1].closed


# A stand-in agent: starts a relay, prints its directory, and waits to be killed.
AGENT = """
import sys, time
from minitrain.agent.transport.relay import RelayServer
relay = RelayServer("token", lambda items: None).start()
print(relay.directory, flush=True)
time.sleep(600)
"""


def test_the_directory_of_a_sigkilled_agent_is_removed_by_the_next_relay(upward):
    live = procs.spawn([sys.executable, "-c", AGENT], env=dict(os.environ))
    killed = procs.spawn([sys.executable, "-c", AGENT], env=dict(os.environ))
    try:
        live_directory = live.stdout.readline().decode().strip()
        killed_directory = killed.stdout.readline().decode().strip()
        assert os.path.isdir(live_directory) and os.path.isdir(killed_directory)
        os.kill(killed.pid, signal.SIGKILL)
        assert killed.wait(DEADLINE_S) == -signal.SIGKILL
        assert os.path.isdir(killed_directory), "nothing removes it before a relay starts"
        relay = RelayServer(TOKEN, upward.send_up).start()
        relay.stop()
        assert not os.path.exists(killed_directory)
        assert sorted(os.listdir(live_directory)) == ["owner.lock", "relay.sock"], "a live agent's was touched"
    finally:
        for process in (live, killed):
            procs.stop_process_group(process, grace_s=0.0)
            for stream in (process.stdin, process.stdout, process.stderr):
                stream.close()
    # The live one, killed by the cleanup above, is swept too: the test leaves nothing behind.
    assert live_directory in socket_directory.remove_stale(os.path.dirname(live_directory), DIRECTORY_PREFIX,
                                                           SOCKET_NAME)


# A stand-in worker: its real relayed stream, N plain reports, then SIGKILL 0 ms after the last put().
REPORTER = """
import json, os, signal, sys
from minitrain.worker.transport.local_client import LocalWorkerClient
b = json.loads(sys.stdin.readline())
client = LocalWorkerClient(b["coordinator"], b["token"], "run-1", 0, b["rank"])
client.send_hello(os.getpid(), "")
for round_ in range(b["reports"]):
    client.put(client.report_message(round_, json.dumps({"round": round_}), "", False))
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("reports", [1, 500])
def test_a_worker_killed_right_after_report_returned_loses_none_of_its_reports(relay, upward, reports):
    """What a relayed worker reported is in the kernel once put() returns: killed outright at once, its
    reports still reach the relay, in order, before its end, when the agent drains before reporting the
    exit (minitrain.agent.transport.stream.exited). No ring: plain reports never ring the doorbell."""
    worker = procs.spawn([sys.executable, "-c", REPORTER], env=dict(os.environ))
    try:
        worker.stdin.write(json.dumps({"coordinator": relay.address, "token": TOKEN, "rank": 3,
                                       "reports": reports}).encode() + b"\n")
        worker.stdin.close()
        assert worker.wait(DEADLINE_S) == -signal.SIGKILL, worker.stderr.read().decode()
    finally:
        procs.stop_process_group(worker, grace_s=0.0)
        worker.stdout.close()
        worker.stderr.close()
    assert relay.drain(DEADLINE_S)
    upward.wait_for(lambda items: any(i.closed for i in items), "the killed worker's end")
    items = upward.items
    assert items[0].message.HasField("hello") and items[-1].closed
    assert [i.message.report.round for i in items[1:-1]] == list(range(reports))
    assert [json.loads(i.message.report.metrics_json)["round"] for i in items[1:-1]] == list(range(reports))
