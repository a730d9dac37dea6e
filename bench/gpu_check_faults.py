"""Checks of the GPU check (`bench.gpu_check`) that watch the run from outside: a CUDA worker crash and
its restart, and the NVML telemetry the live dashboard serves. Run by `bench.gpu_check_jobs`.

cuda_restart: the last rank crashes twice, first on a CUDA error (an out-of-bounds gather: a
    device-side assert, which leaves that process's CUDA context unusable), then by exiting after
    CUDA work (`os._exit(3)`, a crash without a Python exception) while the other ranks wait in an
    NCCL all_reduce that can never complete. With `FailureConfig(max_failures=2)` the run must
    finish in its third attempt, every rank in a fresh process that uses CUDA again (a restarted
    worker is forked from minitrain's fork server: CUDA must not have been initialised there).
    Figures: crash -> first line of the next attempt, for each crash. On a GPU the planted assert can
    end the process before Python sees it: NCCL's watchdog thread finds the sticky CUDA error on its
    pending work and aborts (SIGABRT). So the plant is noted before the kernel runs, and the proof
    that it was a CUDA error is either the exception Python saw or the rank's own log of attempt 0.
nvml_dashboard: every rank keeps its GPU busy while the driver reads the live dashboard's
    `/api/ranks` (MINITRAIN_DASHBOARD set to a free loopback port) until every rank's row shows its
    GPU's utilisation and memory from NVML, with the NVML index of the GPU the rank was given, and
    `/metrics` exports them; then it tells the ranks to stop.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import urllib.request

from bench.common import append_jsonl, read_jsonl
from bench.gpu_check_support import CheckFailed, expected_visible_devices, fit, require

CRASHES = "crashes.jsonl"
RESTART_STEPS = 20
DASHBOARD_WAIT_S = 40.0  # telemetry samples once a second; NVML's utilisation needs a sample period
BUSY_MAX_S = 60.0  # the ranks stop by themselves after this, if the driver never tells them


# ---------------------------------------------------------------------- cuda_restart


def _enter(notes: str, rank: int) -> int:
    """Note this rank's entry into the training function; the attempt index (entries before it)."""
    path = os.path.join(notes, f"entries_rank{rank}.jsonl")
    attempt = len(read_jsonl(path))
    append_jsonl(path, {"attempt": attempt, "time": time.time(), "pid": os.getpid()})
    return attempt


def _plant_cuda_error(device, notes: str) -> None:
    """Raise a CUDA error in this process (a device-side assert from an out-of-bounds gather); on CPU, a
    plain RuntimeError. The crash is noted before it propagates."""
    import torch

    message = "no CUDA error was raised"
    # Noted first: the watchdog's abort may end this process before the except clause below runs.
    append_jsonl(os.path.join(notes, CRASHES), {"attempt": 0, "kind": "cuda_error", "time": time.time(),
                                                 "message": ""})
    try:
        if device.type == "cuda":
            values = torch.zeros(4, device=device)
            index = torch.tensor([1 << 20], device=device)
            values[index].sum().item()  # the kernel asserts; the error surfaces at this sync
            torch.cuda.synchronize()
        else:
            raise RuntimeError("planted failure (CPU mode: no CUDA error to plant)")
    except RuntimeError as exc:
        append_jsonl(os.path.join(notes, CRASHES), {"attempt": 0, "kind": "seen", "time": time.time(),
                                                     "message": str(exc)[:400]})
        raise
    append_jsonl(os.path.join(notes, CRASHES), {"attempt": 0, "kind": "seen", "time": time.time(),
                                                 "message": message})
    raise RuntimeError(f"planted failure: {message}")


def crash_train(config: dict) -> None:
    """Attempt 0: the last rank raises a CUDA error; attempt 1: it exits after CUDA work; attempt 2:
    every rank trains to the end. Every rank uses CUDA and NCCL in every attempt first."""
    import torch
    import torch.distributed as dist

    import minitrain
    from minitrain.torch import get_device

    context = minitrain.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    notes = config["notes"]
    attempt = _enter(notes, rank)
    device = get_device()
    x = torch.randn(256, 256, device=device)
    matmul_ok = bool(torch.isfinite(x @ x).all().item())
    one = torch.ones(1, device=device)
    dist.all_reduce(one)
    if rank == world - 1 and attempt == 0:
        _plant_cuda_error(device, notes)
    if rank == world - 1 and attempt == 1:
        append_jsonl(os.path.join(notes, CRASHES), {"attempt": 1, "kind": "exit", "time": time.time(), "message": ""})
        os._exit(3)
    for step in range(config["steps"]):
        t = torch.ones(1, device=device)
        dist.all_reduce(t)  # the other ranks of attempts 0 and 1 wait here for the crashed one
        minitrain.report({"step": step, "attempt": attempt, "matmul_ok": matmul_ok, "world": t.item()})
        time.sleep(0.02)


def check_cuda_restart(spec: dict):
    """See the module doc."""
    from minitrain import FailureConfig

    notes = os.path.join(spec["tmp"], "notes")
    os.makedirs(notes, exist_ok=True)
    workers = spec["workers"]
    result = fit(crash_train, spec, "cuda_restart", {"notes": notes, "steps": RESTART_STEPS},
                 failure_config=FailureConfig(max_failures=2, worker_stop_grace_s=3.0))
    metrics = result.metrics or {}
    require(metrics.get("attempt") == 2 and metrics.get("step") == RESTART_STEPS - 1,
            f"the run did not finish in its third attempt: metrics {metrics}")
    require(metrics.get("matmul_ok") is True and metrics.get("world") == float(workers),
            f"the last attempt's CUDA work or all_reduce was wrong: {metrics}")
    entries = {rank: read_jsonl(os.path.join(notes, f"entries_rank{rank}.jsonl")) for rank in range(workers)}
    for rank, lines in entries.items():
        require(len(lines) == 3, f"rank {rank} entered the training function {len(lines)} time(s), expected 3")
    victim = entries[workers - 1]
    require(len({line["pid"] for line in victim}) == 3, f"the crashed rank was not restarted in a new process: {victim}")
    notes_lines = read_jsonl(os.path.join(notes, CRASHES))
    crashes = [c for c in notes_lines if c["kind"] != "seen"]
    require([c["kind"] for c in crashes] == ["cuda_error", "exit"], f"the planted crashes did not happen: {notes_lines}")
    seen = [c["message"] for c in notes_lines if c["kind"] == "seen"]
    planted, where = (seen[0], "the exception") if seen else (_victim_log(spec, workers - 1), "rank log")
    if not spec["cpu"]:
        require("CUDA" in planted or "device-side" in planted,
                f"the planted CUDA error was not a CUDA error ({where}): {planted[-400:]}")
    restarts = []
    for crash in crashes:
        starts = [lines[crash["attempt"] + 1]["time"] for lines in entries.values()]
        restarts.append(round(min(starts) - crash["time"], 3))
    figures = {"restart_after_cuda_error_s": restarts[0], "restart_after_exit_s": restarts[1],
               "planted_error": _cuda_line(planted), "planted_error_seen_in": where,
               "python_saw_the_error": bool(seen), "entries": entries}
    error, used = ("a planted error", "") if spec["cpu"] else ("CUDA error", ", CUDA used again in the new processes")
    summary = (f"{workers} rank(s): {error} -> next attempt's first line {restarts[0]:.2f} s, exit(3) -> "
               f"{restarts[1]:.2f} s; finished in attempt 2{used}")
    return summary, figures


def _victim_log(spec: dict, rank: int) -> str:
    """Rank `rank`'s log of attempt 0 in the cuda_restart run's directory ('' when there is none)."""
    from minitrain.storage import layout

    path = os.path.join(spec["tmp"], "storage", "cuda_restart", layout.LOGS_DIR, layout.rank_log(0, rank))
    try:
        with open(path, errors="replace") as handle:
            return handle.read()
    except OSError:
        return ""


def _cuda_line(text: str) -> str:
    """The first line of `text` that names the CUDA error, else its start."""
    for line in text.splitlines():
        if "CUDA error" in line or "device-side" in line:
            return line.strip()[:300]
    return text[:300]


# ---------------------------------------------------------------------- nvml_dashboard


def busy_train(config: dict) -> None:
    """Keep this rank's device busy and report until the driver writes the stop file (every rank
    stops at the same report: the decision is all-reduced)."""
    import torch
    import torch.distributed as dist

    import minitrain
    from minitrain.torch import get_device

    device = get_device()
    size = config["size"]
    a = torch.randn(size, size, device=device)
    deadline = time.monotonic() + BUSY_MAX_S
    step = 0
    while True:
        for _ in range(config["inner"]):
            a = torch.tanh(a @ a / size)
        stop = os.path.exists(config["stop_file"]) or time.monotonic() > deadline
        flag = torch.tensor([1.0 if stop else 0.0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        minitrain.report({"step": step, "finite": bool(torch.isfinite(a).all().item())})
        step += 1
        if flag.item() > 0:
            return


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - a loopback URL of ours
        return response.read().decode()


class DashboardWatch(threading.Thread):
    """Reads `/api/ranks` every half second until `measured(rows)` holds for `workers` ranks; then keeps
    those rows and `/metrics`, and writes `stop_file`."""

    def __init__(self, base: str, workers: int, measured, stop_file: str):
        super().__init__(name="dashboard-watch", daemon=True)
        self.base, self.workers, self.measured, self.stop_file = base, workers, measured, stop_file
        self.rows: list = []
        self.metrics_text = ""
        self.seen_after_s = None
        self.last_error = ""
        self._done = threading.Event()

    def run(self) -> None:
        start = time.monotonic()
        while not self._done.wait(0.5) and time.monotonic() - start < DASHBOARD_WAIT_S:
            try:
                rows = json.loads(_get(self.base + "/api/ranks"))
            except Exception as exc:  # noqa: BLE001 - not serving yet, or between attempts
                self.last_error = f"{type(exc).__name__}: {exc}"
                continue
            if len(rows) >= self.workers and all(self.measured(row) for row in rows):
                self.rows, self.seen_after_s = rows, round(time.monotonic() - start, 2)
                try:
                    self.metrics_text = _get(self.base + "/metrics")
                except Exception as exc:  # noqa: BLE001
                    self.last_error = f"/metrics: {type(exc).__name__}: {exc}"
                break
        open(self.stop_file, "w").close()

    def stop(self) -> None:
        self._done.set()


def _gpu_measured(row: dict) -> bool:
    gpus = row.get("gpus") or []
    return bool(gpus) and all(g.get("memory_total_bytes") and g.get("memory_used_bytes") is not None
                              and g.get("util_percent") is not None for g in gpus)


def _cpu_measured(row: dict) -> bool:
    return row.get("cpu_percent") is not None


def check_nvml_dashboard(spec: dict):
    """See the module doc."""
    workers = spec["workers"]
    port = _free_port()
    os.environ["MINITRAIN_DASHBOARD"] = f"127.0.0.1:{port}"
    stop_file = os.path.join(spec["tmp"], "stop")
    watch = DashboardWatch(f"http://127.0.0.1:{port}", workers, _cpu_measured if spec["cpu"] else _gpu_measured,
                           stop_file)
    watch.start()
    try:
        config = {"stop_file": stop_file, "size": 256 if spec["cpu"] else 4096, "inner": 1 if spec["cpu"] else 20}
        fit(busy_train, spec, "nvml_dashboard", config)
    finally:
        watch.stop()
        watch.join(timeout=10)
    if not watch.rows:
        raise CheckFailed(f"the dashboard never showed every rank measured within {DASHBOARD_WAIT_S:g} s "
                          f"(last error: {watch.last_error or 'none'})")
    if spec["cpu"]:
        require(all(not row["gpus"] for row in watch.rows), f"CPU ranks showed GPUs: {watch.rows}")
        return f"{workers} CPU rank(s) on /api/ranks after {watch.seen_after_s} s (no GPUs, as expected)", \
            {"ranks": watch.rows}
    expected = expected_visible_devices(workers).split(",")
    for row in watch.rows:
        indices = [g["index"] for g in row["gpus"]]
        require(indices == [int(expected[row["rank"]])],
                f"rank {row['rank']}: NVML shows GPU(s) {indices}, expected [{expected[row['rank']]}]")
    require("minitrain_train_gpu_memory_used_bytes{" in watch.metrics_text,
            "/metrics exports no minitrain_train_gpu_memory_used_bytes")
    gpus = [(row["rank"], g) for row in watch.rows for g in row["gpus"]]
    summary = f"/api/ranks after {watch.seen_after_s} s: " + "; ".join(
        f"rank {rank} GPU {g['index']} util {g['util_percent']}% memory {g['memory_used_bytes'] / 2**20:.0f}/"
        f"{g['memory_total_bytes'] / 2**20:.0f} MiB" for rank, g in gpus) + "; /metrics exports them"
    return summary, {"ranks": watch.rows, "seen_after_s": watch.seen_after_s}
