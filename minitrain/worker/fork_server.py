"""The fork server: a worker process that imported torch once and forks ready workers.

A restart spends most of its time starting Python and importing torch in each new worker. A node
agent that may restart keeps one fork server per (environment, working directory): it imports torch and
DDP's dependencies once, without touching CUDA or running a torch op (so no thread pool or device
context is copied into a fork), then waits on a Unix socket shared with the agent. For each request
it forks a worker in milliseconds, and the worker goes on exactly as a freshly started one would:
it reads its bootstrap line on stdin and runs.

Protocol (SOCK_SEQPACKET, one message per datagram; `minitrain.rpc.fork_protocol` owns the datagrams):
the fork server sends b"ready" once its imports are done (torch.distributed: it can fork workers) and
b"warm" once its slower preloads are done too (see below: a worker forked from then on pays for none of
them). The agent sends b"fork" with four file descriptors per worker (SCM_RIGHTS), for one to
MAX_FORKS_PER_REQUEST workers: the read end of the worker's stdin pipe, the write ends of its stdout
and stderr pipes, and its stack-dump file. The fork server answers {"workers": [{"pid": N} or
{"error": "..."}, ...]} in the request's order (or {"error": "..."} for a request it cannot read) as JSON.
One request for all of a node's local ranks: the intermediates (below) fork their workers while the
fork server forks the next intermediate, so the ranks are forked side by side instead of one after the
other (each double fork of a process holding torch is ~35 ms on a 2-core VM: 0.3 s for 8 ranks).

Two stages, so that a restart never waits for the slow imports: as soon as torch.distributed is imported
the fork server sends b"ready" and forks a *quick server* that answers fork requests from that state
while the fork server itself goes on with the slower preloads (`then`: torch._dynamo, over a second).
When those are done it tells the quick server to stop (a pipe), waits for it to finish the request it
may be serving, and answers the requests from then on, its workers paying for none of those imports.
Both read the same socket, one after the other: a request is never lost in the hand-over. The
quick server dies with the fork server (parent-death signal) and is in its process group.

The worker is double-forked: an intermediate child forks it and exits at once, so the worker is
re-parented to the agent, a subreaper (`procs.become_subreaper`). It is then the agent's own child:
the agent waits for it, stops its process group and reads its exit status exactly as for a worker
it spawned, and the worker's parent-death signal ties it to the agent, not to the fork server.
"""

from __future__ import annotations

import json
import os
import select
import socket
import sys
from typing import Callable, Optional

from minitrain import procs
from minitrain.rpc.fork_protocol import FDS_PER_WORKER, FORK, MAX_FORKS_PER_REQUEST, READY, WARM

_MAX_MESSAGE = 4096


def serve(sock_fd: int, then: Optional[Callable[[], None]] = None) -> int:
    """Serve fork requests on the socket `sock_fd` until the agent closes it (then exit). With `then`
    (the slow preloads), a quick server answers while `then()` runs (see the module docstring).

    Returns only in a forked worker, with its stdin, stdout and stderr in place and the number of
    its stack-dump file descriptor; the caller then runs the worker as usual.
    """
    sock = socket.socket(fileno=sock_fd)
    sys.stdout.flush()
    sys.stderr.flush()
    sock.send(READY)
    if then is not None:
        stack_fd = _serve_while(sock, then)
        if stack_fd is not None:
            return stack_fd  # in a worker the quick server forked
    try:
        sock.send(WARM)  # (the quick server is gone: no answer of its can follow this)
    except OSError:  # the agent closed its end: it is done with us, or gone
        os._exit(0)
    while True:
        stack_fd = _serve_one(sock)
        if stack_fd is not None:
            return stack_fd  # in the worker


def _serve_while(sock: socket.socket, work: Callable[[], None]) -> Optional[int]:
    """Run `work()` here while a forked quick server answers fork requests; once `work()` returned,
    stop the quick server after the request it is serving. Returns only in a worker the quick server
    forked (its stack-dump fd); None in the fork server once the quick server is gone."""
    stop_r, stop_w = os.pipe()
    parent = os.getpid()
    try:
        quick = os.fork()
    except OSError:  # no quick server: the requests wait for `work()`
        os.close(stop_r)
        os.close(stop_w)
        work()
        return None
    if quick == 0:
        os.close(stop_w)
        try:
            procs.die_with_parent(expected_parent=parent)
            while True:
                readable, _, _ = select.select([stop_r, sock], [], [])
                if stop_r in readable:  # the fork server is ready: leave the next request to it
                    os._exit(0)
                stack_fd = _serve_one(sock)
                if stack_fd is not None:
                    os.close(stop_r)
                    return stack_fd  # in the worker
        except BaseException:  # noqa: BLE001 - the quick server never runs the fork server's code
            os._exit(1)
    os.close(stop_r)
    try:
        work()
    finally:
        os.close(stop_w)  # end of file on the pipe: the quick server stops between two requests
        os.waitpid(quick, 0)
    return None


def _serve_one(sock: socket.socket) -> Optional[int]:
    """Answer one request (exit when the agent closed its end); the worker's stack-dump fd in a forked
    worker, None in the server."""
    try:
        message, fds, _flags, _addr = socket.recv_fds(sock, _MAX_MESSAGE, FDS_PER_WORKER * MAX_FORKS_PER_REQUEST)
    except OSError:
        os._exit(0)
    if not message:  # the agent closed its end: it is done with us, or gone
        os._exit(0)
    if message != FORK or not fds or len(fds) % FDS_PER_WORKER:
        for fd in fds:
            os.close(fd)
        sock.send(json.dumps({"error": f"bad request {message[:40]!r} with {len(fds)} fds"}).encode())
        return None
    return _fork_workers(sock, [fds[i:i + FDS_PER_WORKER] for i in range(0, len(fds), FDS_PER_WORKER)])


def _fork_workers(sock: socket.socket, slots: list[list[int]]) -> int | None:
    """Double-fork a worker for each slot (its four fds); in the fork server answer their pids in order
    and return None, in a worker return its stack-dump file descriptor.

    Each intermediate forks its worker while the fork server forks the next intermediate. An
    intermediate and its worker keep only their own slot's descriptors: a worker holding another's pipe
    would keep that worker's output open after it died."""
    pending: list[tuple[int, int]] = []  # (intermediate pid, read end of its pid pipe); pid 0: fork failed
    errors: dict[int, str] = {}
    for index, slot in enumerate(slots):
        read_pid, write_pid = os.pipe()
        try:
            intermediate = os.fork()
        except OSError as exc:
            os.close(read_pid)
            os.close(write_pid)
            errors[index] = f"fork failed: {exc}"
            pending.append((0, -1))
        else:
            if intermediate == 0:  # the intermediate: only this slot's descriptors stay open
                others = [fd for later in slots[index + 1:] for fd in later] + [r for _, r in pending if r >= 0]
                for fd in others:
                    os.close(fd)
                return _fork_one(sock, slot, read_pid, write_pid)
            os.close(write_pid)
            pending.append((intermediate, read_pid))
        for fd in slot:
            os.close(fd)  # the intermediate holds its own copies (or there is none)
    answers = []
    for index, (intermediate, read_pid) in enumerate(pending):
        if not intermediate:
            answers.append({"error": errors[index]})
            continue
        text = _read_all(read_pid)
        os.close(read_pid)
        os.waitpid(intermediate, 0)  # once it is reaped, the worker has been re-parented to the agent
        answers.append({"pid": int(text)} if text.isdigit() else {"error": "the intermediate process died"})
    sock.send(json.dumps({"workers": answers}).encode())
    return None


def _fork_one(sock: socket.socket, fds: list[int], read_pid: int, write_pid: int) -> int:
    """In an intermediate: fork the worker, tell the fork server its pid, vanish. Returns only in the
    worker (its stack-dump file descriptor)."""
    try:
        worker = os.fork()
    except BaseException:
        os._exit(1)
    if worker == 0:
        os.close(read_pid)
        os.close(write_pid)
        sock.close()
        return _become_worker(fds)
    os.write(write_pid, str(worker).encode())
    os._exit(0)


def _become_worker(fds: list[int]) -> int:
    """In the forked worker: a session of its own, the agent's pipes as stdio, fresh random state."""
    stdin, stdout, stderr, stack_fd = fds
    os.setsid()  # its own process group, like a spawned worker: the agent stops it by group
    for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
        os.dup2(fd, target)
        os.close(fd)
    _reseed()
    return stack_fd


def _reseed() -> None:
    """Forked children share their parent's random state; give each its own, as a fresh process has.
    (Python's `random` reseeds itself after a fork; NumPy's global generator does not.)"""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def _read_all(fd: int) -> str:
    chunks = []
    while True:
        chunk = os.read(fd, 64)
        if not chunk:
            return b"".join(chunks).decode()
        chunks.append(chunk)
