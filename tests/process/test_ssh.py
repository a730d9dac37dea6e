"""minitrain.hosts.ssh: the ssh command line (pure), the remote agent command's quoting, and the parallel
pre-flight with fake `run`s. No real ssh: a "remote" host is simulated by running the remote command
string with `sh -c`, which is what sshd does with it."""

from __future__ import annotations

import inspect
import json
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import minitrain
from minitrain.hosts import ssh
from minitrain.hosts.cluster import ClusterConfig, HostSpec, SSHOptions
from minitrain.errors import LaunchError
from minitrain.hosts.ssh import PreflightError, preflight, remote_agent_command, ssh_argv

ROOT = Path(__file__).resolve().parents[2]
GPU1 = HostSpec("gpu1", 8)


def _options(argv: list[str]) -> list[str]:
    """The values of every `-o` in argv, in order."""
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == "-o"]


# ---------------------------------------------------------------------------------- ssh_argv


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


def test_ssh_argv_quotes_the_remote_command_as_one_string():
    words = ["python", "-c", "print('it''s \"quoted\"'); import sys", "a b", "$HOME", "x;rm -rf /", ""]
    argv = ssh_argv(GPU1, SSHOptions(), words)
    assert argv[-2] == "--" and isinstance(argv[-1], str)
    assert shlex.split(argv[-1]) == words
    # what sshd does with it: the remote shell runs the string
    echoed = subprocess.run(["sh", "-c", ssh_argv(GPU1, SSHOptions(), ["printf", "%s|", *words[2:]])[-1]],
                            capture_output=True, text=True, check=True).stdout
    assert echoed == "".join(f"{w}|" for w in words[2:])


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


# ---------------------------------------------------------------------------------- remote_agent_command


def test_remote_agent_command_words():
    line = remote_agent_command("/opt/my env/bin/python", "10.0.0.1:5000", "gpu 1", "run'1",
                                "/nfs/my project", ("/nfs/my project", "/nfs/lib"))
    assert shlex.split(line) == ["cd", "/nfs/my project", "&&", "exec", "env", "PYTHONUNBUFFERED=1",
                                 "PYTHONPATH=/nfs/my project:/nfs/lib", "/opt/my env/bin/python", "-m",
                                 "minitrain.agent", "--coordinator", "10.0.0.1:5000", "--node-id", "gpu 1",
                                 "--run-id", "run'1"]
    assert "PYTHONPATH" not in remote_agent_command("/py", "a:1", "n", "r", "/w")


def test_remote_agent_command_runs_in_a_shell(tmp_path):
    """Run the line as sshd would (sh -c), with a fake python that prints what it got."""
    workdir = tmp_path / "work dir"
    workdir.mkdir()
    fake = tmp_path / "bin dir" / "python"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\nprintf "%s\\n" "$PWD" "$PYTHONPATH" "$PYTHONUNBUFFERED" "$$" "$@"\n')
    fake.chmod(0o755)
    line = remote_agent_command(str(fake), "10.0.0.1:5000", "node $1", "run;2", str(workdir),
                                (str(workdir), "/x y"))
    # `echo $$` first: the shell's pid; exec makes the fake python keep it
    out = subprocess.run(["sh", "-c", f"echo $$; {line}"], capture_output=True, text=True, check=True,
                         cwd=tmp_path).stdout.splitlines()
    shell_pid, cwd, pythonpath, unbuffered, pid, *args = out
    assert cwd == str(workdir) and pythonpath == f"{workdir}:/x y" and unbuffered == "1"
    assert pid == shell_pid  # exec: the agent is the session's process
    assert args == ["-m", "minitrain.agent", "--coordinator", "10.0.0.1:5000", "--node-id", "node $1",
                    "--run-id", "run;2"]


# ---------------------------------------------------------------------------------- preflight


def _cluster(*names: str, **kwargs) -> ClusterConfig:
    return ClusterConfig(hosts=tuple(HostSpec(n) for n in names), **kwargs)


def _host_of(argv: list[str]) -> str:
    return argv[argv.index("--") - 1]


def _answer(**fields) -> str:
    return "Welcome to gpuN (motd noise)\n" + ssh.PREFLIGHT_MARKER + json.dumps(fields) + "\n"


def _done(argv, code=0, stdout="", stderr=""):
    return subprocess.CompletedProcess(argv, code, stdout, stderr)


def _as_sshd(argv, **kwargs):
    """Simulates a reachable host: runs the remote command string with sh -c, as sshd does."""
    assert argv[0] == "ssh" and kwargs["stdin"] is subprocess.DEVNULL
    return subprocess.run(["sh", "-c", argv[-1]], capture_output=True, text=True, timeout=kwargs["timeout"])


def test_preflight_reports_every_failing_host_at_once(tmp_path):
    probe = tmp_path / "marker"
    probe.write_text("c0ffee")
    calls = []

    def fake_run(argv, **kwargs):
        calls.append(argv)
        host = _host_of(argv)
        if host == "gpu1":
            return _as_sshd(argv, **kwargs)
        if host == "gpu2":
            return _done(argv, 255, stderr="ssh: connect to host gpu2 port 22: Connection timed out\n")
        if host == "gpu3":
            return _done(argv, stdout=_answer(minitrain="0.0.1", probe="c0ffee"))
        if host == "gpu4":
            return _done(argv, stdout=_answer(minitrain=minitrain.__version__,
                                              probe_error="No such file or directory"))
        raise AssertionError(host)

    cluster = _cluster("gpu1", "gpu2", "gpu3", "gpu4", python=sys.executable, workdir=str(tmp_path))
    with pytest.raises(PreflightError) as info:
        preflight(cluster, storage_probe=(str(probe), "c0ffee"), expected_version=minitrain.__version__,
                  pythonpath=(str(ROOT),), run=fake_run)
    error = info.value
    assert isinstance(error, LaunchError)
    assert sorted(_host_of(argv) for argv in calls) == ["gpu1", "gpu2", "gpu3", "gpu4"]
    assert set(error.failures) == {"gpu2", "gpu3", "gpu4"}
    message = str(error)
    assert "pre-flight failed on 3 of 4 host(s)" in message and "gpu1" not in message
    assert "gpu2: ssh failed: ssh: connect to host gpu2 port 22: Connection timed out (exit 255)" in message
    assert f"gpu3: minitrain 0.0.1 != driver's {minitrain.__version__}" in message
    assert (f"gpu4: cannot see the run's storage at {probe} (No such file or directory); shared storage is "
            f"required for multi-host runs") in message


def test_preflight_passes_and_checks_via_one_ssh_each(tmp_path):
    probe = tmp_path / "marker"
    probe.write_text("abc")
    calls = []

    def fake_run(argv, **kwargs):
        calls.append(argv)
        return _as_sshd(argv, **kwargs)

    cluster = _cluster("gpu1", "gpu2", python=sys.executable, workdir=str(tmp_path),
                       ssh=SSHOptions(port=2222))
    preflight(cluster, storage_probe=(str(probe), "abc"), expected_version=minitrain.__version__,
              pythonpath=(str(ROOT),), run=fake_run)
    assert len(calls) == 2 and all(argv[0] == "ssh" and "BatchMode=yes" in argv for argv in calls)
    assert all(argv[argv.index("-p") + 1] == "2222" for argv in calls)


def test_preflight_other_content_means_other_storage(tmp_path):
    probe = tmp_path / "marker"
    probe.write_text("someone else's run")
    with pytest.raises(PreflightError, match="holds other content"):
        preflight(_cluster("gpu1", python=sys.executable, workdir=str(tmp_path)),
                  storage_probe=(str(probe), "mine"), expected_version=minitrain.__version__,
                  pythonpath=(str(ROOT),), run=_as_sshd)


@pytest.mark.parametrize(("result", "reason"), [
    (_done([], 127, stderr="env: '/x/bin/python': No such file or directory"),
     "python /x/bin/python not found"),
    (_done([], 126, stderr="env: '/x/bin/python': Permission denied"),
     "python /x/bin/python cannot be run: env: '/x/bin/python': Permission denied"),
    (_done([], 2, stderr="sh: 1: cd: can't cd to /nfs/w"),
     "the check failed in /nfs/w with python /x/bin/python: sh: 1: cd: can't cd to /nfs/w (exit 2)"),
    (_done([], 0, stdout=_answer(minitrain_error="ModuleNotFoundError: No module named 'minitrain'")),
     "python /x/bin/python cannot import minitrain: ModuleNotFoundError"),
    (_done([], 0, stdout="no marker here\n"), "the check failed"),
    (_done([], 255, stderr="Host key verification failed.\n"),
     "ssh failed: Host key verification failed. (exit 255); the host's key is not in known_hosts"),
    (_done([], 255, stderr="u@gpu1: Permission denied (publickey).\n"),
     "ssh failed: u@gpu1: Permission denied (publickey). (exit 255); no key was accepted"),
])
def test_preflight_reasons(result, reason):
    cluster = _cluster("gpu1", python="/x/bin/python", workdir="/nfs/w")
    with pytest.raises(PreflightError) as info:
        preflight(cluster, expected_version=minitrain.__version__, run=lambda argv, **kw: result)
    assert f"gpu1: {reason}" in str(info.value)


def test_preflight_timeouts_and_missing_ssh():
    def timing_out(argv, **kwargs):
        raise subprocess.TimeoutExpired(argv, kwargs["timeout"])

    with pytest.raises(PreflightError, match="gpu1: ssh did not answer within 3 s"):
        preflight(_cluster("gpu1"), expected_version="0.1.0", timeout_s=3, run=timing_out)

    def no_ssh(argv, **kwargs):
        raise FileNotFoundError(2, "No such file or directory", "ssh")

    with pytest.raises(PreflightError, match="gpu1: the ssh client is not installed"):
        preflight(_cluster("gpu1"), expected_version="0.1.0", run=no_ssh)


def test_preflight_local_host_runs_without_ssh(tmp_path):
    """A real check on this machine: right version and storage pass, a wrong version or python fails."""
    probe = tmp_path / "marker"
    probe.write_text("xyz")
    local = _cluster("localhost", python=sys.executable, workdir=str(tmp_path))
    seen = []

    def real_run(argv, **kwargs):
        seen.append(argv)
        return subprocess.run(argv, **kwargs)

    preflight(local, storage_probe=(str(probe), "xyz"), expected_version=minitrain.__version__,
              pythonpath=(str(ROOT),), run=real_run)
    assert seen[0][0] == sys.executable and "ssh" not in seen[0]
    with pytest.raises(PreflightError,
                       match=f"localhost: minitrain {minitrain.__version__} != driver's 9.9.9"):
        preflight(local, expected_version="9.9.9", pythonpath=(str(ROOT),))
    missing = _cluster("localhost", python=str(tmp_path / "no" / "python"), workdir=str(tmp_path))
    with pytest.raises(PreflightError, match=r"localhost: python .*/no/python not found"):
        preflight(missing, expected_version=minitrain.__version__)
    nowhere = _cluster("localhost", python=sys.executable, workdir=str(tmp_path / "gone"))
    with pytest.raises(PreflightError, match="localhost: the workdir .*gone does not exist"):
        preflight(nowhere, expected_version=minitrain.__version__)


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
            return _done(argv, 255, stderr="fake: the other checks never started (serial pre-flight?)")
        finally:
            with lock:
                current[0] -= 1
        return _done(argv, stdout=_answer(minitrain="0.1.0"))

    started = time.monotonic()
    preflight(_cluster("gpu1", "gpu2", "gpu3"), expected_version="0.1.0", run=blocking_run)
    assert peak[0] == 3 and time.monotonic() - started < 10


def test_preflight_error_pickles():
    import pickle

    error = PreflightError("pre-flight failed", {"gpu2": ["ssh failed"]})
    copy = pickle.loads(pickle.dumps(error))
    assert str(copy) == "pre-flight failed" and copy.failures == {"gpu2": ["ssh failed"]}
