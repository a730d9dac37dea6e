"""A connection flood from another process cannot kill a run (minitrain.rpc.limits).

The driver runs in a subprocess whose file-descriptor limit is 256, soft and hard, so raising it cannot
help. As soon as its agent's command line shows the coordinator's address (world-readable), a separate
process opens 400 connections to it and holds them: half send nothing, half send the HTTP/2 preface
and SETTINGS and then nothing. Before the limits, 1100 such connections at a limit of 1024 killed a run
in 0.4 s, blamed on node loss; here, without them, the driver ran out of descriptors (it could not
open its event log: "Too many open files"). Now the coordinator accepts at most (256 - 64) / 2 of them, so files can
still be opened (a checkpoint is committed under the flood), drops the idle ones within seconds (a
second checkpoint once every flood connection was closed by the server), and the run completes with
no failure allowed.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil

REPO_ROOT = Path(__file__).resolve().parents[2]
FD_LIMIT = 256
FLOOD_CONNECTIONS = 400

DRIVER = textwrap.dedent("""
    import os, sys, tempfile, time
    import minitrain
    from minitrain import Checkpoint, FailureConfig, RunConfig, ScalingConfig
    from minitrain.torch import TorchTrainer

    def wait_for(path):
        deadline = time.monotonic() + 30
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.05)
        return os.path.exists(path)

    def report(metrics):
        # A checkpoint makes the driver open files (staging, the index): it needs descriptors now.
        with tempfile.TemporaryDirectory() as directory:
            open(os.path.join(directory, "weights"), "w").write(str(metrics))
            minitrain.report(metrics, checkpoint=Checkpoint.from_directory(directory))

    def train(config):
        report({"flooded": wait_for(config["flooded"])})  # while the flood holds its connections
        report({"dropped": wait_for(config["dropped"])})  # after the coordinator dropped them

    if __name__ == "__main__":
        out = sys.argv[1]
        result = TorchTrainer(train, train_loop_config={"flooded": os.path.join(out, "flooded"),
                                                        "dropped": os.path.join(out, "dropped")},
                              scaling_config=ScalingConfig(num_workers=2),
                              run_config=RunConfig(name="flood", storage_path=os.path.join(out, "results"),
                                                   failure_config=FailureConfig(max_failures=0))).fit()
        print("METRICS", result.metrics, flush=True)
""")

# Opens the connections and says how many it holds; says DROPPED once the server has closed every one.
FLOODER = textwrap.dedent("""
    import select, socket, sys
    host, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    preface = b"PRI * HTTP/2.0\\r\\n\\r\\nSM\\r\\n\\r\\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
    held = []
    for i in range(count):
        try:
            sock = socket.create_connection((host, port), timeout=5)
        except OSError:
            continue
        if i % 2:
            sock.sendall(preface)  # a finished HTTP/2 handshake, then silence
        held.append(sock)
    print("HELD", len(held), flush=True)
    open_ = set(held)
    while open_ and not select.select([sys.stdin], [], [], 0)[0]:
        for sock in select.select(list(open_), [], [], 0.1)[0]:
            try:
                if sock.recv(65536):
                    continue
            except OSError:
                pass
            open_.discard(sock)
    print("DROPPED", len(held) - len(open_), flush=True)
    sys.stdin.read()
""")


def _limit_fds():
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


def _coordinator_address(driver: subprocess.Popen, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert driver.poll() is None, "the driver ended before its agent started"
        try:
            for child in psutil.Process(driver.pid).children(recursive=True):
                words = child.cmdline()
                if "minitrain.agent" in words and "--coordinator" in words:
                    return words[words.index("--coordinator") + 1]
        except psutil.Error:
            pass
        time.sleep(0.02)
    raise AssertionError("no agent command line seen")


def test_a_flood_of_idle_connections_neither_kills_nor_blames_a_run(tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    driver = subprocess.Popen([sys.executable, str(script), str(tmp_path)], cwd=tmp_path, env=env,
                              preexec_fn=_limit_fds, start_new_session=True, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    flooder = None
    lines: list[str] = []

    def relay_flooder():  # HELD -> the workers go on under the flood; DROPPED -> the flood is gone
        for line in flooder.stdout:
            lines.append(line)
            marker = {"HELD": "flooded", "DROPPED": "dropped"}.get(line.split()[0])
            if marker:
                (tmp_path / marker).write_text(line)

    try:
        host, port = _coordinator_address(driver, 60).rsplit(":", 1)
        flooder = subprocess.Popen([sys.executable, "-c", FLOODER, host, port, str(FLOOD_CONNECTIONS)],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        relay = threading.Thread(target=relay_flooder, daemon=True)
        relay.start()
        output, _ = driver.communicate(timeout=120)
        flooder.stdin.close()
        flooder.wait(timeout=10)
        relay.join(timeout=10)
    finally:
        for process in (driver, flooder):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
    held = int(lines[0].split()[1])
    assert held > FD_LIMIT, lines  # more connections than the driver may have descriptors
    assert driver.returncode == 0, output[-4000:]
    # Both checkpoint reports committed: the first while the flood was held, the second after the
    # coordinator had dropped every flood connection (refused past the cap, or idle past the deadlines).
    assert "METRICS {'dropped': True}" in output, output[-4000:]
    assert lines[1].split() == ["DROPPED", str(held)], lines
    assert "Too many open files" not in output, output[-4000:]  # the driver never ran out of descriptors
    assert "NodeLost" not in output and "lost" not in output.lower(), output[-4000:]
    history = [json.loads(line) for line in (tmp_path / "results" / "flood" / "metrics.jsonl").read_text().splitlines()]
    assert len(history) == 2
