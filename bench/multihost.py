"""Workload `multihost` (optional: needs root, iproute2 and openssh-server): minitrain over real SSH on
a fake cluster of network namespaces (`scripts/netns_cluster.py`: 2 "hosts", each with its own IP and
sshd, on a bridge whose address, the driver's, is in the root namespace). Without them it is skipped
and says why. The measured code is in `multihost_jobs.py`.

start-up: a trivial 4-worker job (init, one all_reduce, one report) as 2 hosts x 2 workers over SSH
    against the same job on this machine alone; the figure is `fit()`'s wall time inside a fresh driver
    (pre-flight over ssh, agent launch over ssh, worker start, rendezvous across the veths and teardown
    all count); the driver process's whole wall time is printed beside it. Pre-flight alone is timed in
    a fresh driver of its own.
node loss (2 x 2, max_failures=0, an all_reduce and a report every 0.1 s):
    cut: once every rank made 3 steps, h1's link is cut (its root-side veth goes down: the host goes
        silent, nothing closes);
    kill: h1's local rank 0 SIGKILLs its agent.
    The latency is the event -> the first driver log record after it that says "lost" or "stopping every
    rank of the attempt". Targets: cut <= 5 s (the lease), agent kill <= 1 s.

DNS: torch's TCPStore looks up the name of every client address. Inside the fake hosts the nameserver
is routed to the driver's bridge, which drops the query silently, so each lookup stalls 10 s: unless
`keep_dns`, an `unreachable` route to each nameserver is added inside every host's namespace, and the
lookups fail at once as they do on this machine. After each job, processes left in the hosts'
namespaces (but the sshds) are awaited for up to 30 s, then killed and counted.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.common import BenchError, role_argv, say, stop_tree, tail, write_json
from bench.multihost_jobs import NUM_HOSTS, NUM_WORKERS, READY_STEP, SLOTS
from bench.table import Row, WorkloadResult, ratio

STEP_S = 0.1
CUT_AFTER_READY_S = 0.5  # after every rank is ready, so the cut falls mid-training
MAX_TRAIN_S = 90.0       # a loss job that never sees its failure ends by itself
JOB_TIMEOUT_S = 180.0
SETTLE_S = 30.0
TARGET_CUT_S = 5.0
TARGET_KILL_S = 1.0
TAG_VAR = "MINITRAIN_BENCH_MULTIHOST_TAG"
DETECTION_WORDS = ("lost", "stopping every rank of the attempt")
SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"  # netns_cluster.py, beside bench/ in the checkout


def netns_cluster():
    """scripts/netns_cluster.py as a module, or None when it is missing."""
    if not (SCRIPTS / "netns_cluster.py").exists():
        return None
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
    import netns_cluster as module

    return module


class Jobs:
    """Starts fresh driver processes (tagged, in sessions of their own) and checks that each one leaves
    nothing behind on this machine or on the cluster's hosts."""

    def __init__(self, tmp: str, cluster):
        self.tmp, self.cluster, self.tag = tmp, cluster, secrets.token_hex(8)
        self.leftovers = 0
        workdir = str(cluster.workdir)
        self.init = {"hosts": [f"{h.ip}:{SLOTS}" for h in cluster.hosts], "ssh_user": "root",
                     "ssh_identity_file": os.path.join(workdir, "id_ed25519"),
                     "ssh_known_hosts_file": os.path.join(workdir, "known_hosts"),
                     "ssh_options": ["IdentitiesOnly=yes", "GlobalKnownHostsFile=/dev/null"]}

    def start(self, name: str, mode: str, ssh: bool, config: dict | None = None) -> tuple:
        """Writes the spec and starts `--role driver`; returns (Popen, spec, start time)."""
        spec = {"mode": mode, "init": self.init if ssh else None, "config": config or {},
                "storage": os.path.join(self.tmp, "storage", name),
                "result": os.path.join(self.tmp, f"{name}.result.json"),
                "log_events": os.path.join(self.tmp, f"{name}.events.jsonl"),
                "output": os.path.join(self.tmp, f"{name}.log")}
        spec_path = os.path.join(self.tmp, f"{name}.spec.json")
        write_json(spec_path, spec)
        env = {k: v for k, v in os.environ.items() if k not in ("MINITRAIN_HOSTS", "MINITRAIN_HOSTFILE")}
        env.update({TAG_VAR: self.tag, "PYTHONUNBUFFERED": "1"})
        with open(spec["output"], "wb") as out:
            proc = subprocess.Popen(role_argv("multihost_jobs", "driver", spec_path),
                                    cwd=self.tmp, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, env=env)
        return proc, spec, time.perf_counter()

    def finish(self, proc: subprocess.Popen, spec: dict, started: float, timeout_s: float = JOB_TIMEOUT_S) -> dict:
        """Waits for the driver; returns its result with `wall_s` (the whole process). Then settles."""
        try:
            proc.wait(timeout=max(0.0, started + timeout_s - time.perf_counter()))
        except subprocess.TimeoutExpired:
            stop_tree(proc)
            raise BenchError(f"the {spec['mode']} driver timed out after {timeout_s:g} s; output tail:\n"
                             + tail(spec["output"])) from None
        finally:
            if proc.poll() is None:
                stop_tree(proc)
        wall = time.perf_counter() - started
        if proc.returncode != 0 or not os.path.exists(spec["result"]):
            raise BenchError(f"the {spec['mode']} driver exited with {proc.returncode}; output tail:\n"
                             + tail(spec["output"]))
        with open(spec["result"]) as f:
            result = json.load(f)
        result["wall_s"] = wall
        return result

    def run(self, name: str, mode: str, ssh: bool, config: dict | None = None) -> dict:
        proc, spec, started = self.start(name, mode, ssh, config)
        try:
            return self.finish(proc, spec, started)
        finally:
            self.settle()

    def settle(self) -> float:
        """Waits up to SETTLE_S s for every process in the hosts' namespaces (but the listening sshds) and
        every tagged process here to be gone; kills and counts the ones that are not. Returns the wait."""
        import psutil  # a minitrain dependency

        start = time.monotonic()
        deadline = start + SETTLE_S
        while True:
            left = self._namespace_pids() + self._tagged()
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        for pid in left:
            try:
                what = " ".join(psutil.Process(pid).cmdline())[:200]
                os.kill(pid, signal.SIGKILL)
            except (psutil.Error, OSError):
                continue
            say(f"  leftover process {pid} killed: {what}")
            self.leftovers += 1
        return time.monotonic() - start

    def _namespace_pids(self) -> list[int]:
        pids = []
        for host in self.cluster.hosts:
            out = subprocess.run(["ip", "netns", "pids", host.namespace], capture_output=True, text=True).stdout
            pids += [int(p) for p in out.split() if int(p) != host.sshd_pid]
        return pids

    def _tagged(self) -> list[int]:
        import psutil

        found = []
        for proc in psutil.process_iter():
            try:
                if proc.pid != os.getpid() and proc.environ().get(TAG_VAR) == self.tag:
                    found.append(proc.pid)
            except (psutil.Error, OSError):
                continue
        return found


def _stats(values: list[float]) -> dict:
    """values, median, min and max (seconds)."""
    return {"values_s": values, "median_s": statistics.median(values), "min_s": min(values), "max_s": max(values)}


def bench_startup(jobs: Jobs, repeats: int, warmup: bool) -> dict:
    """Start-up: alternate the 2x2 SSH job and the one-host job; then pre-flight alone."""
    runs: dict[str, list[dict]] = {"ssh": [], "local": []}
    rounds = ([False] if warmup else []) + [True] * repeats
    for index, keep in enumerate(rounds):
        ssh = jobs.run(f"start_ssh_{index}", "start", ssh=True)
        local = jobs.run(f"start_local_{index}", "start", ssh=False)
        label = "run %d/%d" % (index + (0 if warmup else 1), repeats) if keep else "warm-up"
        say(f"  {label:>9}: fit() {NUM_HOSTS}x{SLOTS} over ssh {ssh['fit_s']:6.2f} s, one host "
            f"{local['fit_s']:6.2f} s   (driver process {ssh['wall_s']:.2f} s / {local['wall_s']:.2f} s)")
        if keep:
            runs["ssh"].append(ssh)
            runs["local"].append(local)
    preflights = []
    for index in range(repeats):
        preflights.append(jobs.run(f"preflight_{index}", "preflight", ssh=True)["preflight_s"])
        say(f"  pre-flight alone over ssh ({NUM_HOSTS} hosts in parallel): {preflights[-1]:.3f} s")
    figures = {kind: {"fit": _stats([r["fit_s"] for r in rs]), "process": _stats([r["wall_s"] for r in rs])}
               for kind, rs in runs.items()}
    return {"repeats": repeats, "warmup": warmup, **figures, "preflight": _stats(preflights),
            "ratio": figures["ssh"]["fit"]["median_s"] / figures["local"]["fit"]["median_s"]}


def dns_routes(cluster, action: str) -> list[str]:
    """`action` "add" or "del": an unreachable route to every nameserver inside every host's namespace,
    so that name lookups there fail at once instead of stalling (see the module docstring)."""
    servers = netns_cluster().nameservers()
    for address in servers:
        prefix = f"{address}/{address.max_prefixlen}"
        for host in cluster.hosts:
            verb = "replace" if action == "add" else action  # the cluster may have added it already
            subprocess.run(["ip", "-n", host.namespace, f"-{address.version}", "route", verb, "unreachable",
                            prefix], check=True, capture_output=True, timeout=15)
    return [str(a) for a in servers]


def _detection(events_path: str, since: float) -> tuple:
    """The first driver log record after `since` that says the coordinator learned of the failure."""
    if not os.path.exists(events_path):
        return None, None
    with open(events_path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    for record in records:
        if record["time"] >= since and any(word in record["msg"] for word in DETECTION_WORDS):
            return record["time"], record["msg"]
    return None, None


def _wait_ready(proc: subprocess.Popen, spec: dict, out: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while sum(os.path.exists(os.path.join(out, f"ready_{r}")) for r in range(NUM_WORKERS)) < NUM_WORKERS:
        if proc.poll() is not None:
            raise BenchError("the cut job's driver ended before training ran; output tail:\n" + tail(spec["output"]))
        if time.monotonic() > deadline:
            raise BenchError(f"training did not reach step {READY_STEP} on every rank in {timeout_s:g} s")
        time.sleep(0.02)


def loss_once(jobs: Jobs, name: str, kind: str) -> dict:
    """One node-loss job (kind "cut" or "kill"); returns event -> detection and event -> fit() raised."""
    out = os.path.join(jobs.tmp, f"{name}_out")
    os.makedirs(out)
    config = {"out": out, "step_s": STEP_S, "max_s": MAX_TRAIN_S, "kill_agent": kind == "kill"}
    victim = jobs.cluster.hosts[1]
    proc, spec, started = jobs.start(name, kind, ssh=True, config=config)
    try:
        if kind == "cut":
            _wait_ready(proc, spec, out)
            time.sleep(CUT_AFTER_READY_S)
            event = time.time()
            jobs.cluster.cut(victim)
            cut_cmd_s = time.time() - event
        try:
            result = jobs.finish(proc, spec, started)
        finally:
            if kind == "cut":
                jobs.cluster.restore(victim)
    finally:
        if proc.poll() is None:  # an error before finish(): stop the driver first
            stop_tree(proc)
        settle_s = jobs.settle()
    if kind == "kill":
        with open(os.path.join(out, "kill.json")) as f:
            event = json.load(f)["time"]
    detected, message = _detection(spec["log_events"], event)
    if detected is None:
        raise BenchError(f"no log record after the {kind} said the coordinator learned of it; output tail:\n"
                         + tail(spec["output"]))
    figures = {"detect_s": detected - event, "raised_s": result["raised_at"] - event, "message": message,
               "error_head": result["error"].splitlines()[0][:300], "settle_s": settle_s}
    if kind == "cut":
        figures["cut_command_s"] = cut_cmd_s
    return figures


def bench_loss(jobs: Jobs, kind: str, repeats: int) -> dict:
    """Node loss, kind "cut" or "kill": `repeats` jobs, medians."""
    runs = []
    for index in range(repeats):
        run = loss_once(jobs, f"{kind}_{index}", kind)
        runs.append(run)
        say(f"  run {index + 1}/{repeats}: detected after {run['detect_s']:.3f} s (\"{run['message'][:90]}\"), "
            f"fit() raised after {run['raised_s']:.2f} s; hosts clean {run['settle_s']:.1f} s later")
    return {"repeats": repeats, "runs": runs, "detect": _stats([r["detect_s"] for r in runs]),
            "raised": _stats([r["raised_s"] for r in runs]),
            "target_s": TARGET_CUT_S if kind == "cut" else TARGET_KILL_S}


def _measure(jobs: Jobs, repeats: int, warmup: bool, keep_dns: bool) -> dict:
    fixed = [] if keep_dns else dns_routes(jobs.cluster, "add")
    how = "as is (keep_dns)" if keep_dns else f"lookups fail at once (unreachable route to {', '.join(fixed) or '-'})"
    say(f"  DNS inside the hosts: {how}")
    say(f"  start-up of a trivial {NUM_WORKERS}-worker job: {NUM_HOSTS} hosts x {SLOTS} over ssh vs one host "
        f"({repeats} repetition(s){', +1 warm-up' if warmup else ''}, alternating; fresh driver each)")
    start = bench_startup(jobs, repeats, warmup)
    say(f"  median fit(): over ssh {start['ssh']['fit']['median_s']:.2f} s, one host "
        f"{start['local']['fit']['median_s']:.2f} s ({start['ratio']:.2f}x); pre-flight alone "
        f"{start['preflight']['median_s']:.3f} s")
    say(f"  link cut of h1 mid-training -> the coordinator knows ({repeats} job(s); target <= {TARGET_CUT_S:g} s)")
    cut = bench_loss(jobs, "cut", repeats)
    say(f"  SIGKILL of h1's agent -> the coordinator knows ({repeats} job(s); target <= {TARGET_KILL_S:g} s)")
    kill = bench_loss(jobs, "kill", repeats)
    stall = None
    if fixed and warmup:
        say("  for reference: one 2x2 start-up over ssh with the hosts' DNS as is (stalling lookups)")
        dns_routes(jobs.cluster, "del")
        stall = jobs.run("start_ssh_dns_as_is", "start", ssh=True)
        say(f"  fit() {stall['fit_s']:.2f} s (driver process {stall['wall_s']:.2f} s)")
    start["dns_fails_fast"] = not keep_dns
    start["dns_as_is_run"] = stall
    return {"startup": start, "cut": cut, "agent_kill": kill}


def _rows(figures: dict) -> list[Row]:
    start, cut, kill = figures["startup"], figures["cut"], figures["agent_kill"]

    def span(stats: dict, digits: int = 2) -> str:
        return f"{stats['median_s']:.{digits}f} s ({stats['min_s']:.{digits}f}-{stats['max_s']:.{digits}f})"

    n = start["repeats"]
    return [
        Row("multihost", f"trivial job start-up, fit() wall time, {NUM_HOSTS} hosts x {SLOTS} workers over SSH, "
            f"median (min-max) of {n}", span(start["ssh"]["fit"]), f"one host, {NUM_WORKERS} workers "
            f"{span(start['local']['fit'])}", ratio(start["ssh"]["fit"]["median_s"], start["local"]["fit"]["median_s"])),
        Row("multihost", "pre-flight of both hosts (in parallel)", span(start["preflight"])),
        Row("multihost", f"host's link cut -> coordinator knows (keepalive, lease), median of {cut['repeats']}",
            span(cut["detect"], 3), "-", "-", f"<= {TARGET_CUT_S:g} s", cut["detect"]["max_s"] <= TARGET_CUT_S),
        Row("multihost", f"remote agent SIGKILL -> coordinator knows, median of {kill['repeats']}",
            span(kill["detect"], 3), "-", "-", f"<= {TARGET_KILL_S:g} s", kill["detect"]["max_s"] <= TARGET_KILL_S),
    ]


def bench_multihost(tmp: str, repeats: int, warmup: bool, keep_dns: bool = False) -> WorkloadResult:
    """The whole workload on a fresh fake cluster; skipped (a row saying why) where none can be built."""
    cluster_module = netns_cluster()
    reason = "scripts/netns_cluster.py not found" if cluster_module is None else \
        cluster_module.unavailable_reason(probe=True)
    if reason:
        say(f"  skipped: cannot build the fake multi-host cluster here ({reason}); nothing was measured")
        return WorkloadResult("multihost", [Row("multihost", "fake 2-host cluster", f"skipped: {reason}")],
                              {"skipped": reason})
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: drivers stopped, cluster down
    try:
        with cluster_module.NetnsCluster(NUM_HOSTS, os.path.join(tmp, "cluster")) as cluster:
            say(f"  cluster: {', '.join(f'{h.name} {h.ip}' for h in cluster.hosts)}, driver {cluster.driver_ip} "
                f"(up in {cluster.up_seconds:.2f} s)")
            jobs = Jobs(tmp, cluster)
            figures = _measure(jobs, repeats, warmup, keep_dns)
    except cluster_module.ClusterError as exc:
        raise BenchError(f"the fake cluster failed: {exc}") from exc
    finally:
        signal.signal(signal.SIGTERM, previous)
    figures["leftover_processes"] = jobs.leftovers
    say(f"  leftover processes killed after the jobs: {jobs.leftovers}")
    return WorkloadResult("multihost", _rows(figures), figures)
