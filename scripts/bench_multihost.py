"""Multi-host benchmark of minitrain over real SSH, on a fake cluster of network namespaces.

    python scripts/bench_multihost.py                 # full: 3 repetitions of everything (+1 start-up warm-up)
    python scripts/bench_multihost.py --repeats 5 --json bench.json
    python scripts/bench_multihost.py --quick         # CI: 1 repetition, no warm-up

The cluster is scripts/netns_cluster.py: 2 "hosts", each a network namespace with its own IP and its
own sshd, on a bridge whose address (the driver's) is in the root namespace. Building it needs root,
iproute2 and openssh-server; without them this prints why and exits 0 having measured nothing.

What is measured, and how (gloo on CPU; every job is a fresh driver process, this file with --role driver):

1. Start-up of a trivial 4-worker job (each worker: the process group's init, one all_reduce, one
   report): 2 hosts x 2 workers over SSH (`minitrain.init(hosts=["<h0>:2", "<h1>:2"], ...)`) against
   the same job on this machine alone (no init: localhost, no ssh). The figure is the wall time of
   `TorchTrainer(...).fit()` inside the driver, so pre-flight over ssh, agent launch over ssh, worker
   start, rendezvous across the veths and teardown all count; the driver process's whole wall time
   (interpreter and imports too) is printed beside it. The two run alternately, after one warm-up
   pair in the full mode (excluded). Pre-flight alone is timed in a fresh driver of its own:
   `minitrain.ssh.preflight(minitrain.current_cluster(), expected_version=minitrain.__version__)`.
2. Node loss, 2 hosts x 2 workers, FailureConfig(max_failures=0): the workers all_reduce and report
   every STEP_S seconds.
   a. Link cut: once every rank has made READY_STEP steps, this process records time.time() and cuts
      h1's link (`cluster.cut`, the root-side veth goes down: the host goes silent, nothing closes).
   b. Agent SIGKILL: h1's local rank 0 writes time.time() to a file, then SIGKILLs its parent, the node
      agent (the agent's session stream breaks at once).
   The driver times every `minitrain` log record (a logging.Handler on that logger); the latency is the
   event -> the first record after it whose message contains "lost" or "stopping every rank of the
   attempt", i.e. the moment the coordinator learned of the failure. The event -> fit() raising is
   printed too. Targets: cut <= 5 s (the lease: 5 s of silence), agent kill ~immediate (<= 1 s).

DNS: torch's TCPStore looks up the name of every client address (getnameinfo). This machine fails
that at once, but from inside the fake hosts the nameserver of /etc/resolv.conf is routed to the
driver's bridge, which drops the query silently: each lookup then stalls 10 s (two 5 s tries) and a
2x2 start-up takes ~20 s more, a property of the fake cluster, not of minitrain. So, unless
`--keep-dns`, an `unreachable` route to each non-loopback nameserver is added inside every host's
namespace (gone with the namespace), and the lookups fail at once as they do here. In the full mode
one more 2x2 start-up runs at the end with those routes removed, for reference.

After each job, processes left in the hosts' namespaces (other than the listening sshds) are awaited
for up to SETTLE_S s and then killed and counted, as is any process of this machine still carrying
this run's tag in its environment (`leftover_processes`, which should be 0). Everything lives under
one tempfile.TemporaryDirectory() (the cluster's keys and configs too); the cluster is torn down and
every namespace deleted, also on errors and on SIGTERM.
Only the standard library is imported at the top, so the measured processes pay nothing for this file.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_core import BenchError, _stop_tree, machine_info  # noqa: E402

SCRIPT = os.path.abspath(__file__)
NUM_HOSTS = 2
SLOTS = 2
NUM_WORKERS = NUM_HOSTS * SLOTS
STEP_S = 0.1
READY_STEP = 3           # every rank made this many steps: training runs across both hosts
CUT_AFTER_READY_S = 0.5  # then this long before the cut, so the cut falls mid-training
KILL_STEP = 8            # the step at which h1's local rank 0 kills its agent
MAX_TRAIN_S = 90.0       # a loss job that never sees its failure ends by itself
JOB_TIMEOUT_S = 180.0
SETTLE_S = 30.0
TARGET_CUT_S = 5.0
TARGET_KILL_S = 1.0
TAG_VAR = "MINITRAIN_BENCH_MULTIHOST_TAG"
DETECTION_WORDS = ("lost", "stopping every rank of the attempt")


# ---------------------------------------------------------------------- code run by the measured processes


def trivial_train_func(config: dict) -> None:
    """Benchmark 1: one all_reduce across every rank and one report."""
    import torch
    import torch.distributed as dist

    import minitrain

    t = torch.ones(1)
    dist.all_reduce(t)
    minitrain.report({"x": t.item()})


def loss_train_func(config: dict) -> None:
    """Benchmark 2: all_reduce + report every STEP_S s until the failure stops the group (or MAX_TRAIN_S).
    Every rank marks READY_STEP; with `kill_agent`, h1's local rank 0 records the time and kills its agent."""
    import torch
    import torch.distributed as dist

    import minitrain

    context = minitrain.get_context()
    rank, out = context.get_world_rank(), config["out"]
    killer = config["kill_agent"] and context.get_node_rank() == 1 and context.get_local_rank() == 0
    deadline = time.time() + config["max_s"]
    step = 0
    while time.time() < deadline:
        dist.all_reduce(torch.ones(1))
        minitrain.report({"step": step})
        step += 1
        if step == READY_STEP:
            open(os.path.join(out, f"ready_{rank}"), "w").close()
        if killer and step == KILL_STEP:
            _write_json(os.path.join(out, "kill.json"), {"time": time.time(), "agent_pid": os.getppid()})
            os.kill(os.getppid(), signal.SIGKILL)  # this worker's node agent, on h1
            time.sleep(600)  # the parent-death signal ends this process
        time.sleep(config["step_s"])


def _write_json(path: str, data: dict) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(data, f)
    os.replace(path + ".tmp", path)


class _TimedLog(logging.Handler):
    """The driver's `minitrain` log records with their creation time, as JSON lines (and on stderr)."""

    def __init__(self, path: str):
        super().__init__(logging.DEBUG)
        self._path = path

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        with open(self._path, "a") as f:
            f.write(json.dumps({"time": record.created, "level": record.levelname, "msg": message}) + "\n")
        sys.stderr.write(f"{record.created:.3f} minitrain {record.levelname}: {message}\n")


def role_driver(spec: dict) -> None:
    """A fresh driver: init the cluster (or not: localhost), then pre-flight alone, or one fit()."""
    import minitrain

    if spec["init"] is not None:
        minitrain.init(**spec["init"])
    if spec["mode"] == "preflight":
        from minitrain.ssh import preflight

        start = time.perf_counter()
        preflight(minitrain.current_cluster(), expected_version=minitrain.__version__)
        _write_json(spec["result"], {"preflight_s": time.perf_counter() - start})
        return
    from minitrain import FailureConfig, RunConfig, ScalingConfig, WorkerGroupError
    from minitrain.torch import TorchTrainer

    if spec.get("log_events"):
        logging.getLogger("minitrain").addHandler(_TimedLog(spec["log_events"]))
    loss = spec["mode"] != "start"
    trainer = TorchTrainer(loss_train_func if loss else trivial_train_func, train_loop_config=spec["config"],
                           scaling_config=ScalingConfig(num_workers=NUM_WORKERS),
                           run_config=RunConfig(name="bench", storage_path=spec["storage"],
                                                failure_config=FailureConfig(max_failures=0)))
    start = time.perf_counter()
    try:
        result = trainer.fit()
    except WorkerGroupError as exc:
        if not loss:
            raise
        _write_json(spec["result"], {"fit_s": time.perf_counter() - start, "raised_at": time.time(),
                                     "error": f"{type(exc).__name__}: {str(exc)[:2000]}"})
        return
    fit_s = time.perf_counter() - start
    assert not loss, f"the {spec['mode']} job finished without seeing its failure: {result.metrics}"
    assert result.metrics == {"x": float(NUM_WORKERS)}, result.metrics  # every rank took part
    _write_json(spec["result"], {"fit_s": fit_s})


# ---------------------------------------------------------------------- the benchmark driver


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
        _write_json(spec_path, spec)
        env = {k: v for k, v in os.environ.items() if k not in ("MINITRAIN_HOSTS", "MINITRAIN_HOSTFILE")}
        env.update({TAG_VAR: self.tag, "PYTHONUNBUFFERED": "1"})
        with open(spec["output"], "wb") as out:
            proc = subprocess.Popen([sys.executable, SCRIPT, "--role", "driver", "--spec", spec_path],
                                    cwd=self.tmp, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, env=env)
        return proc, spec, time.perf_counter()

    def finish(self, proc: subprocess.Popen, spec: dict, started: float, timeout_s: float = JOB_TIMEOUT_S) -> dict:
        """Waits for the driver; returns its result with `wall_s` (the whole process). Then settles."""
        try:
            proc.wait(timeout=max(0.0, started + timeout_s - time.perf_counter()))
        except subprocess.TimeoutExpired:
            _stop_tree(proc)
            raise BenchError(f"the {spec['mode']} driver timed out after {timeout_s:g} s; output tail:\n"
                             + _tail(spec["output"])) from None
        finally:
            if proc.poll() is None:
                _stop_tree(proc)
        wall = time.perf_counter() - started
        if proc.returncode != 0 or not os.path.exists(spec["result"]):
            raise BenchError(f"the {spec['mode']} driver exited with {proc.returncode}; output tail:\n"
                             + _tail(spec["output"]))
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
            print(f"  leftover process {pid} killed: {what}", flush=True)
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


def _tail(path: str, chars: int = 3000) -> str:
    with open(path, "rb") as f:
        return f.read().decode(errors="replace")[-chars:]


def _stats(values: list[float]) -> dict:
    return {"values_s": values, "median_s": statistics.median(values), "min_s": min(values), "max_s": max(values)}


def bench_startup(jobs: Jobs, repeats: int, warmup: bool) -> dict:
    """Benchmark 1: alternate the 2x2 SSH job and the one-host job; then pre-flight alone."""
    runs: dict[str, list[dict]] = {"ssh": [], "local": []}
    rounds = ([False] if warmup else []) + [True] * repeats
    for index, keep in enumerate(rounds):
        ssh = jobs.run(f"start_ssh_{index}", "start", ssh=True)
        local = jobs.run(f"start_local_{index}", "start", ssh=False)
        label = "run %d/%d" % (index + (0 if warmup else 1), repeats) if keep else "warm-up"
        print(f"  {label:>9}: fit() {NUM_HOSTS}x{SLOTS} over ssh {ssh['fit_s']:6.2f} s, one host "
              f"{local['fit_s']:6.2f} s   (driver process {ssh['wall_s']:.2f} s / {local['wall_s']:.2f} s)", flush=True)
        if keep:
            runs["ssh"].append(ssh)
            runs["local"].append(local)
    preflights = []
    for index in range(repeats):
        preflights.append(jobs.run(f"preflight_{index}", "preflight", ssh=True)["preflight_s"])
        print(f"  pre-flight alone over ssh ({NUM_HOSTS} hosts in parallel): {preflights[-1]:.3f} s", flush=True)
    figures = {kind: {"fit": _stats([r["fit_s"] for r in rs]), "process": _stats([r["wall_s"] for r in rs])}
               for kind, rs in runs.items()}
    return {"repeats": repeats, "warmup": warmup, **figures, "preflight": _stats(preflights),
            "ratio": figures["ssh"]["fit"]["median_s"] / figures["local"]["fit"]["median_s"]}


def dns_routes(cluster, action: str) -> list[str]:
    """`action` "add" or "del": an unreachable route to every nameserver inside every host's namespace,
    so that name lookups there fail at once instead of stalling (see the module docstring)."""
    import netns_cluster  # scripts/netns_cluster.py, beside this file

    servers = netns_cluster.nameservers()
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
            raise BenchError("the cut job's driver ended before training ran; output tail:\n" + _tail(spec["output"]))
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
            _stop_tree(proc)
        settle_s = jobs.settle()
    if kind == "kill":
        with open(os.path.join(out, "kill.json")) as f:
            event = json.load(f)["time"]
    detected, message = _detection(spec["log_events"], event)
    if detected is None:
        raise BenchError(f"no log record after the {kind} said the coordinator learned of it; output tail:\n"
                         + _tail(spec["output"]))
    figures = {"detect_s": detected - event, "raised_s": result["raised_at"] - event, "message": message,
               "error_head": result["error"].splitlines()[0][:300], "settle_s": settle_s}
    if kind == "cut":
        figures["cut_command_s"] = cut_cmd_s
    return figures


def bench_loss(jobs: Jobs, kind: str, repeats: int) -> dict:
    """Benchmark 2a (kind "cut") or 2b ("kill"): `repeats` jobs, medians."""
    runs = []
    for index in range(repeats):
        run = loss_once(jobs, f"{kind}_{index}", kind)
        runs.append(run)
        print(f"  run {index + 1}/{repeats}: detected after {run['detect_s']:.3f} s (\"{run['message'][:90]}\"), "
              f"fit() raised after {run['raised_s']:.2f} s; hosts clean {run['settle_s']:.1f} s later", flush=True)
    return {"repeats": repeats, "runs": runs, "detect": _stats([r["detect_s"] for r in runs]),
            "raised": _stats([r["raised_s"] for r in runs]),
            "target_s": TARGET_CUT_S if kind == "cut" else TARGET_KILL_S}


def markdown_table(machine: dict, start: dict, cut: dict, kill: dict, command: str) -> str:
    """The README table."""
    def met(value: float, target: float) -> str:
        return "yes" if value <= target else "**no**"

    def span(stats: dict, digits: int = 2) -> str:
        return f"{stats['median_s']:.{digits}f} s ({stats['min_s']:.{digits}f}-{stats['max_s']:.{digits}f})"

    n = start["repeats"]
    rows = [
        f"| Measure ({NUM_HOSTS} hosts x {SLOTS} workers over SSH, netns, gloo, CPU; median (min-max)) "
        f"| 2x2 over SSH | one host, 4 workers | ratio | target | met |",
        "|---|---|---|---|---|---|",
        f"| Trivial job start-up: `fit()` wall time ({n} runs) | {span(start['ssh']['fit'])} "
        f"| {span(start['local']['fit'])} | {start['ratio']:.2f}x | - | - |",
        f"| Trivial job: whole driver process wall time | {span(start['ssh']['process'])} "
        f"| {span(start['local']['process'])} | - | - | - |",
        f"| Pre-flight alone (both hosts in parallel) | {span(start['preflight'])} | - | - | - | - |",
        *([f"| Same, the fake hosts' DNS as is (stalling lookups; 1 run) "
           f"| {start['dns_as_is_run']['fit_s']:.2f} s | - | - | - | - |"] if start.get("dns_as_is_run") else []),
        f"| Link cut -> coordinator knows ({cut['repeats']} runs) | {span(cut['detect'], 3)} | - | - "
        f"| <= {TARGET_CUT_S:g} s (the lease) | {met(cut['detect']['median_s'], TARGET_CUT_S)} |",
        f"| Link cut -> `fit()` raised | {span(cut['raised'])} | - | - | - | - |",
        f"| Agent SIGKILL -> coordinator knows ({kill['repeats']} runs) | {span(kill['detect'], 3)} | - | - "
        f"| <= {TARGET_KILL_S:g} s | {met(kill['detect']['median_s'], TARGET_KILL_S)} |",
        f"| Agent SIGKILL -> `fit()` raised | {span(kill['raised'])} | - | - | - | - |",
    ]
    footer = (f"\n_Machine: {machine['cpu']}, {machine['cores']} cores, Python {machine['python']}, "
              f"torch {machine['torch']}, grpcio {machine['grpcio']}; load average {machine['load_1min']} at the "
              f"start, {machine['load_1min_end']} at the end; `{command}`._")
    return "\n".join(rows) + "\n" + footer


def _measure(jobs: Jobs, repeats: int, warmup: bool, keep_dns: bool) -> dict:
    fixed = [] if keep_dns else dns_routes(jobs.cluster, "add")
    how = "as is (--keep-dns)" if keep_dns else f"lookups fail at once (unreachable route to {', '.join(fixed) or '-'})"
    print(f"DNS inside the hosts: {how}", flush=True)
    print(f"\n1. Start-up of a trivial {NUM_WORKERS}-worker job: {NUM_HOSTS} hosts x {SLOTS} over ssh vs one host "
          f"({repeats} repetition(s){', +1 warm-up' if warmup else ''}, alternating; fresh driver each)", flush=True)
    start = bench_startup(jobs, repeats, warmup)
    print(f"  median fit(): over ssh {start['ssh']['fit']['median_s']:.2f} s, one host "
          f"{start['local']['fit']['median_s']:.2f} s ({start['ratio']:.2f}x); pre-flight alone "
          f"{start['preflight']['median_s']:.3f} s", flush=True)
    print(f"\n2a. Link cut of h1 mid-training -> the coordinator knows ({repeats} job(s); target <= "
          f"{TARGET_CUT_S:g} s)", flush=True)
    cut = bench_loss(jobs, "cut", repeats)
    print(f"\n2b. SIGKILL of h1's agent -> the coordinator knows ({repeats} job(s); target <= {TARGET_KILL_S:g} s)",
          flush=True)
    kill = bench_loss(jobs, "kill", repeats)
    stall = None
    if fixed and warmup:
        print("\n3. For reference: one 2x2 start-up over ssh with the hosts' DNS as is (stalling lookups)", flush=True)
        dns_routes(jobs.cluster, "del")
        stall = jobs.run("start_ssh_dns_as_is", "start", ssh=True)
        print(f"  fit() {stall['fit_s']:.2f} s (driver process {stall['wall_s']:.2f} s)", flush=True)
    start["dns_fails_fast"] = not keep_dns
    start["dns_as_is_run"] = stall
    return {"startup": start, "cut": cut, "agent_kill": kill}


def run_benchmarks(args: argparse.Namespace) -> int:
    repeats = 1 if args.quick else args.repeats
    warmup = not args.quick
    machine = machine_info()
    print(f"Machine: {machine['cpu']}, {machine['cores']} cores, {machine['os']}; Python {machine['python']}, "
          f"torch {machine['torch']}, grpcio {machine['grpcio']}, minitrain {machine['minitrain']}; "
          f"load average {machine['load_1min']}", flush=True)
    if machine["load_1min"] > 0.5 * machine["cores"]:
        print("  note: the machine is busy; the wall times below are noisier than on an idle machine")
    import netns_cluster  # scripts/netns_cluster.py, beside this file

    if reason := netns_cluster.unavailable_reason(probe=True):
        print(f"\nskipped: cannot build the fake multi-host cluster here ({reason}); nothing was measured.")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"machine": machine, "quick": args.quick, "skipped": reason}, f, indent=2)
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: drivers stopped, cluster down
    with tempfile.TemporaryDirectory(prefix="minitrain-bench-multihost-", dir=args.tmp_dir) as tmp:
        try:
            with netns_cluster.NetnsCluster(NUM_HOSTS, os.path.join(tmp, "cluster")) as cluster:
                print(f"cluster: {', '.join(f'{h.name} {h.ip}' for h in cluster.hosts)}, driver {cluster.driver_ip} "
                      f"(up in {cluster.up_seconds:.2f} s)", flush=True)
                jobs = Jobs(tmp, cluster)
                figures = _measure(jobs, repeats, warmup, args.keep_dns)
        except (BenchError, netns_cluster.ClusterError) as exc:
            print(f"\nbenchmark failed: {exc}", file=sys.stderr)
            return 1
    machine["load_1min_end"] = round(os.getloadavg()[0], 2)
    figures["leftover_processes"] = jobs.leftovers
    print(f"\nleftover processes killed after the jobs: {jobs.leftovers}")
    command = "python scripts/bench_multihost.py" + (" --quick" if args.quick else f" --repeats {repeats}")
    table = markdown_table(machine, figures["startup"], figures["cut"], figures["agent_kill"], command)
    print("\n" + table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "quick": args.quick, **figures, "markdown": table}, f, indent=2)
        print(f"\nfigures written to {args.json}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="measured repetitions of each job (default 3)")
    parser.add_argument("--quick", action="store_true", help="1 repetition, no warm-up (proves the benchmark works)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON to PATH")
    parser.add_argument("--tmp-dir", metavar="DIR", help="where the temporary directory goes (default: the system's)")
    parser.add_argument("--keep-dns", action="store_true",
                        help="leave the fake hosts' DNS as is (name lookups there stall 10 s each)")
    # Internal: what the measured processes run.
    parser.add_argument("--role", choices=["driver"], help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role == "driver":
        with open(args.spec) as f:
            role_driver(json.load(f))
        return 0
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    return run_benchmarks(args)


if __name__ == "__main__":
    sys.exit(main())
