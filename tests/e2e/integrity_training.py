"""Training functions and filesystems of tests/e2e/test_integrity.py.

Workers import this module by reference when they unpickle their payload, so it imports neither
pytest nor the test module.
"""

from __future__ import annotations

import hashlib
import os
import signal
import sys
import tempfile
import time

from fsspec.implementations.local import LocalFileSystem

import minitrain
from minitrain import _session

CHECKPOINT_EVERY_OTHER = 10  # reports per rank in report_then_fail


def report_then_fail(config):
    """Each rank reports 10 times (rank 0 attaches a checkpoint to every other call, rank 1 reports
    metrics only) and notes in <notes>/returned_<rank> each report() that returned. Then, as
    config["end"] says: "raise" or "exit" (sys.exit): every rank waits until every rank's 10 reports
    returned, then fails at once, 0 ms after; "raise_rank1": rank 1 raises right after its own last
    report while rank 0 is still reporting (rank 0 is stopped wherever it is)."""
    rank = minitrain.get_context().get_world_rank()
    notes = config["notes"]
    for i in range(CHECKPOINT_EVERY_OTHER):
        checkpoint = None
        with tempfile.TemporaryDirectory() as tmp:
            if rank == 0 and i % 2 == 1:
                with open(os.path.join(tmp, "step.txt"), "w") as handle:
                    handle.write(str(i))
                checkpoint = minitrain.Checkpoint.from_directory(tmp)
            minitrain.report({"i": i, "rank": rank}, checkpoint=checkpoint)
        with open(os.path.join(notes, f"returned_{rank}"), "a") as handle:
            handle.write(f"{i}\n")
    end = config["end"]
    if end == "raise_rank1":
        if rank == 1:
            raise RuntimeError("rank 1 fails right after its last report")
        return
    open(os.path.join(notes, f"all_returned_{rank}"), "w").close()
    world = minitrain.get_context().get_world_size()
    deadline = time.monotonic() + 60
    while not all(os.path.exists(os.path.join(notes, f"all_returned_{r}")) for r in range(world)):
        if time.monotonic() > deadline:
            raise TimeoutError("the other ranks never finished reporting")
        time.sleep(0.01)
    if end == "exit":
        sys.exit(3)
    raise RuntimeError(f"rank {rank} fails right after every rank's last report")


def returned_everywhere(notes: str, world: int = 2) -> set:
    """The report indices whose report() returned on every rank (from report_then_fail's notes)."""
    sets = []
    for rank in range(world):
        path = os.path.join(notes, f"returned_{rank}")
        sets.append({int(line) for line in open(path).read().split()} if os.path.exists(path) else set())
    return set.intersection(*sets)


def list_after_own_reports(config):
    """Rank 0 reports slowly: metrics, a checkpoint, a checkpoint. Rank 1 reports metrics three times
    at once, then asks for the reported checkpoints: Ray's call blocks until its reports are processed,
    so both checkpoints are there."""
    rank = minitrain.get_context().get_world_rank()
    if rank == 0:
        for i in range(3):
            time.sleep(0.3)
            with tempfile.TemporaryDirectory() as tmp:
                checkpoint = None
                if i > 0:
                    open(os.path.join(tmp, "m.txt"), "w").write(str(i))
                    checkpoint = minitrain.Checkpoint.from_directory(tmp)
                minitrain.report({"i": i}, checkpoint=checkpoint)
        return None
    for i in range(3):
        minitrain.report({"i": i})
    listed = minitrain.get_all_reported_checkpoints()
    names = [os.path.basename(c.checkpoint.path) for c in listed]
    if len(listed) != 2:
        raise AssertionError(f"get_all_reported_checkpoints() after 3 reports listed {names}, expected 2")
    return names


def report_epochs(config):
    """Resumes from the latest checkpoint and reports (with a checkpoint on rank 0) the epochs left;
    raises after epoch config["fail_after"] when given."""
    rank = minitrain.get_context().get_world_rank()
    start = 0
    checkpoint = minitrain.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            start = int(open(os.path.join(d, "epoch.txt")).read()) + 1
    for epoch in range(start, config["epochs"]):
        with tempfile.TemporaryDirectory() as tmp:
            checkpoint = None
            if rank == 0:
                open(os.path.join(tmp, "epoch.txt"), "w").write(str(epoch))
                checkpoint = minitrain.Checkpoint.from_directory(tmp)
            minitrain.report({"epoch": epoch, "loss": 1.0 / (epoch + 1)}, checkpoint=checkpoint)
        if epoch == config.get("fail_after"):
            raise RuntimeError(f"failing after epoch {epoch}")
        if config.get("wait_for"):
            deadline = time.monotonic() + 60
            while not os.path.exists(config["wait_for"]) and time.monotonic() < deadline:
                time.sleep(0.05)


def checkpoint_with_linked_dir(config):
    """Rank 0 reports a checkpoint whose `shards/` is a symbolic link to a directory elsewhere."""
    rank = minitrain.get_context().get_world_rank()
    outside = tempfile.mkdtemp(prefix="linked_shards_")
    open(os.path.join(outside, "shard0.bin"), "w").write("linked data")
    os.makedirs(os.path.join(outside, "deeper"))
    open(os.path.join(outside, "deeper", "shard1.bin"), "w").write("deeper data")
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = None
        if rank == 0:
            open(os.path.join(tmp, "model.txt"), "w").write("model")
            os.symlink(outside, os.path.join(tmp, "shards"))
            checkpoint = minitrain.Checkpoint.from_directory(tmp)
        minitrain.report({"done": 1}, checkpoint=checkpoint, checkpoint_upload_mode=config["mode"])


class GatedSlowFileSystem(LocalFileSystem):
    """A local filesystem whose uploads are late in the one process whose pid is written in
    `writer_file` (that process's link to storage stalls while its node is in trouble): each of its
    file writes waits until the index `index_path` names `committed_name`, i.e. until a later attempt
    has committed a checkpoint of the same name (at most 60 s)."""

    def __init__(self, writer_file: str = "", index_path: str = "", committed_name: str = "", **kwargs):
        super().__init__(**kwargs)
        self.writer_file = writer_file
        self.index_path = index_path
        self.committed_name = committed_name

    def _committed(self) -> bool:
        try:
            return f'"{self.committed_name}"' in open(self.index_path).read()
        except OSError:
            return False

    def put_file(self, lpath, rpath, **kwargs):
        try:
            late = int(open(self.writer_file).read()) == os.getpid()
        except (OSError, ValueError):
            late = False
        deadline = time.monotonic() + 60
        while late and not self._committed() and time.monotonic() < deadline:
            time.sleep(0.05)
        return super().put_file(lpath, rpath, **kwargs)


def _outlive_the_agent() -> None:
    """This worker stands for one whose end is delayed after its node is lost (a thread holding the GIL in C
    code, a write already in the kernel): its own lease on its agent, which would SIGKILL it about 4 s after
    the agent froze, is made longer than the test, so its late write does come."""
    session = _session.current("report")
    session._client._lease.timeout_s = 3600.0


def freeze_agent_during_upload(config):
    """Rank 0 of the first attempt freezes its node agent (SIGSTOP) and then writes a checkpoint to
    slow storage, long after the node is declared lost. Every attempt writes checkpoint round 1 with
    files that name the attempt; rank 0 of the first attempt notes when its late write has ended."""
    context = minitrain.get_context()
    rank = context.get_world_rank()
    first = not os.path.exists(config["marker"])
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = None
        if rank == 0:
            open(os.path.join(tmp, "epoch.txt"), "w").write("0")
            checkpoint = minitrain.Checkpoint.from_directory(tmp)
        minitrain.report({"epoch": 0}, checkpoint=checkpoint)
    if rank == 0 and first:
        _outlive_the_agent()
        open(config["marker"] + ".writer", "w").write(str(os.getpid()))  # this process's uploads are slow
        open(config["marker"], "w").write(str(os.getppid()))
        os.kill(os.getppid(), signal.SIGSTOP)  # the agent: no heartbeat from now on
    label = "first attempt" if first else "later attempt"
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = None
        if rank == 0:
            for n in range(config["files"]):
                open(os.path.join(tmp, f"part{n}.txt"), "w").write(f"{label} part {n}")
            checkpoint = minitrain.Checkpoint.from_directory(tmp)
        try:
            minitrain.report({"epoch": 1, "writer": label}, checkpoint=checkpoint)
        finally:
            if rank == 0 and first:
                open(config["marker"] + ".late_write_done", "w").write("1")


def tree_digest(path: str) -> dict:
    """relative path -> sha256 of every file under `path`."""
    digest = {}
    for root, _dirs, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            digest[os.path.relpath(full, path)] = hashlib.sha256(open(full, "rb").read()).hexdigest()
    return digest


def chatty_epochs(config):
    """report_epochs, with config["lines"] lines of output per epoch on stdout and stderr."""
    for epoch in range(config["epochs"]):
        for n in range(config["lines"]):
            print(f"epoch {epoch} line {n}", flush=True)
            print(f"epoch {epoch} warning {n}", file=sys.stderr, flush=True)
        minitrain.report({"epoch": epoch})
