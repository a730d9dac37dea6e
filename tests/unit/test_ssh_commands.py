"""minitrain.hosts.ssh without a process: the ssh command line, the remote agent command's words, and the
parallel pre-flight against fake `run`s (what each answer means, a timeout, a missing client). The same
code against a shell that runs the remote command as sshd does: tests/process/test_ssh.py."""

from __future__ import annotations

import inspect
import shlex
import subprocess
import threading
import time

import pytest

import minitrain
from minitrain.hosts.cluster import HostSpec, SSHOptions
from minitrain.hosts.ssh import PreflightError, preflight, remote_agent_command, ssh_argv
from ssh_support import GPU1, cluster_of, finished, preflight_answer


def _options(argv: list[str]) -> list[str]:
    """The values of every `-o` in argv, in order."""
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == "-o"]


def test_ssh_argv_defaults():
    argv = ssh_argv(GPU1, SSHOptions(), ["true"])
    assert argv[0] == "ssh"
    assert _options(argv) == ["BatchMode=yes", "StrictHostKeyChecking=yes", "ConnectTimeout=10",
                              "ServerAliveInterval=2", "ServerAliveCountMax=3"]
    assert argv[-4:] == ["-T", "gpu1", "--", "true"]
    assert "-p" not in argv and "-i" not in argv and "-l" not in argv
    assert not any(o.startswith("UserKnownHostsFile") for o in _options(argv))


def test_ssh_argv_accept_new_only_when_opted_in():
    assert "StrictHostKeyChecking=accept-new" in _options(
        ssh_argv(GPU1, SSHOptions(accept_new_host_keys=True), ["true"]))
    assert not any(o == "StrictHostKeyChecking=no" for o in _options(ssh_argv(GPU1, SSHOptions(), ["x"])))


def test_ssh_argv_every_option_in_order(tmp_path):
    key = tmp_path / "id_ed25519"
    key.write_text("k")
    known = tmp_path / "known_hosts"
    known.write_text("")
    options = SSHOptions(user="ubuntu", port=2222, identity_file=str(key), known_hosts_file=str(known),
                         extra_options=("ProxyJump=bastion", "Compression=yes"), connect_timeout_s=2.5)
    argv = ssh_argv(HostSpec("10.0.0.3"), options, ["true"])
    assert argv == ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", "-o", "ConnectTimeout=3",
                    "-o", "ServerAliveInterval=2", "-o", "ServerAliveCountMax=3",
                    "-p", "2222", "-i", str(key), "-l", "ubuntu", "-o", f"UserKnownHostsFile={known}",
                    "-o", "ProxyJump=bastion", "-o", "Compression=yes", "-T", "10.0.0.3", "--", "true"]


def test_ssh_argv_ipv6_host_is_bare():
    assert ssh_argv(HostSpec("fe80::1"), SSHOptions(), ["true"])[-3] == "fe80::1"


def test_ssh_argv_takes_a_ready_shell_line_verbatim():
    assert ssh_argv(GPU1, SSHOptions(), "cd /x && exec true")[-1] == "cd /x && exec true"


def test_no_api_takes_a_secret(monkeypatch):
    """The token cannot reach argv: no builder has a parameter for it, and none reads the environment."""
    for function in (ssh_argv, remote_agent_command, preflight):
        for name in inspect.signature(function).parameters:
            assert not any(word in name.lower() for word in ("token", "secret", "password", "key")), name
    token = "f" * 64
    monkeypatch.setenv("MINITRAIN_TOKEN", token)
    line = remote_agent_command("/py", "10.0.0.1:5000", "gpu1", "run1", "/work", ("/work",))
    argv = ssh_argv(GPU1, SSHOptions(), line)
    assert not any(token in arg for arg in argv)


def test_remote_agent_command_words():
    line = remote_agent_command("/opt/my env/bin/python", "10.0.0.1:5000", "gpu 1", "run'1",
                                "/nfs/my project", ("/nfs/my project", "/nfs/lib"))
    assert shlex.split(line) == ["cd", "/nfs/my project", "&&", "exec", "env", "PYTHONUNBUFFERED=1",
                                 "PYTHONPATH=/nfs/my project:/nfs/lib", "/opt/my env/bin/python", "-m",
                                 "minitrain.agent", "--coordinator", "10.0.0.1:5000", "--node-id", "gpu 1",
                                 "--run-id", "run'1"]
    assert "PYTHONPATH" not in remote_agent_command("/py", "a:1", "n", "r", "/w")


@pytest.mark.parametrize(("result", "reason"), [
    (finished([], 127, stderr="env: '/x/bin/python': No such file or directory"),
     "python /x/bin/python not found"),
    (finished([], 126, stderr="env: '/x/bin/python': Permission denied"),
     "python /x/bin/python cannot be run: env: '/x/bin/python': Permission denied"),
    (finished([], 2, stderr="sh: 1: cd: can't cd to /nfs/w"),
     "the check failed in /nfs/w with python /x/bin/python: sh: 1: cd: can't cd to /nfs/w (exit 2)"),
    (finished([], 0, stdout=preflight_answer(minitrain_error="ModuleNotFoundError: No module named 'minitrain'")),
     "python /x/bin/python cannot import minitrain: ModuleNotFoundError"),
    (finished([], 0, stdout="no marker here\n"), "the check failed"),
    (finished([], 255, stderr="Host key verification failed.\n"),
     "ssh failed: Host key verification failed. (exit 255); the host's key is not in known_hosts"),
    (finished([], 255, stderr="u@gpu1: Permission denied (publickey).\n"),
     "ssh failed: u@gpu1: Permission denied (publickey). (exit 255); no key was accepted"),
])
def test_preflight_reasons(result, reason):
    cluster = cluster_of("gpu1", python="/x/bin/python", workdir="/nfs/w")
    with pytest.raises(PreflightError) as info:
        preflight(cluster, expected_version=minitrain.__version__, run=lambda argv, **kw: result)
    assert f"gpu1: {reason}" in str(info.value)


def test_preflight_timeouts_and_missing_ssh():
    def timing_out(argv, **kwargs):
        raise subprocess.TimeoutExpired(argv, kwargs["timeout"])

    with pytest.raises(PreflightError, match="gpu1: ssh did not answer within 3 s"):
        preflight(cluster_of("gpu1"), expected_version="0.1.0", timeout_s=3, run=timing_out)

    def no_ssh(argv, **kwargs):
        raise FileNotFoundError(2, "No such file or directory", "ssh")

    with pytest.raises(PreflightError, match="gpu1: the ssh client is not installed"):
        preflight(cluster_of("gpu1"), expected_version="0.1.0", run=no_ssh)


def test_preflight_checks_hosts_in_parallel():
    """Each fake ssh blocks until all 3 are in flight: a serial pre-flight would hit the deadline."""
    in_flight = threading.Barrier(3, timeout=10)
    peak, lock, current = [0], threading.Lock(), [0]

    def blocking_run(argv, **kwargs):
        with lock:
            current[0] += 1
            peak[0] = max(peak[0], current[0])
        try:
            in_flight.wait()
        except threading.BrokenBarrierError:
            return finished(argv, 255, stderr="fake: the other checks never started (serial pre-flight?)")
        finally:
            with lock:
                current[0] -= 1
        return finished(argv, stdout=preflight_answer(minitrain="0.1.0"))

    started = time.monotonic()
    preflight(cluster_of("gpu1", "gpu2", "gpu3"), expected_version="0.1.0", run=blocking_run)
    assert peak[0] == 3 and time.monotonic() - started < 10


def test_preflight_error_pickles():
    import pickle

    error = PreflightError("pre-flight failed", {"gpu2": ["ssh failed"]})
    copy = pickle.loads(pickle.dumps(error))
    assert str(copy) == "pre-flight failed" and copy.failures == {"gpu2": ["ssh failed"]}
