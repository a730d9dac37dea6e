"""The fork server's two stages, with real processes: while its slow preloads run, a quick server forks
workers from the state before them; once they are done the fork server itself answers, and no request
is lost in the hand-over (minitrain.worker.fork_server)."""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import tempfile
import time

import psutil
import pytest

from minitrain.worker import fork_server

DEADLINE_S = 60.0
WARM_SEEN: set = set()  # the sockets on which the fork server said its preloads were done

# The fork server under test: its `then` (the slow preloads) runs until the test creates a file. A
# forked worker prints whether `then` had finished in the state it was forked from, then exits once
# its stdin is closed.
SERVER = r"""
import json, os, sys, time
from minitrain.worker import fork_server

state = {"preloaded": False}

def preload():
    while not os.path.exists(sys.argv[2]):
        time.sleep(0.01)
    state["preloaded"] = True

stack_fd = fork_server.serve(int(sys.argv[1]), then=preload)
print(json.dumps({"preloaded": state["preloaded"], "stack_fd_open": os.fstat(stack_fd) is not None}), flush=True)
sys.stdin.read()  # until the test closes the worker's stdin
os._exit(0)
"""


def _answer(sock: socket.socket) -> dict:
    """The fork server's next answer (past its WARM, which may come between two answers)."""
    sock.settimeout(DEADLINE_S)
    reply = sock.recv(4096)
    if reply == fork_server.WARM:  # the preloads finished meanwhile
        WARM_SEEN.add(sock.fileno())
        reply = sock.recv(4096)
    return json.loads(reply)


def _fork(sock: socket.socket) -> dict:
    """Ask for a worker; its reply and the line it printed."""
    stdin_r, stdin_w = os.pipe()
    stdout_r, stdout_w = os.pipe()
    stderr_r, stderr_w = os.pipe()
    stack_fd, _ = tempfile.mkstemp()
    try:
        socket.send_fds(sock, [fork_server.FORK], [stdin_r, stdout_w, stderr_w, stack_fd])
        [reply] = _answer(sock)["workers"]
    finally:
        for fd in (stdin_r, stdout_w, stderr_w, stack_fd, stdin_w):
            os.close(fd)
    with os.fdopen(stdout_r) as out, os.fdopen(stderr_r) as err:
        line = out.readline()  # end of file only when the worker exits: no sleep needed
        assert line, err.read()
    return {**reply, **json.loads(line)}


@pytest.fixture
def server(tmp_path):
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    release = tmp_path / "preloads-may-finish"
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(theirs.fileno()), str(release)],
                            pass_fds=(theirs.fileno(),), start_new_session=True)
    theirs.close()
    try:
        ours.settimeout(DEADLINE_S)
        assert ours.recv(4096) == fork_server.READY
        yield ours, release, proc
    finally:
        ours.close()  # the fork server exits when the agent's end closes
        try:
            proc.wait(timeout=DEADLINE_S)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()


def _children(pid: int) -> list[int]:
    """The living children of `pid` (a child that exited but was not reaped yet does not count)."""
    living = []
    for child in psutil.Process(pid).children():
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                living.append(child.pid)
        except psutil.NoSuchProcess:
            continue
    return living


def _wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_workers_are_forked_during_the_slow_preloads_and_from_the_server_after_them(server):
    sock, release, proc = server
    early = [_fork(sock), _fork(sock)]  # the preloads are still running: the quick server answers
    assert [w["preloaded"] for w in early] == [False, False] and early[0]["pid"] != early[1]["pid"]
    assert len(_children(proc.pid)) == 1  # the quick server, the fork server's only child
    release.touch()
    _wait_until(lambda: not _children(proc.pid), "the quick server did not stop once the preloads were done")
    late = _fork(sock)
    assert late["preloaded"] is True and late["stack_fd_open"]
    assert sock.fileno() in WARM_SEEN  # said once the preloads were done, before the answer it gave after them
    assert proc.poll() is None


def test_a_request_sent_during_the_hand_over_is_answered(server):
    sock, release, proc = server
    release.touch()  # the hand-over happens while requests come: each gets exactly one answer
    answers = [_fork(sock) for _ in range(5)]
    assert len({a["pid"] for a in answers}) == 5
    _wait_until(lambda: not _children(proc.pid), "the quick server did not stop")
    assert _fork(sock)["preloaded"] is True and sock.fileno() in WARM_SEEN


def test_one_request_forks_several_workers_each_holding_only_its_own_pipes(server):
    """A node's local ranks are forked in one request (side by side); no worker holds another's
    descriptors: one worker's output ends when it exits, while the others still run. A request whose
    descriptors do not come in fours is refused and leaves the server serving."""
    sock, release, proc = server
    release.touch()
    _wait_until(lambda: not _children(proc.pid), "the quick server did not stop")
    count = 3
    pipes = [(os.pipe(), os.pipe(), os.pipe(), tempfile.mkstemp()[0]) for _ in range(count)]
    try:
        socket.send_fds(sock, [fork_server.FORK],
                        [fd for (i, o, e, stack) in pipes for fd in (i[0], o[1], e[1], stack)])
        answers = _answer(sock)["workers"]
    finally:
        for (i, o, e, stack) in pipes:
            for fd in (i[0], o[1], e[1], stack):
                os.close(fd)
    pids = [a["pid"] for a in answers]
    assert len(set(pids)) == count and proc.pid not in pids
    outputs = [os.fdopen(o[0]) for (_, o, _, _) in pipes]
    try:
        assert all(json.loads(out.readline())["preloaded"] for out in outputs)  # each printed its line
        # The last worker's stdin closes: it exits and its output ends while the others still run. Were its
        # stdout's write end held by another worker (one forked while it was still open in the server), the
        # end would not come.
        os.close(pipes[-1][0][1])
        ready, _, _ = select.select([outputs[-1]], [], [], DEADLINE_S)
        assert ready and outputs[-1].read() == "", "the last worker's output did not end with it"
        assert all(psutil.pid_exists(pid) for pid in pids[:-1])
    finally:
        for index, (i, _, e, _) in enumerate(pipes):
            if index < count - 1:
                os.close(i[1])
            os.close(e[0])
        for out in outputs:
            out.close()
    bad_r, bad_w = os.pipe()
    socket.send_fds(sock, [fork_server.FORK], [bad_r, bad_w, bad_r])
    os.close(bad_r)
    os.close(bad_w)
    assert "bad request" in _answer(sock)["error"]
    assert _fork(sock)["preloaded"] is True  # still serving


def test_the_quick_server_exits_when_the_agent_closes_its_end(server):
    sock, release, proc = server
    assert _fork(sock)["preloaded"] is False
    quick = _children(proc.pid)
    sock.close()
    _wait_until(lambda: not _children(proc.pid), "the quick server outlived the agent's end of the socket")
    release.touch()  # the fork server then finds the socket closed after its preloads, and exits
    assert proc.wait(timeout=DEADLINE_S) == 0 and quick


def test_the_pool_says_ready_once_a_real_fork_server_imported_torch(tmp_path):
    """What the agent answers to an elastic run's warm-up (`ForkServerPool.readiness`): nothing while
    the server imports, ready once every preload is done (its WARM, after torch._dynamo); the pool's
    server is the real `python -m minitrain.worker`, and it still forks a worker after that."""
    from minitrain.agent.fork_servers import ForkServerPool

    pool = ForkServerPool()
    pool.want(("key",), dict(os.environ), str(tmp_path))
    pool.refill()
    try:
        assert pool.readiness() is None  # an interpreter started microseconds ago has not imported torch
        _wait_until(lambda: pool.readiness() is not None, "the fork server never said ready")
        assert pool.readiness() == (True, "") and pool.server.ready and pool.server.warm
        [started] = pool.take(("key",))
        assert started is not None  # the WARM datagram did not stand in for the fork's answer
        started.process.stdin.close()  # no bootstrap line: the worker exits
        assert started.process.wait(timeout=DEADLINE_S) != 0
        os.close(started.stack_fd)
    finally:
        pool.clear()


def test_the_pool_says_there_will_be_no_fork_server_when_it_keeps_dying(tmp_path):
    from minitrain.agent import fork_servers

    pool = fork_servers.ForkServerPool()
    # An interpreter that cannot start (no standard library under PYTHONHOME) exits at once, each time.
    pool.want(("key",), {**os.environ, "PYTHONHOME": str(tmp_path / "nowhere")}, str(tmp_path))
    try:
        def answer():
            pool.refill()  # the agent's idle loop restarts a dead server, MAX_SERVER_STARTS times at most
            return pool.readiness()

        _wait_until(lambda: answer() is not None, "the pool never gave up")
        assert pool.readiness() == (False, f"its fork server exited {fork_servers.MAX_SERVER_STARTS} times")
        pool.clear()
        pool.want(("key",), dict(os.environ), str(tmp_path / "missing"))  # a cwd that does not exist
        pool.refill()
        assert pool.readiness() == (False, "no fork server could be started")
    finally:
        pool.clear()
