"""The fake multi-host cluster (scripts/netns_cluster.py): real namespaces, real sshd, real ssh.

Each host must be reachable over ssh at its own IP (from the root namespace and from the other hosts),
run this machine's venv python, be cut off and restored on demand, and leave nothing behind: no
namespace, no interface, no sshd, no file. Skipped where clusters cannot be made (not root, no sshd).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time

import psutil
import pytest

import cluster as cluster_helpers

pytestmark = pytest.mark.cluster


def _running(pid) -> bool:
    if pid is None:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _assert_gone(c, hosts, workdir) -> None:
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    addrs = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
    for h in hosts:
        assert h.namespace not in namespaces
        assert h.veth_root not in links
        assert not _running(h.sshd_pid)
    assert c.id not in links and c.driver_ip + "/" not in addrs
    assert not workdir.exists()  # it made the directory, so it removes it
    assert not (cluster_helpers.module().REGISTRY_DIR / f"{c.id}.json").exists()


def test_each_host_has_its_own_ip_and_sshd(netns_cluster):
    c = netns_cluster
    assert [h.name for h in c.hosts] == ["h0", "h1"]
    assert len({h.ip for h in c.hosts} | {c.driver_ip}) == 3
    for h in c.hosts:
        assert _running(h.sshd_pid)
        out = c.ssh(h, "hostname -I; ip -o -4 addr show dev eth0; readlink /proc/self/ns/net", check=True).stdout
        assert out.split()[0] == h.ip  # the only non-loopback address in the namespace
        assert f"inet {h.ip}/24" in out
        ns_inode = os.stat(f"/run/netns/{h.namespace}").st_ino
        assert f"net:[{ns_inode}]" in out  # the shell really runs inside the host's namespace
    # strict host key checking: the pre-filled known_hosts entry is what makes this work
    assert "StrictHostKeyChecking=yes" in c.ssh_options()


def test_host_to_host_ssh(netns_cluster):
    c = netns_cluster
    h0, h1 = c.hosts
    out = c.ssh(h1, "echo $SSH_CONNECTION", from_host=h0, check=True).stdout.split()
    assert out[0] == h0.ip and out[2] == h1.ip  # from h0's address to h1's sshd
    direct = c.ssh(h0, "echo $SSH_CONNECTION", check=True).stdout.split()
    assert direct[0] == c.driver_ip  # the root namespace reaches hosts from the bridge address


def test_venv_python_runs_inside_a_host(netns_cluster):
    c = netns_cluster
    code = "import os, minitrain, torch; print(minitrain.__version__, os.readlink('/proc/self/ns/net'))"
    proc = c.ssh("h1", f"cd {shlex.quote(str(cluster_helpers.REPO_ROOT))} && "
                       f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}", timeout=60)
    assert proc.returncode == 0, proc.stderr
    import minitrain

    version, netns = proc.stdout.split()
    assert version == minitrain.__version__
    assert netns == f"net:[{os.stat(f'/run/netns/{c.host(1).namespace}').st_ino}]"


@pytest.mark.parametrize("netns_cluster", [3], indirect=True)
def test_cut_and_restore(netns_cluster):
    c = netns_cluster
    assert len(c.hosts) == 3
    c.cut("h1")
    t0 = time.monotonic()
    proc = c.ssh("h1", "true", connect_timeout=1, timeout=10)
    assert proc.returncode == 255 and time.monotonic() - t0 < 6, proc.stderr  # ConnectTimeout=1
    assert c.ssh("h0", "true").returncode == 0 and c.ssh("h2", "true").returncode == 0
    assert c.ssh("h2", "true", from_host="h1", connect_timeout=1, timeout=10).returncode == 255
    c.restore("h1")
    assert c.ssh("h1", "true").returncode == 0
    assert c.ssh("h2", "hostname -I", from_host="h1", check=True).stdout.split()[0] == c.hosts[2].ip


def test_kill_namespace_processes(netns_cluster):
    c = netns_cluster
    sleeper = c.popen_in("h0", ["sleep", "300"])
    remote = c.ssh("h0", "nohup setsid sleep 301 >/dev/null 2>&1 & echo $!", check=True).stdout.split()[0]
    killed = c.kill_namespace_processes("h0")
    assert sleeper.pid in killed and int(remote) in killed and c.hosts[0].sshd_pid not in killed
    assert sleeper.wait(5) == -9 and not _running(int(remote))
    assert c.ssh("h0", "true").returncode == 0  # the host's sshd was spared

    sshd = c.hosts[1].sshd_pid
    assert sshd in c.kill_namespace_processes("h1", keep_sshd=False)
    assert c.hosts[1].sshd_pid is None and not _running(sshd)
    c.restart_sshd("h1")
    assert c.ssh("h1", "true").returncode == 0


def test_down_removes_everything_and_two_clusters_coexist(tmp_path):
    mod = cluster_helpers.module()
    with cluster_helpers.netns_cluster(1, tmp_path / "a") as a, \
            cluster_helpers.netns_cluster(1, tmp_path / "b", prefix="mtb") as b:
        assert a.subnet != b.subnet and a.bridge != b.bridge and a.hosts[0].namespace != b.hosts[0].namespace
        assert a.ssh(0, "true").returncode == 0 and b.ssh(0, "true").returncode == 0
        stray = a.popen_in(0, ["sleep", "300"])  # any process in a namespace dies with the cluster
        hosts_a = [mod.ClusterHost(**vars(h)) for h in a.hosts]
    assert a.up_seconds < 10 and a.down_seconds < 10
    assert stray.wait(5) == -9
    _assert_gone(a, hosts_a, tmp_path / "a")
    a.down()  # idempotent


def test_failed_up_cleans_up(tmp_path, monkeypatch):
    mod = cluster_helpers.module()
    cluster_helpers.skip_unless_available()
    c = mod.NetnsCluster(2, tmp_path / "c", timeout=5)
    real_start = c._start_sshd
    started = []

    def start_then_fail(host):
        real_start(host)
        started.append(mod.ClusterHost(**vars(host)))
        if host.index == 1:
            raise RuntimeError("injected failure after the second sshd started")

    monkeypatch.setattr(c, "_start_sshd", start_then_fail)
    with pytest.raises(RuntimeError, match="injected"):
        c.up()
    assert len(started) == 2 and all(h.sshd_pid for h in started) and all(h.sshd_pid is None for h in c.hosts)
    _assert_gone(c, started, tmp_path / "c")


def test_cli_up_status_down(tmp_path):
    cluster_helpers.skip_unless_available()
    script = [sys.executable, str(cluster_helpers.REPO_ROOT / "scripts" / "netns_cluster.py")]
    workdir = tmp_path / "cli"
    up = subprocess.run([*script, "up", "--hosts", "2", "--dir", str(workdir)], capture_output=True, text=True,
                        timeout=60)
    try:
        assert up.returncode == 0, up.stderr
        ssh = subprocess.run(["ssh", "-F", str(workdir / "ssh_config"), "h1", "hostname -I"],
                             capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        status = subprocess.run([*script, "status", "--dir", str(workdir)], capture_output=True, text=True)
        assert status.returncode == 0, status.stdout + status.stderr
        hosts = json.loads(status.stdout)["hosts"]
        assert ssh.stdout.split() == [hosts[1]["ip"]]
    finally:
        down = subprocess.run([*script, "down", "--dir", str(workdir)], capture_output=True, text=True)
    assert down.returncode == 0, down.stderr
    assert not workdir.exists()
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(h["namespace"] in namespaces for h in hosts)
