"""What every benchmark workload shares: processes, timing, statistics, machine facts, RSS sampling.

Standard library at module level only (psutil is imported where it is needed), so the processes
that run measured code pay nothing for this module.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import platform
import signal
import statistics
import subprocess
import sys
import threading
import time
from importlib import metadata
from typing import Iterable, Optional, Sequence

STOP_GRACE_S = 5.0
NUM_WORKERS = 2  # every single-machine workload: 2 CPU workers, gloo


class BenchError(RuntimeError):
    """A measured process failed or timed out; the message carries its output tail."""


# ---------------------------------------------------------------------- statistics


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of `values`; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = -(-len(ordered) * q // 100)  # ceil
    return ordered[int(max(0, min(len(ordered) - 1, rank - 1)))]


def summary(values: Sequence[float]) -> dict:
    """n, median, p90, min and max of `values` (seconds); None figures when empty."""
    if not values:
        return {"n": 0, "median_s": None, "p90_s": None, "max_s": None, "min_s": None, "values_s": []}
    return {"n": len(values), "median_s": statistics.median(values), "p90_s": percentile(values, 90),
            "max_s": max(values), "min_s": min(values), "values_s": list(values)}


def fmt_s(value: Optional[float], digits: int = 2) -> str:
    """`1.23 s`, or `-` for None."""
    return "-" if value is None else f"{value:.{digits}f} s"


# ---------------------------------------------------------------------- files


def write_json(path: str, data) -> None:
    """Write `data` as JSON atomically (a reader never sees half a file)."""
    with open(path + ".tmp", "w") as f:
        json.dump(data, f)
    os.replace(path + ".tmp", path)


def read_json(path: str):
    """The JSON document at `path`."""
    with open(path) as f:
        return json.load(f)


def append_jsonl(path: str, record: dict) -> None:
    """Append one JSON line (one write(2) on an O_APPEND file: lines of several processes never mix)."""
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def read_jsonl(path: str) -> list[dict]:
    """Every record of a JSON-lines file; empty when the file does not exist."""
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def tail(path: str, chars: int = 3000) -> str:
    """The last `chars` characters of a file (for error messages)."""
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")[-chars:]
    except OSError:
        return ""


class TimedLog(logging.Handler):
    """Records of the `minitrain` logger with their creation time, as JSON lines (and on stderr).

    The driver of a measured job installs it; the benchmark reads when the coordinator learned of a
    failure from these timestamps.
    """

    def __init__(self, path: str):
        super().__init__(logging.DEBUG)
        self._path = path

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        append_jsonl(self._path, {"time": record.created, "level": record.levelname, "msg": message})
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created)) + f".{int(record.msecs):03d}"
        sys.stderr.write(f"{stamp} minitrain {record.levelname}: {message}\n")

    @classmethod
    def install(cls, path: str) -> None:
        """Send the `minitrain` logger's records to `path` (and stderr) only."""
        log = logging.getLogger("minitrain")
        log.addHandler(cls(path))
        log.propagate = False


# ---------------------------------------------------------------------- processes


def stop_tree(proc: subprocess.Popen) -> None:
    """SIGTERM the child and every descendant (launchers put workers in sessions of their own), wait
    out a grace, then SIGKILL whatever is left."""
    import psutil  # a minitrain dependency; needed only on this path

    try:
        procs = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        procs = []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in procs:
            try:
                p.send_signal(sig)
            except psutil.NoSuchProcess:
                pass
        _, procs = psutil.wait_procs(procs, timeout=STOP_GRACE_S)
        if not procs:
            break
    try:
        proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        pass


def run_timed(argv: list[str], cwd: str, timeout_s: float, env: Optional[dict] = None,
              on_start=None) -> float:
    """Run argv to completion in its own session; return its wall time in seconds (spawn to exit).

    `on_start(proc)` (optional) is called right after the spawn (e.g. to start an RSS sampler).
    BenchError with the output tail when it fails or times out (its whole tree is then stopped).
    """
    start = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True, env=env)
    if on_start is not None:
        on_start(proc)
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        stop_tree(proc)
        output, _ = proc.communicate()
        raise BenchError(f"{' '.join(argv)} timed out after {timeout_s:g} s; output tail:\n"
                         + output.decode(errors="replace")[-3000:]) from None
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise BenchError(f"{' '.join(argv)} exited with {proc.returncode}; output tail:\n"
                         + output.decode(errors="replace")[-3000:])
    return elapsed


def role_argv(module: str, role: str, spec_path: str) -> list[str]:
    """`python -m bench.<module> --role <role> --spec <spec_path>`: a measured process."""
    return [sys.executable, "-m", f"bench.{module}", "--role", role, "--spec", spec_path]


def role_main(description: str, roles: dict, argv=None) -> int:
    """The command line of a role process (`role_argv`): `--role NAME --spec PATH`, calling
    `roles[NAME]` with the spec read from PATH; 0 when it returns."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--role", choices=sorted(roles), required=True)
    parser.add_argument("--spec", required=True)
    args = parser.parse_args(argv)
    roles[args.role](read_json(args.spec))
    return 0


def run_role(tmp: str, module: str, role: str, spec: dict, name: str, timeout_s: float,
             on_start=None) -> float:
    """Write `spec` under `tmp`, run the role process to completion; its whole wall time in seconds."""
    path = os.path.join(tmp, f"spec_{name}.json")
    write_json(path, spec)
    return run_timed(role_argv(module, role, path), cwd=tmp, timeout_s=timeout_s, on_start=on_start)


def torchrun_argv(module: str, args: Iterable[str], nproc: int = NUM_WORKERS,
                  max_restarts: Optional[int] = None) -> list[str]:
    """`torchrun --standalone --nproc-per-node N [--max-restarts R] -m bench.<module> args`,
    torchrun from this interpreter's environment (`python -m torch.distributed.run` if absent). Its logs
    go to `torchelastic/` in the job's working directory (the bench's temporary directory): by default
    torchrun makes a /tmp/torchelastic_* directory per job and leaves it there."""
    candidate = os.path.join(os.path.dirname(sys.executable), "torchrun")
    base = [candidate] if os.access(candidate, os.X_OK) else [sys.executable, "-m", "torch.distributed.run"]
    restarts = ["--max-restarts", str(max_restarts)] if max_restarts is not None else []
    return [*base, "--standalone", "--nproc-per-node", str(nproc), *restarts, "--log-dir", "torchelastic", "-m",
            f"bench.{module}", *args]


def tagged_env(tag_var: str, tag: str) -> dict:
    """This environment plus `tag_var=tag` (to find every descendant later) and unbuffered output."""
    env = dict(os.environ)
    env[tag_var] = tag
    env["PYTHONUNBUFFERED"] = "1"
    return env


def reap_tagged(tag_var: str, tag: str) -> int:
    """Kill every process still carrying `tag_var=tag` in its environment; return how many there were."""
    import psutil

    left = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and proc.environ().get(tag_var) == tag:
                left.append(proc)
        except (psutil.Error, OSError):
            continue
    for proc in left:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(left, timeout=5)
    return len(left)


# ---------------------------------------------------------------------- memory


def peak_rss_mib(pid: int) -> Optional[float]:
    """VmHWM (the peak resident set so far) of a live process, MiB; None when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def self_peak_rss_mib() -> float:
    """This process's peak resident set so far, MiB."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


class PeakRssSampler:
    """Polls the peak RSS (VmHWM) of a process tree's members while it runs, keyed by a label.

    `classify(cmdline) -> label or None` chooses which descendants count (e.g. "agent"); the root
    process is `root_label`. VmHWM only grows, so the last value read before a process exits is its
    peak up to `interval_s` before the end. Use as a context manager around the process's life.
    """

    def __init__(self, root_pid: int, root_label: str, classify, interval_s: float = 0.05):
        # VmHWM of known processes every interval_s; new descendants looked for every 5 intervals.
        self._root_pid, self._root_label = root_pid, root_label
        self._classify = classify
        self._interval_s = interval_s
        self.peaks: dict[str, float] = {}
        self.pids: dict[int, str] = {}  # the live processes found so far -> their label
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def _labelled(self):
        import psutil

        try:
            root = psutil.Process(self._root_pid)
            yield self._root_pid, self._root_label
            for child in root.children(recursive=True):
                try:
                    label = self._classify(child.cmdline())
                except psutil.Error:
                    continue
                if label:
                    yield child.pid, label
        except psutil.Error:
            return

    def _run(self) -> None:
        known = self.pids
        for tick in itertools.count():
            if tick % 5 == 0:  # finding the children walks /proc: not at every tick
                known.update(self._labelled())
            for pid, label in list(known.items()):
                peak = peak_rss_mib(pid)
                if peak is None:
                    del known[pid]
                else:
                    self.peaks[label] = max(self.peaks.get(label, 0.0), peak)
            if self._stop.wait(self._interval_s):
                return

    def __enter__(self) -> "PeakRssSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


# ---------------------------------------------------------------------- machine


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def machine_info() -> dict:
    """CPU model, usable cores, versions and load: the context every figure needs."""
    model = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": model, "cores": usable, "python": platform.python_version(),
            "torch": _version("torch"), "grpcio": _version("grpcio"), "minitrain": _version("minitrain"),
            "os": f"{platform.system()} {platform.release()}", "load_1min": round(os.getloadavg()[0], 2)}


def machine_line(machine: dict) -> str:
    """One line describing the machine, for the start of a benchmark's output."""
    line = (f"Machine: {machine['cpu']}, {machine['cores']} cores, {machine['os']}; Python {machine['python']}, "
            f"torch {machine['torch']}, grpcio {machine['grpcio']}, minitrain {machine['minitrain']}; "
            f"load average {machine['load_1min']}")
    if machine["load_1min"] > 0.5 * machine["cores"]:
        line += "\n  note: the machine is busy; the figures below are noisier than on an idle machine"
    return line


def disk_info(path: str) -> str:
    """The filesystem type and device under `path` (from /proc/mounts), with its free space."""
    import shutil

    best = ("", "unknown device", "unknown filesystem")
    try:
        with open("/proc/mounts") as f:
            for line in f:
                device, mount, fstype = line.split()[:3]
                if (path == mount or path.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best[0]):
                    best = (mount, device, fstype)
    except OSError:
        pass
    free = shutil.disk_usage(path).free / (1 << 30)
    return f"{best[2]} on {best[1]} ({free:.0f} GiB free)"


def say(text: str = "") -> None:
    """Print progress at once (benchmarks run for minutes; their output is watched)."""
    print(text, flush=True)
