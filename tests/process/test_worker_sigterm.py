"""A stopped worker flushes what it queued and dies of SIGTERM, whatever its main thread is doing
(minitrain/worker/sigterm_flush.py). The old handler did the flush itself, on the main thread: it
took the stream's lock inside the signal handler, and it never ran while the main thread was
blocked in C. Here the main thread holds WorkerClient's lock and is stuck in C (a pthread mutex,
which signals do not interrupt, as a collective would be) when SIGTERM lands.

Real processes: a worker-like child with a real WorkerClient, and a real gRPC server in this process
that records what reaches it."""

from __future__ import annotations

import select
import signal
import subprocess
import sys
import textwrap
import threading
from concurrent import futures
from pathlib import Path

import grpc

from minitrain.rpc._gen import minitrain_pb2 as pb
from minitrain.rpc._gen import minitrain_pb2_grpc as pb_grpc

ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 60.0
REPORTS = 50

# Queues REPORTS reports, then holds the client's lock and blocks in C for good.
WORKER = textwrap.dedent("""
    import ctypes, sys, threading, time
    from minitrain.rpc._gen import minitrain_pb2 as pb
    from minitrain.worker.bootstrap import _flush_on_sigterm
    from minitrain.worker.client import WorkerClient

    client = WorkerClient(sys.argv[1], "token", "run", 0, 3)
    _flush_on_sigterm(client)
    for index in range(int(sys.argv[2])):
        client.send(report=pb.Report(round=index, metrics_json="{}"))
    libc = ctypes.CDLL(None)
    mutex = ctypes.create_string_buffer(64)  # a pthread_mutex_t, zeroed: PTHREAD_MUTEX_INITIALIZER
    libc.pthread_mutex_lock(mutex)
    main = threading.get_native_id()

    def say_when_blocked():  # only once the main thread sleeps in the kernel's futex wait
        while "futex" not in open(f"/proc/self/task/{main}/wchan").read():
            time.sleep(0.01)
        print("blocked", flush=True)

    threading.Thread(target=say_when_blocked, daemon=True).start()
    with client._cond:
        libc.pthread_mutex_lock(mutex)  # a second lock of a normal mutex: blocked in C, signals or not
""")


class RecordingCoordinator(pb_grpc.CoordinatorServicer):
    """Records each worker message; ends the stream once the worker half-closed its side."""

    def __init__(self):
        self.reports: list[int] = []
        self.half_closed = threading.Event()

    def WorkerStream(self, request_iterator, context):
        for message in request_iterator:
            if message.WhichOneof("body") == "report":
                self.reports.append(message.report.round)
        self.half_closed.set()
        return iter(())


def test_sigterm_while_the_main_thread_holds_the_lock_in_c_flushes_and_dies_in_time():
    coordinator = RecordingCoordinator()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_CoordinatorServicer_to_server(coordinator, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    worker = subprocess.Popen([sys.executable, "-c", WORKER, f"127.0.0.1:{port}", str(REPORTS)],
                              stdout=subprocess.PIPE, text=True, cwd=str(ROOT))
    try:
        ready, _, _ = select.select([worker.stdout], [], [], DEADLINE_S)
        assert ready and worker.stdout.readline().strip() == "blocked"
        worker.send_signal(signal.SIGTERM)
        # The flush is bounded by sigterm_flush.SIGTERM_FLUSH_S (plus a join margin); the rest is
        # slack for a loaded machine, never a timing claim.
        assert worker.wait(timeout=DEADLINE_S) == -signal.SIGTERM  # died of SIGTERM, as without a handler
        assert coordinator.half_closed.wait(DEADLINE_S), "the worker never ended its stream"
        assert coordinator.reports == list(range(REPORTS))
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        server.stop(grace=None)
