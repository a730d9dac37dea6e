"""The measured processes of the `memory_tier` workload (see `bench.memory_tier`).

`python -m bench.memory_tier_jobs --role tier-job|s3-server --spec SPEC`:
- `tier-job` is a driver calling `TorchTrainer.fit()` with `tier_train_func` (2 workers), the memory
  tier on or off (`CheckpointConfig.memory_tier_bytes`), on local or S3-compatible storage;
- `s3-server` serves moto's S3-compatible server on 127.0.0.1 (a port the OS picks, written to the
  spec's `endpoint_file`) until its standard input closes: a process of its own, so the server's Python
  never shares a GIL with the benchmark's own copies.

Only the standard library is imported at module level.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from bench.common import NUM_WORKERS, append_jsonl, read_jsonl, role_main, write_json

READ_BUFFER = 8 << 20
STOP_WAIT_S = 120.0  # rank 0 waits this long for rank 1's kill to stop the attempt
S3_POLL_S = 0.1  # every poll is a request the S3 server serves beside the agent's uploads
LOCAL_POLL_S = 0.01
S3_REGION = "us-west-2"  # not us-east-1: s3fs sends the region as the bucket's LocationConstraint


# ---------------------------------------------------------------------- what the workers time


def read_all(open_file, paths: list[str]) -> int:
    """Read every byte of `paths` (opened by `open_file(path)`) into one reused buffer; the bytes read."""
    buffer = memoryview(bytearray(READ_BUFFER))
    total = 0
    for path in paths:
        with open_file(path) as f:
            while True:
                n = f.readinto(buffer)
                if not n:
                    break
                total += n
    return total


def copy_files(paths: list[str], dest: str) -> int:
    """shutil.copyfile each of `paths` into `dest` (as the memory tier copies a shard); the bytes copied."""
    total = 0
    for path in paths:
        target = os.path.join(dest, os.path.basename(path))
        shutil.copyfile(path, target)
        total += os.path.getsize(target)
    return total


def _phase_seconds() -> dict:
    """The live `phase_seconds` of this rank's session (the exported seam of
    minitrain.worker.session.WorkerSession: seconds in the tier copy, uploads, ack waits); {} if absent."""
    from minitrain import _session

    seconds = getattr(_session.current("report"), "phase_seconds", None)
    return seconds if isinstance(seconds, dict) else {}


def _open_local(path: str):
    return open(path, "rb", buffering=0)


def _open_checkpoint_file(checkpoint):
    """How to open a file of `checkpoint` for reading without copying the checkpoint anywhere first:
    its pyarrow filesystem's input stream (the fsspec filesystem's file when pyarrow is absent)."""
    fs = checkpoint.filesystem
    if hasattr(fs, "open_input_stream"):
        return fs.open_input_stream
    return lambda path: fs.open(path, "rb")


def _latest_dir_name(index: dict):
    """The directory of the latest checkpoint the run's index names (None before the first)."""
    latest = index.get("latest_checkpoint_result")
    return latest.get("checkpoint_dir_name") if isinstance(latest, dict) else None


def wait_durable(config: dict, dir_name: str, deadline_s: float) -> float:
    """Poll the run's index on storage until its latest checkpoint is `dir_name` (durable: the round is
    committed on storage); the perf_counter time it was seen. RuntimeError past the deadline."""
    if config["s3"]:
        import fsspec

        fs = fsspec.filesystem("s3", **config["s3"]["options"])
        read, poll_s = (lambda: fs.cat_file(config["index"])), S3_POLL_S
    else:
        def read() -> bytes:
            with open(config["index"], "rb") as f:
                return f.read()
        poll_s = LOCAL_POLL_S
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            if _latest_dir_name(json.loads(read())) == dir_name:
                return time.perf_counter()
        except (FileNotFoundError, ValueError):
            pass  # no index yet (the first round), or replaced under the reader: read it again
        if time.monotonic() > deadline:
            raise RuntimeError(f"{dir_name} was not durable on {config['index']} after {deadline_s:g} s")
        time.sleep(poll_s)


def _floor_copy(config: dict, rank: int) -> dict:
    """This rank's sources copied into a fresh directory in the memory tier's parent (the floor of
    report()); both ranks start together after a barrier, so the two copies run concurrently."""
    import torch.distributed as dist

    dest = tempfile.mkdtemp(prefix=config["floor_prefix"], dir=config["tier_base"])
    try:
        dist.barrier()
        start = time.perf_counter()
        copied = copy_files(config["sources"][rank], dest)
        end = time.perf_counter()
    finally:
        shutil.rmtree(dest, ignore_errors=True)
    dist.barrier()
    return {"start": start, "end": end, "seconds": end - start, "bytes": copied}


def _persist_peer(config: dict, rep: int) -> dict:
    """Rank 0, the peer of persistence: both ranks' files, copied first into rank<r>/ directories in the
    tier's parent (as the tier holds them), written to the storage beside the run directory: s3fs `put`
    of the two directories on S3 (with `with_moves` in the first repetition, then every file moved, as a
    commit moves the staged files: a server-side copy and a delete each), `cp -r` on local disk; then
    deleted."""
    root = tempfile.mkdtemp(prefix=config["floor_prefix"], dir=config["tier_base"])
    dest = f"{config['storage']}/peer_{rep}"
    try:
        for rank, files in enumerate(config["sources"]):
            os.makedirs(os.path.join(root, f"rank{rank}"))
            copy_files(files, os.path.join(root, f"rank{rank}"))
        if config["s3"]:
            import fsspec

            fs = fsspec.filesystem("s3", **config["s3"]["options"])
            start = time.perf_counter()
            fs.put(root + "/", dest, recursive=True)
            figures = {"seconds": time.perf_counter() - start, "bytes": fs.du(dest)}
            if rep == 0:
                start = time.perf_counter()
                for path in fs.find(dest):
                    fs.mv(path, f"{dest}_moved/{path[len(dest):].lstrip('/')}")
                figures["move_s"] = time.perf_counter() - start
            for path in (dest, f"{dest}_moved"):
                if fs.exists(path):
                    fs.rm(path, recursive=True)
        else:
            start = time.perf_counter()
            subprocess.run(["cp", "-r", "--", root, dest], stdin=subprocess.DEVNULL, check=True)
            figures = {"seconds": time.perf_counter() - start,
                       "bytes": sum(os.path.getsize(os.path.join(d, name)) for d, _, names in os.walk(dest)
                                 for name in names)}
            shutil.rmtree(dest)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return figures


def _one_round(config: dict, rank: int, rep: int, mode: str) -> dict:
    """One timed report(checkpoint) of this rank's source directory, then (rank 0) the wait until the
    round is durable on storage. The floor copy goes before it in even repetitions, after it in odd; so
    does rank 0's persistence peer of a SYNC round (config["peer"]), while rank 1 waits."""
    import torch.distributed as dist

    import minitrain

    stats = _phase_seconds()
    record = {"kind": "round", "rep": rep, "mode": mode, "rank": rank, "load_1min": os.getloadavg()[0]}
    peer = config["peer"] and mode == "sync"
    if rep % 2 == 0:
        record["floor"] = _floor_copy(config, rank)
    elif peer:
        record["peer"] = _persist_peer(config, rep) if rank == 0 else None
        dist.barrier()
    name = f"ckpt_{rep}_{mode}"
    upload_mode = {"sync": minitrain.CheckpointUploadMode.SYNC, "async": minitrain.CheckpointUploadMode.ASYNC}[mode]
    checkpoint = minitrain.Checkpoint.from_directory(os.path.dirname(config["sources"][rank][0]))
    dist.barrier()
    before = dict(stats)
    start = time.perf_counter()
    # The sources are reused by every round: never given up (ASYNC would otherwise move or delete them).
    minitrain.report({"rep": rep, "mode": mode}, checkpoint=checkpoint, checkpoint_dir_name=name,
                     checkpoint_upload_mode=upload_mode, delete_local_checkpoint_after_upload=False)
    end = time.perf_counter()
    record.update(start=start, end=end, seconds=end - start,
                  phases={key: value - before.get(key, 0.0) for key, value in stats.items()})
    if rank == 0:
        durable = wait_durable(config, name, config["durable_timeout_s"])
        record.update(durable=durable, durable_s=durable - end)
    dist.barrier()  # nothing runs beside the next measurement: this round is on storage
    if rep % 2 == 1:
        record["floor"] = _floor_copy(config, rank)
    elif peer:
        record["peer"] = _persist_peer(config, rep) if rank == 0 else None
        dist.barrier()
    return record


def machine_busy_s() -> float:
    """CPU seconds every core of the machine has spent busy since boot (/proc/stat: all but idle and
    iowait); NaN where /proc/stat cannot be read."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return float("nan")
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _cpu_mark() -> tuple[float, float]:
    """(this thread's CPU seconds, the machine's busy seconds): what `_cpu_since` compares."""
    return time.thread_time(), machine_busy_s()


def _cpu_since(mark: tuple[float, float]) -> dict:
    """CPU this thread used since `mark`, and what the rest of the machine used meanwhile (every other
    process and thread, ours or not): where a timed read's wall time went on a shared machine."""
    thread_s, busy_s = time.thread_time() - mark[0], machine_busy_s() - mark[1]
    return {"thread_cpu_s": thread_s, "others_cpu_s": busy_s - thread_s}


def _load(config: dict, entered: float, attempt: int, mark: tuple[float, float]) -> dict:
    """Rank 0 of a restarted attempt: get_checkpoint() and every byte of rank 0's files read, timed from
    the training function's first line (with the tier, from `as_directory()`, which is its merged view;
    without, streamed from storage through `checkpoint.filesystem`); then the same bytes read from a copy
    in the tier's parent (its second read: the first is untimed)."""
    import minitrain

    checkpoint = minitrain.get_checkpoint()
    if checkpoint is None:
        raise RuntimeError(f"attempt {attempt} was restarted without a checkpoint to resume from")
    names = [os.path.basename(path) for path in config["sources"][0]]
    if config["tier_bytes"]:  # the tier's merged view: a local directory, which as_directory() copies nowhere
        with checkpoint.as_directory() as directory:
            loaded_bytes = read_all(_open_local, [os.path.join(directory, name) for name in names])
    else:  # on S3: these files only, streamed (as_directory() would download every rank's files first)
        loaded_bytes = read_all(_open_checkpoint_file(checkpoint), [f"{checkpoint.path}/{name}" for name in names])
    loaded = time.perf_counter()
    load_cpu = _cpu_since(mark)
    floor_dir = tempfile.mkdtemp(prefix=config["floor_prefix"], dir=config["tier_base"])
    try:
        copied = [os.path.join(floor_dir, name) for name in names]
        copy_files(config["sources"][0], floor_dir)
        # Read once untimed: the first read of pages just written to a tmpfs is slower (0.18-0.20 s against
        # 0.13 s a GiB here) and the tier's view was written long before the restart read it.
        read_all(_open_local, copied)
        floor_mark, start = _cpu_mark(), time.perf_counter()
        floor_bytes = read_all(_open_local, copied)
        floor_s = time.perf_counter() - start
        floor_cpu = _cpu_since(floor_mark)
    finally:
        shutil.rmtree(floor_dir, ignore_errors=True)
    return {"kind": "restart", "attempt": attempt, "load_1min": os.getloadavg()[0], "load_s": loaded - entered,
            "bytes": loaded_bytes,
            "floor_s": floor_s, "floor_bytes": floor_bytes, "path": checkpoint.path, "load_cpu": load_cpu,
            "floor_cpu": floor_cpu}


def tier_train_func(config: dict) -> None:
    """Every rank. The first attempt reports `repeats` rounds of each mode (see `_one_round`); every
    later attempt (after rank 1 SIGKILLed itself) loads the checkpoint on rank 0 (see `_load`). Rank 1
    kills itself at the end of every attempt until `kills` attempts were killed; the last one reports
    {"done": True}."""
    entered, mark = time.perf_counter(), _cpu_mark()
    import torch.distributed as dist

    import minitrain

    rank = minitrain.get_context().get_world_rank()
    attempt = sum(1 for r in read_jsonl(config["events"]) if r["kind"] == "kill")  # same on every rank
    if attempt == 0:
        _floor_copy(config, rank)  # warm-up, untimed: the sources' pages and the tmpfs' first use
        for rep in range(config["repeats"]):
            for mode in config["modes"]:
                append_jsonl(config["results"], _one_round(config, rank, rep, mode))
    elif rank == 0:
        append_jsonl(config["results"], _load(config, entered, attempt, mark))
    dist.barrier()
    if attempt < config["kills"]:
        if rank == 1:
            append_jsonl(config["events"], {"kind": "kill", "attempt": attempt, "time": time.time()})
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(STOP_WAIT_S)  # rank 0: stopped with the attempt as soon as rank 1 is gone
        raise RuntimeError(f"rank 1's SIGKILL did not stop attempt {attempt} within {STOP_WAIT_S:g} s")
    minitrain.report({"done": True, "attempts": attempt + 1})


# ---------------------------------------------------------------------- the driver


def role_tier_job(spec: dict) -> None:
    """fit() of `tier_train_func` with unlimited restarts; checks that the run finished."""
    from minitrain import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from minitrain.torch import TorchTrainer

    filesystem = None
    if spec["s3"]:
        import s3fs

        filesystem = s3fs.S3FileSystem(**spec["s3"]["options"])
    result = TorchTrainer(
        tier_train_func, train_loop_config=spec, scaling_config=ScalingConfig(num_workers=NUM_WORKERS),
        run_config=RunConfig(name="bench", storage_path=spec["storage"], storage_filesystem=filesystem,
                             checkpoint_config=CheckpointConfig(num_to_keep=1, memory_tier_bytes=spec["tier_bytes"]),
                             failure_config=FailureConfig(max_failures=-1, max_attempts_without_progress=-1))).fit()
    assert result.metrics.get("done") is True, result.metrics
    assert result.metrics.get("attempts") == spec["kills"] + 1, result.metrics
    assert result.checkpoint is not None, "no checkpoint was committed"


def role_s3_server(spec: dict) -> None:
    """moto's ThreadedMotoServer on 127.0.0.1, port 0; its endpoint written to spec["endpoint_file"]; stopped
    when standard input closes (the benchmark ends it so, or dies)."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a log line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        write_json(spec["endpoint_file"], {"endpoint_url": f"http://{host}:{port}", "pid": os.getpid()})
        closed = threading.Event()

        def watch_stdin() -> None:
            sys.stdin.buffer.read()
            closed.set()

        threading.Thread(target=watch_stdin, name="stdin-watch", daemon=True).start()
        closed.wait()
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(role_main(__doc__.splitlines()[0], {"tier-job": role_tier_job, "s3-server": role_s3_server}))
