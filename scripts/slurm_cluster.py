#!/usr/bin/env python3
"""A real Slurm cluster on one machine, for tests and benchmarks: Debian's slurmctld, one slurmd per fake
host and a private munged. Needs root, iproute2, util-linux (nsenter, setpriv) and Debian's Slurm
(`install_packages()` installs it; scripts/install_system_deps.sh too).

The hosts are network namespaces on a bridge (scripts/netns_cluster.py, beside this file), so
each node has its own address, as on a real cluster; slurmctld and munged run in the root namespace
(slurmctld on the bridge address). Every node is named by its IP address (``NodeName=10.a.b.10``), so
``SLURM_JOB_NODELIST`` reads like ``10.a.b.[10-11]`` and the names resolve without DNS.

    def test_x(slurm_cluster):                              # tests' fixture: one per session (xdist worker)
    with SlurmCluster(tmp_path / "slurm") as slurm:         # or by hand: up() on enter, down() on exit
        slurm.env                                            # SLURM_CONF for sbatch/srun/squeue
        slurm.run(["sinfo"])                                 # a client command, text output captured
        slurm.nodes                                          # ["10.a.b.10", "10.a.b.11"]
        job = slurm.sbatch(script, "-N2"); slurm.wait_job(job, 60)

Everything lives under the work directory: slurm.conf (``AuthInfo=...,cred_expire=10``,
``KillWait=2``, ``JobRequeue=1``, ``TaskPlugin=task/affinity``, two CPUs per node), the munge key and
socket, state, spool and logs. The daemons run in the foreground under ``setpriv --pdeathsig KILL``,
so they die with the process that started them even if it is killed before its teardown. `down()`
stops them (slurmctld and munged by their own pids; the slurmd's and every job step with the
namespaces, which NetnsCluster also sweeps after a killed owner), removes the namespaces and the
files, and leaves nothing running. `unavailable_reason()` says why a cluster cannot be made here (not
root, no netns, the packages missing and, with `install=True`, not installable).

    python scripts/slurm_cluster.py up --dir DIR        # stays up until Ctrl-C; prints SLURM_CONF
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
DAEMONS = {"slurmctld": "/usr/sbin/slurmctld", "slurmd": "/usr/sbin/slurmd", "munged": "/usr/sbin/munged",
           "sbatch": "/usr/bin/sbatch", "srun": "/usr/bin/srun"}
CRED_EXPIRE_S = 10
KILL_WAIT_S = 2
CPUS_PER_NODE = 2
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
         "BOOT_FAIL", "DEADLINE"}
_PDEATHSIG = ["setpriv", "--pdeathsig", "KILL"]  # dies with the process that started it


class SlurmError(RuntimeError):
    """The cluster could not be brought up; the message says which daemon and shows its log's tail."""


def _missing() -> list[str]:
    return [name for name, path in DAEMONS.items() if not os.access(path, os.X_OK)]


def _install() -> str | None:
    """apt-get install the packages (as scripts/install_system_deps.sh does); why not, or None."""
    if shutil.which("apt-get") is None:
        return "no apt-get to install them with"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    argv = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL, timeout=600)
    if done.returncode != 0:  # the package lists may be missing on a fresh machine
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True, env=env, timeout=600)
        done = subprocess.run(argv, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL,
                              timeout=600)
    return None if done.returncode == 0 else f"apt-get install failed: {done.stderr.strip()[-300:]}"


def netns_module():
    """scripts/netns_cluster.py as the module `netns_cluster` (shared with tests/cluster.py and the bench)."""
    if (mod := sys.modules.get("netns_cluster")) is None:
        spec = importlib.util.spec_from_file_location("netns_cluster", Path(__file__).with_name("netns_cluster.py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules["netns_cluster"] = mod  # before exec: dataclasses look their module up
        spec.loader.exec_module(mod)
    return mod


def unavailable_reason(install: bool = False, probe: bool = True) -> str | None:
    """Why a Slurm cluster cannot be made here, or None. With `install`, missing packages are installed
    first (apt-get, as root). `probe` really creates a network namespace."""
    if reason := netns_module().unavailable_reason(probe=probe):
        return f"no network namespaces: {reason}"
    for tool in ("nsenter", "setpriv"):
        if shutil.which(tool) is None:
            return f"`{tool}` (util-linux) is missing"
    if _missing() and install:
        if why := _install():
            return f"{', '.join(_missing())} missing and {why}"
    if missing := _missing():
        return f"{', '.join(missing)} missing: install {' '.join(PACKAGES)} (scripts/install_system_deps.sh)"
    return None


RUNDIR_PREFIX = "mtslurm-"


def _make_rundir() -> Path:
    """A fresh /tmp/mtslurm-<pid>-<random> for the daemons' state, spool and munge socket. Short on
    purpose: slurmd puts a unix socket per step under SlurmdSpoolDir (``<node>_<job>.<step>``), and a
    socket path longer than 107 bytes makes every job launch fail (``launch_failed_requeued_held``), as a
    deep pytest tmp_path would. Directories left by a process that died first are removed here."""
    for old in Path("/tmp").glob(f"{RUNDIR_PREFIX}*-*"):
        pid = old.name[len(RUNDIR_PREFIX):].split("-")[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{RUNDIR_PREFIX}{os.getpid()}-", dir="/tmp"))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def _tail(path: Path, chars: int = 2000) -> str:
    with contextlib.suppress(OSError):
        return path.read_text(errors="replace")[-chars:]
    return "(no log)"


class SlurmCluster:
    """munged + slurmctld + `num_nodes` slurmd, each node a namespace of a NetnsCluster."""

    def __init__(self, workdir, num_nodes: int = 2, *, timeout: float = 30.0):
        self.workdir = Path(workdir).resolve()
        self.rundir: Path | None = None  # state, spool, munge: short paths (see _make_rundir)
        self.num_nodes, self.timeout = num_nodes, timeout
        self.netns = None
        self.nodes: list[str] = []
        self._procs: dict[str, subprocess.Popen] = {}
        self.up_seconds: float | None = None

    # ------------------------------------------------------------------ paths and environment
    @property
    def conf(self) -> Path:
        return self.workdir / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """This process's environment plus SLURM_CONF, for the client commands; no SLURM_* of a job."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        return {**env, "SLURM_CONF": str(self.conf)}

    def run(self, argv: list[str], *, timeout: float = 30, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
        """A Slurm client command (sinfo, sbatch, squeue, scancel...) against this cluster."""
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=timeout, check=check,
                              stdin=subprocess.DEVNULL, **kwargs)

    def node_of(self, name: str):
        """The netns host (ClusterHost) of the node `name`."""
        return self.netns.host(name)

    def sbatch(self, script: str, *args: str) -> str:
        """Submits `script` (its text) with `args`; returns the job id. The script file is kept in the work
        directory."""
        path = self.workdir / f"job-{secrets.token_hex(4)}.sh"
        path.write_text(script)
        return self.run(["sbatch", "--parsable", *args, str(path)]).stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as a dict (JobState, ExitCode, NodeList, Restarts...); {} once forgotten."""
        done = self.run(["scontrol", "show", "job", "-o", job_id], check=False)
        return dict(word.split("=", 1) for word in done.stdout.split() if "=" in word)

    def wait_job(self, job_id: str, timeout: float) -> dict[str, str]:
        """Waits until the job has ended (not PENDING/RUNNING/COMPLETING...); returns its `job` record."""
        deadline = time.monotonic() + timeout
        while True:
            record = self.job(job_id)
            if record.get("JobState") in ENDED:
                return record
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} did not end in {timeout} s: {record}")
            time.sleep(0.1)

    def steps(self, job_id: str) -> list[dict[str, str]]:
        """The job's running steps: [{"id": "7.2", "name": ..., "nodes": ...}] (squeue --steps)."""
        done = self.run(["squeue", "-h", "--steps", "-j", job_id, "-o", "%i|%j|%N"], check=False)
        return [dict(zip(("id", "name", "nodes"), line.split("|"))) for line in done.stdout.splitlines()
                if line.count("|") == 2]

    # ------------------------------------------------------------------ up
    def up(self) -> "SlurmCluster":
        t0 = time.monotonic()
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self.netns = netns_module().NetnsCluster(self.num_nodes, self.workdir / "netns", prefix="sl").up()
            self.nodes = [host.ip for host in self.netns.hosts]
            self.rundir = _make_rundir()
            for sub in ("state", "spool", "munge"):
                (self.rundir / sub).mkdir(mode=0o700)
            (self.workdir / "log").mkdir(mode=0o700, exist_ok=True)
            self._start_munged()
            self._write_conf()
            self._start("slurmctld", [DAEMONS["slurmctld"], "-D", "-c", "-i", "-f", str(self.conf)])
            for host in self.netns.hosts:
                (self.rundir / "spool" / host.ip).mkdir(mode=0o700)
                # nsenter enters only the network namespace: `ip netns exec` would also remount /sys,
                # hiding the cgroup mounts slurmd 22.05 insists on initialising.
                self._start(f"slurmd-{host.ip}", ["nsenter", f"--net=/run/netns/{host.namespace}",
                                                  DAEMONS["slurmd"], "-D", "-N", host.ip, "-f", str(self.conf)])
            self._wait_idle(t0 + self.timeout)
        except BaseException:
            with contextlib.suppress(Exception):
                self.down()
            raise
        self.up_seconds = time.monotonic() - t0
        return self

    def _start_munged(self) -> None:
        munge = self.rundir / "munge"
        key = munge / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o600)
        argv = [DAEMONS["munged"], "--foreground", "--force", f"--socket={munge / 'socket'}",
                f"--key-file={key}", f"--pid-file={munge / 'munged.pid'}", f"--log-file={munge / 'munged.log'}",
                f"--seed-file={munge / 'munged.seed'}", "--num-threads=4"]
        self._start("munged", argv)
        deadline = time.monotonic() + self.timeout
        while not (munge / "socket").exists():
            self._check_alive("munged", munge / "munged.log")
            if time.monotonic() > deadline:
                raise SlurmError(f"munged did not create its socket:\n{_tail(munge / 'munged.log')}")
            time.sleep(0.01)

    def _write_conf(self) -> None:
        d, logs = self.rundir, self.workdir / "log"
        ctl_port = _free_port()
        lines = [
            "ClusterName=minitrain",
            f"SlurmctldHost={socket.gethostname().split('.')[0]}({self.netns.driver_ip})",
            f"SlurmctldPort={ctl_port}",
            "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", "CredType=cred/munge",
            f"AuthInfo=socket={d / 'munge' / 'socket'},cred_expire={CRED_EXPIRE_S}",
            f"StateSaveLocation={d / 'state'}",
            f"SlurmdSpoolDir={d / 'spool'}/%n",
            f"SlurmctldPidFile={d / 'state' / 'slurmctld.pid'}",
            f"SlurmdPidFile={d / 'spool'}/slurmd-%n.pid",
            f"SlurmctldLogFile={logs / 'slurmctld.log'}",
            f"SlurmdLogFile={logs}/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/affinity",
            "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none", "MpiDefault=none", "LaunchType=launch/slurm",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
            # sched_interval: the main scheduler also runs every 2 s (default 60 s), so a requeued job
            # starts soon after its cred_expire hold ends, as on a busy cluster where events trigger it.
            "SchedulerType=sched/builtin", "SchedulerParameters=sched_interval=2", "ReturnToService=2",
            "JobRequeue=1",
            f"KillWait={KILL_WAIT_S}", "MinJobAge=30", "InactiveLimit=0", "Waittime=0",
            "SlurmctldTimeout=30", "SlurmdTimeout=30", "MessageTimeout=10",
            "MailProg=/bin/true", "PlugStackConfig=/dev/null",
        ]
        for host in self.netns.hosts:
            lines.append(f"NodeName={host.ip} NodeAddr={host.ip} NodeHostname={host.ip} "
                         f"Port={_free_port()} CPUs={CPUS_PER_NODE} State=UNKNOWN")
        lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")

    def _start(self, name: str, argv: list[str]) -> None:
        log = open(self.workdir / "log" / f"{name}.out", "ab")
        with log:
            self._procs[name] = subprocess.Popen([*_PDEATHSIG, *argv], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                                 env={**self.env}, start_new_session=True)

    def _check_alive(self, name: str, log: Path) -> None:
        proc = self._procs[name]
        if proc.poll() is not None:
            raise SlurmError(f"{name} exited with {proc.returncode}:\n{_tail(log)}\n"
                             f"{_tail(self.workdir / 'log' / f'{name}.out')}")

    def _wait_idle(self, deadline: float) -> None:
        """Until sinfo shows every node idle."""
        while True:
            self._check_alive("slurmctld", self.workdir / "log" / "slurmctld.log")
            for ip in self.nodes:
                self._check_alive(f"slurmd-{ip}", self.workdir / "log" / f"slurmd-{ip}.log")
            done = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False, timeout=10)
            states = dict(line.split() for line in done.stdout.splitlines() if len(line.split()) == 2)
            if done.returncode == 0 and all(states.get(ip) == "idle" for ip in self.nodes):
                return
            if time.monotonic() > deadline:
                raise SlurmError(f"nodes not idle in time: sinfo {done.stdout!r} {done.stderr!r}\n"
                                 f"{_tail(self.workdir / 'log' / 'slurmctld.log')}")
            time.sleep(0.1)

    # ------------------------------------------------------------------ down
    def down(self) -> None:
        """Stops everything and removes the work directory's contents; idempotent."""
        if self.netns is not None:  # the slurmd's and every job step live in the namespaces
            self.netns.down()
            self.netns = None
        for name, proc in list(self._procs.items()):
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
            self._procs.pop(name)
        shutil.rmtree(self.workdir, ignore_errors=True)
        if self.rundir is not None:
            shutil.rmtree(self.rundir, ignore_errors=True)
            self.rundir = None

    def __enter__(self) -> "SlurmCluster":
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["up"])
    parser.add_argument("--dir", required=True, help="the cluster's work directory (removed at the end)")
    parser.add_argument("--nodes", type=int, default=2)
    args = parser.parse_args(argv)
    if reason := unavailable_reason(install=True):
        print(f"error: {reason}", file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM unwinds like Ctrl-C: all torn down
    with SlurmCluster(args.dir, args.nodes) as slurm:
        print(f"nodes {' '.join(slurm.nodes)} up in {slurm.up_seconds:.2f} s; in another shell: "
              f"export SLURM_CONF={slurm.conf}; sinfo. Ctrl-C takes everything down.", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(main())
