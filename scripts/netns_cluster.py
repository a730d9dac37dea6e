#!/usr/bin/env python3
"""A fake multi-host cluster on one machine: N "hosts", each a network namespace with its own IP and
its own sshd, on a Linux bridge in the root namespace. For tests and CI; needs root and openssh-server.

    with NetnsCluster(2, tmp_path / "cluster") as cluster:      # up() on enter, down() on exit
        cluster.hosts[0].ip                                      # "10.a.b.10"; cluster.driver_ip is .1
        cluster.ssh("h1", "hostname -I")                         # CompletedProcess
        cluster.cut("h1"); cluster.restore("h1")                 # root-side veth down / up

    python scripts/netns_cluster.py up --hosts 3 --dir DIR      # stays up; `ssh -F DIR/ssh_config h0`
    python scripts/netns_cluster.py status --dir DIR
    python scripts/netns_cluster.py down --dir DIR

Layout: bridge `<id>br` with `10.a.b.1/24` (the driver's address), and per host `i` a namespace
`<id>-h<i>` whose `eth0` (`10.a.b.(10+i)`) is the peer of `<id>r<i>` on the bridge. `<id>` is the
prefix plus 6 random hex digits and the /24 is random and checked against the host's addresses and
routes under a lock, so clusters in parallel pytest-xdist workers coexist. Processes in a namespace share
the filesystem and pid space with the host, so this machine's venv works inside the "hosts" as is.

Every name is written to `<workdir>/cluster.json` and `/run/minitrain-netns/<id>.json` before it is
created, so `down()` (idempotent) also cleans up after a half-finished `up()`, `down --dir` works
from another process, and `up()` sweeps clusters whose owning process died without cleaning up.
Caveat: hosts with br_netfilter loaded and an iptables FORWARD policy of DROP (Docker) drop h0 -> h1
traffic; driver <-> host traffic is unaffected.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import fcntl
import ipaddress
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

SSHD = "/usr/sbin/sshd"
REGISTRY_DIR = Path("/run/minitrain-netns")
STATE_FILE = "cluster.json"
SSH_PORT = 22
MAX_HOSTS = 240  # IPs .10 .. .249
_LIVE: set = set()  # clusters this process owns, torn down at exit if the code forgot


class ClusterError(RuntimeError):
    """A cluster could not be brought up or torn down; the message says which step and why."""


@dataclass
class ClusterHost:
    """One fake host: `ip` is where its sshd listens (port `ssh_port`); `veth_root` is the root-side
    interface, so `ip link set <veth_root> down` cuts the host off; `sshd_pid` is None when not running."""
    name: str
    namespace: str
    ip: str
    ssh_port: int
    veth_root: str
    sshd_pid: int | None = None
    index: int = 0


def _run(argv: list[str], check: bool = True, timeout: float = 15.0) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        raise ClusterError(f"{shlex.join(argv)} failed (exit {proc.returncode}): {proc.stderr.strip()}")
    return proc


def nameservers() -> list:
    """The non-loopback nameserver addresses of /etc/resolv.conf."""
    import ipaddress

    found = []
    try:
        with open("/etc/resolv.conf") as handle:
            for words in (line.split() for line in handle):
                if len(words) >= 2 and words[0] == "nameserver":
                    try:
                        address = ipaddress.ip_address(words[1].split("%")[0])
                    except ValueError:
                        continue
                    if not address.is_loopback:
                        found.append(address)
    except OSError:
        pass
    return found


def unavailable_reason(probe: bool = True) -> str | None:
    """Why a cluster cannot be made here (None when it can). `probe` really creates a namespace."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "`ip` (iproute2) is not installed"
    if not os.access(SSHD, os.X_OK):
        return f"{SSHD} is missing: install openssh-server; CI's .ci/run does (scripts/install_system_deps.sh)"
    for tool in ("ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"`{tool}` is missing: install openssh-client"
    if probe:
        name = f"mtprobe{secrets.token_hex(3)}"
        made = _run(["ip", "netns", "add", name], check=False)
        _run(["ip", "netns", "del", name], check=False)
        if made.returncode != 0:
            return f"`ip netns add` does not work here: {made.stderr.strip()}"
    return None


def _netns_pids(namespace: str) -> list[int]:
    out = _run(["ip", "netns", "pids", namespace], check=False).stdout
    return [int(p) for p in out.split()]


def _start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _owner_alive(owner: dict | None) -> bool:
    return owner is None or _start_time(owner["pid"]) == owner["start"]


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


@contextlib.contextmanager
def _registry_lock():
    REGISTRY_DIR.mkdir(parents=True, exist_ok=True)
    with open(REGISTRY_DIR / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _used_networks() -> list:
    nets = []
    for line in _run(["ip", "-o", "-4", "addr"]).stdout.splitlines():
        if m := re.search(r"\binet (\S+)", line):
            nets.append(ipaddress.ip_interface(m.group(1)).network)
    for line in _run(["ip", "-4", "route", "show", "table", "all"]).stdout.splitlines():
        word = line.split()[0] if line.split() else ""
        if word[:1].isdigit():
            with contextlib.suppress(ValueError):
                nets.append(ipaddress.ip_network(word, strict=False))
    return nets


def _kill_pids(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _kill_namespace(namespace: str, keep: set[int], timeout: float) -> list[int]:
    """SIGKILL every process in `namespace` but `keep`, until none is left; returns the pids killed."""
    killed: list[int] = []
    deadline = time.monotonic() + timeout
    while pids := [p for p in _netns_pids(namespace) if p not in keep]:
        if time.monotonic() > deadline:
            raise ClusterError(f"processes {pids} in namespace {namespace} survived SIGKILL for {timeout}s")
        _kill_pids(pids)
        killed += [p for p in pids if p not in killed]
        time.sleep(0.01)
    return killed


def _teardown(state: dict, procs: dict, timeout: float = 5.0) -> list[str]:
    """Removes everything `state` names; missing things are fine. Returns what could not be removed."""
    problems = []
    existing = set(_run(["ip", "netns", "list"], check=False).stdout.split())
    for ns in state["namespaces"]:
        if ns in existing:
            try:
                _kill_namespace(ns, set(), timeout)
            except ClusterError as e:
                problems.append(str(e))
    for host in state["hosts"]:  # an sshd whose namespace is already gone (cmdline names our config)
        pid = host.get("sshd_pid")
        with contextlib.suppress(OSError):
            if pid and host["sshd_config"].encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGKILL)
    for proc in procs.values():
        with contextlib.suppress(subprocess.TimeoutExpired, OSError):
            proc.kill()
            proc.wait(timeout)
    for link in [*state["links"][1:], *state["links"][:1]]:  # veths first, then the bridge
        _run(["ip", "link", "del", link], check=False)
    for ns in state["namespaces"]:
        _run(["ip", "netns", "del", ns], check=False)
    left_ns = set(state["namespaces"]) & set(_run(["ip", "netns", "list"], check=False).stdout.split())
    left_links = [lk for lk in state["links"] if _run(["ip", "link", "show", lk], check=False).returncode == 0]
    if left_ns or left_links:
        problems.append(f"still present: namespaces {sorted(left_ns)}, links {left_links}")
    for f in state["files"]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f)
    for d in state.get("host_tmp", {}).values():  # only what the cluster made
        shutil.rmtree(d, ignore_errors=True)
    if state.get("created_dir"):
        with contextlib.suppress(OSError):
            os.rmdir(state["workdir"])
    if not problems:  # otherwise the registry entry stays, for sweep_stale() once the owner is gone
        with contextlib.suppress(FileNotFoundError):
            os.unlink(REGISTRY_DIR / f"{state['id']}.json")
    return problems


def sweep_stale() -> list[str]:
    """Tears down clusters whose owning process is gone (killed before its atexit ran); returns their ids.
    Clusters started by the CLI have no owner and stay until `down`."""
    swept = []
    for entry in REGISTRY_DIR.glob("*.json") if REGISTRY_DIR.is_dir() else []:
        try:
            state = json.loads(entry.read_text())
        except (OSError, ValueError):
            continue
        if _owner_alive(state.get("owner")):
            continue
        claimed = entry.with_name(f"{entry.name}.sweep{os.getpid()}")
        try:
            os.rename(entry, claimed)  # exactly one sweeper wins
        except FileNotFoundError:
            continue
        _teardown(state, {})
        claimed.unlink(missing_ok=True)
        swept.append(state["id"])
    return swept


class NetnsCluster:
    """`num_hosts` fake hosts (`h0`, `h1`, ...) with sshd, files in `workdir`. Use as a context manager
    or call `up()` / `down()`. `detach=True` (the CLI) leaves the cluster up when this process exits;
    otherwise an atexit hook tears down what the code forgot to."""

    def __init__(self, num_hosts: int, workdir, prefix: str | None = None, *, timeout: float = 20.0,
                 detach: bool = False):
        if not 1 <= num_hosts <= MAX_HOSTS:
            raise ValueError(f"num_hosts must be 1..{MAX_HOSTS}, got {num_hosts}")
        prefix = "mt" if prefix is None else prefix
        if not re.fullmatch(r"[a-z][a-z0-9]{0,3}", prefix):
            raise ValueError(f"prefix must be 1-4 lowercase letters/digits starting with a letter: {prefix!r}")
        self.num_hosts, self.prefix, self.timeout, self.detach = num_hosts, prefix, timeout, detach
        self.workdir = Path(workdir).resolve()
        self.hosts: list[ClusterHost] = []
        self.id = self.bridge = self.subnet = self.driver_ip = None
        self.up_seconds = self.down_seconds = None
        self._state: dict | None = None
        self._procs: dict[str, subprocess.Popen] = {}
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ files and state
    def _path(self, name: str) -> str:
        path = str(self.workdir / name)
        if path not in self._state["files"]:
            self._state["files"].append(path)
        return path

    def _save(self) -> None:
        self._state["hosts"] = [{**asdict(h), "sshd_config": self._path(f"sshd-{h.index}.conf")}
                                for h in self.hosts]
        _write_json(Path(self._path(STATE_FILE)), self._state)
        _write_json(REGISTRY_DIR / f"{self.id}.json", self._state)

    def _keygen(self, path: str, comment: str) -> str:
        """Makes an ed25519 key pair at `path` (an earlier one is replaced); returns "type base64" of it."""
        for p in (path, path + ".pub"):
            Path(self._path(os.path.basename(p))).unlink(missing_ok=True)
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", path])
        return " ".join(Path(path + ".pub").read_text().split()[:2])

    # ------------------------------------------------------------------ up
    def up(self) -> "NetnsCluster":
        """Creates the network, keys and sshds; returns once `ssh root@<ip> true` works on every host.
        On any failure everything made so far is removed and the error re-raised."""
        with self._lock:
            if self._state is not None:
                return self
            if reason := unavailable_reason(probe=False):
                raise ClusterError(reason)
            sweep_stale()
            t0 = time.monotonic()
            if not self.detach:
                _LIVE.add(self)
            try:
                self._make_network()
                self._make_keys()
                for host in self.hosts:
                    self._start_sshd(host)
                self._wait_ready(t0 + self.timeout)
            except BaseException:
                with contextlib.suppress(Exception):
                    self.down()
                raise
            self.up_seconds = time.monotonic() - t0
            return self

    def _make_network(self) -> None:
        existing_state = self.workdir / STATE_FILE
        if existing_state.exists():
            raise ClusterError(f"{self.workdir} already holds a cluster ({existing_state}); run down first")
        created_dir = not self.workdir.exists()
        self.workdir.mkdir(parents=True, exist_ok=True)
        with _registry_lock():
            self._pick_names()
            self._state = {"version": 1, "id": self.id, "subnet": str(self.subnet), "bridge": self.bridge,
                           "workdir": str(self.workdir), "created_dir": created_dir, "files": [],
                           "links": [self.bridge], "namespaces": [], "hosts": [],
                           "owner": None if self.detach else {"pid": os.getpid(), "start": _start_time(os.getpid())}}
            self._save()
            _run(["ip", "link", "add", "name", self.bridge, "type", "bridge"])
            _run(["ip", "addr", "add", f"{self.driver_ip}/24", "dev", self.bridge])  # claims the subnet
        _run(["ip", "link", "set", self.bridge, "up"])
        for host in self.hosts:
            self._state["namespaces"].append(host.namespace)
            self._state["links"].append(host.veth_root)
            self._save()
            self._make_host_network(host)

    def _pick_names(self) -> None:
        used = _used_networks()
        links = _run(["ip", "-o", "link"]).stdout
        namespaces = _run(["ip", "netns", "list"]).stdout
        for _ in range(100):
            cid = f"{self.prefix}{secrets.token_hex(3)}"
            net = ipaddress.ip_network(f"10.{secrets.randbelow(254) + 1}.{secrets.randbelow(256)}.0/24")
            if cid in links or cid in namespaces or any(net.overlaps(u) for u in used):
                continue
            self.id, self.bridge, self.subnet = cid, f"{cid}br", net
            self.driver_ip = str(net.network_address + 1)
            self.hosts = [ClusterHost(f"h{i}", f"{cid}-h{i}", str(net.network_address + 10 + i), SSH_PORT,
                                      f"{cid}r{i}", None, i) for i in range(self.num_hosts)]
            return
        raise ClusterError("no free 10.x.y.0/24 subnet and unique name found in 100 tries")

    def _make_host_network(self, host: ClusterHost) -> None:
        ns, peer = host.namespace, f"{self.id}n{host.index}"
        _run(["ip", "netns", "add", ns])
        _run(["ip", "link", "add", host.veth_root, "type", "veth", "peer", "name", peer])
        _run(["ip", "link", "set", peer, "netns", ns])
        _run(["ip", "link", "set", host.veth_root, "master", self.bridge, "up"])
        _run(["ip", "-n", ns, "link", "set", peer, "name", "eth0"])
        _run(["ip", "-n", ns, "addr", "add", f"{host.ip}/24", "dev", "eth0"])
        _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
        _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        _run(["ip", "-n", ns, "route", "add", "default", "via", self.driver_ip])
        # The machine's nameserver is not reachable from the fake hosts: a query would be dropped at the
        # bridge and every lookup (torch's c10d resolves each client address) would stall for 10 s.
        # An unreachable route makes lookups fail at once, as on a host whose resolver answers.
        for address in nameservers():
            _run(["ip", "-n", ns, f"-{address.version}", "route", "replace", "unreachable",
                  f"{address}/{address.max_prefixlen}"])

    def _make_keys(self) -> None:
        key = self._path("id_ed25519")
        client_pub = self._keygen(key, f"minitrain-netns-{self.id}")
        Path(self._path("authorized_keys")).write_text(client_pub + "\n")
        known = []
        for host in self.hosts:
            known.append(f"{host.ip} {self._keygen(self._path(f'hostkey-{host.index}'), host.name)}\n")
        Path(self._path("known_hosts")).write_text("".join(known))
        opts = "".join(f"    {o.split('=', 1)[0]} {o.split('=', 1)[1]}\n" for o in self.ssh_options()[5::2])
        Path(self._path("ssh_config")).write_text("".join(
            f"Host {h.name}\n    HostName {h.ip}\n    User root\n    IdentityFile {key}\n{opts}"
            for h in self.hosts))
        for f in (key, self._path("authorized_keys")):
            os.chmod(f, 0o600)
        self._save()

    def _sshd_config(self, host: ClusterHost, penalties: bool) -> str:
        q = lambda p: f'"{p}"'  # noqa: E731 - sshd_config quoting for paths
        lines = [f"ListenAddress {host.ip}", f"Port {host.ssh_port}",
                 f"HostKey {q(self._path(f'hostkey-{host.index}'))}",
                 f"PidFile {q(self._path(f'sshd-{host.index}.pid'))}",
                 f"AuthorizedKeysFile {q(self._path('authorized_keys'))}",
                 "PermitRootLogin prohibit-password", "PubkeyAuthentication yes", "PasswordAuthentication no",
                 "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no", "UseDNS no",
                 "PrintMotd no", "PrintLastLog no", "X11Forwarding no", "MaxStartups 200", "MaxSessions 200",
                 "Subsystem sftp internal-sftp",  # no AcceptEnv: the client's environment stays out
                 # The hosts share this machine's filesystem: each gets a resource ledger of its own, as a
                 # separate machine has (minitrain.hosts.ledger), so a run's claims on h0 are not h1's, and
                 # a temp directory of its own, removed with the cluster: what an agent killed there leaves
                 # in it (its relay directory, its memory tier) would otherwise outlive the cluster in /tmp
                 # or /dev/shm.
                 f"SetEnv MINITRAIN_LEDGER_DIR={self.ledger_dir(host)} TMPDIR={self.tmp_dir(host)} "
                 f"MINITRAIN_MEMORY_TIER_DIR={self.tmp_dir(host)}"]
        if penalties:  # OpenSSH >= 9.8 would block a source after repeated probes/cut connections
            lines.append("PerSourcePenalties no")
        return "".join(line + "\n" for line in lines)

    def tmp_dir(self, host) -> str:
        """The temp directory of `host` (its sessions get it as TMPDIR): made once, in this process's temp
        directory (kept short: it holds the agents' Unix sockets), and removed at teardown."""
        index = self.host(host).index
        made = self._state.setdefault("host_tmp", {})
        if str(index) not in made:
            made[str(index)] = tempfile.mkdtemp(prefix=f"netns-h{index}-")
            self._save()
        return made[str(index)]

    def ledger_dir(self, host) -> str:
        """The resource ledger directory of `host` (its sessions get it as MINITRAIN_LEDGER_DIR)."""
        return str(self.workdir / f"ledger-h{self.host(host).index}")  # under workdir: goes with it

    def _start_sshd(self, host: ClusterHost) -> None:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation directory
        cfg = self._path(f"sshd-{host.index}.conf")
        Path(cfg).write_text(self._sshd_config(host, penalties=True))
        if _run([SSHD, "-t", "-f", cfg], check=False).returncode != 0:
            Path(cfg).write_text(self._sshd_config(host, penalties=False))
            _run([SSHD, "-t", "-f", cfg])
        with open(self._path(f"sshd-{host.index}.log"), "ab") as log:
            proc = subprocess.Popen(["ip", "netns", "exec", host.namespace, SSHD, "-D", "-e", "-f", cfg],
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        self._procs[host.name] = proc
        host.sshd_pid = proc.pid  # `ip netns exec` execs sshd in place
        self._save()

    def _wait_ready(self, deadline: float) -> None:
        for host in self.hosts:
            self._wait_sshd(host, deadline)
        pending = list(self.hosts)
        while pending:
            runs = [(h, subprocess.Popen(self.ssh_argv(h, "true"), stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
                    for h in pending]  # all hosts at once
            try:
                errors = [p.communicate(timeout=max(1.0, deadline - time.monotonic()))[1] for _, p in runs]
            finally:
                for _, p in runs:
                    p.kill()
                    p.wait()
            failed = [(h, err) for (h, p), err in zip(runs, errors) if p.returncode != 0]
            pending = [h for h, _ in failed]
            if pending and time.monotonic() > deadline:
                raise ClusterError(f"`ssh root@{failed[0][0].ip} true` failed: {failed[0][1].strip()}")
            if pending:
                time.sleep(0.1)

    def _wait_sshd(self, host: ClusterHost, deadline: float) -> None:
        """Returns once sshd at host.ip:22 answers with its banner; raises if it died or the deadline passed."""
        while True:
            proc = self._procs.get(host.name)
            if proc is not None and proc.poll() is not None:
                log = Path(self._path(f"sshd-{host.index}.log")).read_text(errors="replace")[-2000:]
                raise ClusterError(f"sshd of {host.name} exited with {proc.returncode}:\n{log}")
            with contextlib.suppress(OSError):
                with socket.create_connection((host.ip, host.ssh_port), timeout=0.5) as s:
                    s.settimeout(1.0)
                    if s.recv(4).startswith(b"SSH-"):
                        return
            if time.monotonic() > deadline:
                raise ClusterError(f"sshd of {host.name} did not answer on {host.ip}:{host.ssh_port} in time")
            time.sleep(0.02)

    # ------------------------------------------------------------------ down
    def down(self) -> None:
        """Kills every process in the namespaces, deletes namespaces, veths, bridge and the files made.
        Idempotent; raises ClusterError (after doing all it can) if something could not be removed."""
        with self._lock:
            _LIVE.discard(self)
            if self._state is None:
                return
            t0 = time.monotonic()
            problems = _teardown(self._state, self._procs)
            self._state, self._procs = None, {}
            for host in self.hosts:
                host.sshd_pid = None
            self.down_seconds = time.monotonic() - t0
        if problems:
            raise ClusterError("; ".join(problems))

    def __enter__(self) -> "NetnsCluster":
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    @classmethod
    def load(cls, workdir) -> "NetnsCluster":
        """The cluster described by `<workdir>/cluster.json` (or the registry), e.g. one the CLI started."""
        workdir = Path(workdir).resolve()
        path = workdir / STATE_FILE
        entries = [path] + (sorted(REGISTRY_DIR.glob("*.json")) if REGISTRY_DIR.is_dir() else [])
        for entry in entries:
            with contextlib.suppress(OSError, ValueError):
                state = json.loads(entry.read_text())
                if state["workdir"] == str(workdir):
                    break
        else:
            raise ClusterError(f"no cluster state for {workdir}")
        self = cls(len(state["hosts"]), workdir, prefix=None, detach=state["owner"] is None)
        self.id, self.bridge = state["id"], state["bridge"]
        self.subnet = ipaddress.ip_network(state["subnet"])
        self.driver_ip = str(self.subnet.network_address + 1)
        self.hosts = [ClusterHost(**{k: v for k, v in h.items() if k != "sshd_config"}) for h in state["hosts"]]
        self._state = state
        return self

    # ------------------------------------------------------------------ using the hosts
    def host(self, host) -> ClusterHost:
        """A ClusterHost from itself, its name ("h1") or its index."""
        if isinstance(host, ClusterHost):
            return host
        if isinstance(host, int):
            return self.hosts[host]
        for h in self.hosts:
            if host in (h.name, h.ip, h.namespace):
                return h
        raise KeyError(f"no host {host!r} in cluster {self.id}")

    def ssh_options(self, connect_timeout: float = 5) -> list[str]:
        """Options for `ssh` that use the throwaway key and the pre-filled known_hosts, strictly."""
        return ["-F", "/dev/null", "-i", str(self.workdir / "id_ed25519"),
                "-o", f"UserKnownHostsFile={self.workdir / 'known_hosts'}", "-o", "GlobalKnownHostsFile=/dev/null",
                "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
                "-o", f"ConnectTimeout={int(connect_timeout)}", "-o", "LogLevel=ERROR"]

    def ssh_argv(self, host, command=None, *, from_host=None, connect_timeout: float = 5) -> list[str]:
        """argv of `ssh root@<ip> command` (a string, or a list that is shell-quoted), run from the root
        namespace or, with `from_host`, from inside that host's namespace."""
        h = self.host(host)
        prefix = ["ip", "netns", "exec", self.host(from_host).namespace] if from_host is not None else []
        if isinstance(command, (list, tuple)):
            command = shlex.join(command)
        return [*prefix, "ssh", *self.ssh_options(connect_timeout), "-p", str(h.ssh_port), f"root@{h.ip}",
                *([command] if command is not None else [])]

    def ssh(self, host, command, *, from_host=None, connect_timeout: float = 5, timeout: float = 30,
            check: bool = False, input: str | None = None) -> subprocess.CompletedProcess:
        """Runs `command` on `host` over ssh; text output captured. stdin is `input` or empty."""
        argv = self.ssh_argv(host, command, from_host=from_host, connect_timeout=connect_timeout)
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=check, input=input,
                              stdin=subprocess.DEVNULL if input is None else None)

    def run_in(self, host, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        """subprocess.run(argv) inside the host's namespace, without ssh (kwargs go to subprocess.run)."""
        return subprocess.run(["ip", "netns", "exec", self.host(host).namespace, *argv], **kwargs)

    def popen_in(self, host, argv: list[str], **kwargs) -> subprocess.Popen:
        """subprocess.Popen(argv) inside the host's namespace, without ssh; down() kills it if still running."""
        return subprocess.Popen(["ip", "netns", "exec", self.host(host).namespace, *argv], **kwargs)

    def cut(self, host) -> None:
        """Cuts the host off the network (its root-side veth goes down); its processes keep running."""
        _run(["ip", "link", "set", self.host(host).veth_root, "down"])

    def restore(self, host, wait: bool = True) -> None:
        """Undoes cut(); with `wait`, returns once the host's sshd answers again."""
        h = self.host(host)
        _run(["ip", "link", "set", h.veth_root, "up"])
        if wait and h.sshd_pid is not None:
            self._wait_sshd(h, time.monotonic() + self.timeout)

    def kill_namespace_processes(self, host, *, keep_sshd: bool = True, timeout: float = 5.0) -> list[int]:
        """SIGKILLs every process in the host's namespace (a crashed node), sparing the listening sshd
        unless `keep_sshd=False`; returns the pids killed once they are gone."""
        h = self.host(host)
        keep = {h.sshd_pid} if keep_sshd and h.sshd_pid else set()
        killed = _kill_namespace(h.namespace, keep, timeout)
        if h.sshd_pid in killed:
            with contextlib.suppress(Exception):
                self._procs.pop(h.name).wait(timeout)
            h.sshd_pid = None
            self._save()
        return killed

    def restart_sshd(self, host) -> None:
        """Starts the host's sshd again (after kill_namespace_processes(keep_sshd=False)) and waits for it."""
        h = self.host(host)
        if h.sshd_pid is None:
            self._start_sshd(h)
            self._wait_sshd(h, time.monotonic() + self.timeout)

    def status(self) -> dict:
        """Per host: namespace present, link up, sshd alive, sshd answering."""
        namespaces = set(_run(["ip", "netns", "list"], check=False).stdout.split())
        hosts = []
        for h in self.hosts:
            link = _run(["ip", "-o", "link", "show", h.veth_root], check=False).stdout
            answering = False
            with contextlib.suppress(OSError):
                with socket.create_connection((h.ip, h.ssh_port), timeout=1.0) as s:
                    s.settimeout(1.0)
                    answering = s.recv(4).startswith(b"SSH-")
            hosts.append({**asdict(h), "namespace_present": h.namespace in namespaces,
                          "link_up": ",UP" in link or "<UP" in link, "sshd_answering": answering})
        return {"id": self.id, "bridge": self.bridge, "subnet": str(self.subnet), "driver_ip": self.driver_ip,
                "workdir": str(self.workdir), "ssh_options": self.ssh_options(), "hosts": hosts}


@atexit.register
def _down_forgotten() -> None:
    for cluster in list(_LIVE):
        with contextlib.suppress(Exception):
            cluster.down()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="bring a cluster up and leave it running")
    up.add_argument("--hosts", type=int, default=2)
    up.add_argument("--prefix", default=None)
    for p in (up, sub.add_parser("down", help="tear a cluster down"), sub.add_parser("status")):
        p.add_argument("--dir", required=True, help="the cluster's work directory")
    sub.add_parser("sweep", help="tear down clusters whose owning process died")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "up":
            cluster = NetnsCluster(args.hosts, args.dir, args.prefix, detach=True).up()
            for h in cluster.hosts:
                print(f"{h.name} {h.ip} ns={h.namespace} veth={h.veth_root} sshd_pid={h.sshd_pid}")
            print(f"driver {cluster.driver_ip} bridge={cluster.bridge}; up in {cluster.up_seconds:.2f}s; "
                  f"try: ssh -F {cluster.workdir / 'ssh_config'} h0 hostname -I")
        elif args.cmd == "down":
            cluster = NetnsCluster.load(args.dir)
            cluster.down()
            print(f"cluster {cluster.id} down in {cluster.down_seconds:.2f}s")
        elif args.cmd == "status":
            status = NetnsCluster.load(args.dir).status()
            print(json.dumps(status, indent=1))
            return 0 if all(h["sshd_answering"] for h in status["hosts"]) else 1
        else:
            print("swept:", " ".join(sweep_stale()) or "nothing")
    except ClusterError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
