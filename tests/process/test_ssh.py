"""minitrain.hosts.ssh against a shell: the ssh command line's quoting, the remote agent command, and the
pre-flight, each run as sshd runs a remote command (`sh -c`) or on this machine. No real ssh. The pieces
that need no process: tests/unit/test_ssh_commands.py."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import minitrain
from minitrain.errors import LaunchError
from minitrain.hosts.cluster import SSHOptions
from minitrain.hosts.ssh import PreflightError, preflight, remote_agent_command, ssh_argv
from ssh_support import GPU1, cluster_of, finished, preflight_answer

ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------- ssh_argv


def test_ssh_argv_quotes_the_remote_command_as_one_string():
    words = ["python", "-c", "print('it''s \"quoted\"'); import sys", "a b", "$HOME", "x;rm -rf /", ""]
    argv = ssh_argv(GPU1, SSHOptions(), words)
    assert argv[-2] == "--" and isinstance(argv[-1], str)
    assert shlex.split(argv[-1]) == words
    # what sshd does with it: the remote shell runs the string
    echoed = subprocess.run(["sh", "-c", ssh_argv(GPU1, SSHOptions(), ["printf", "%s|", *words[2:]])[-1]],
                            capture_output=True, text=True, check=True).stdout
    assert echoed == "".join(f"{w}|" for w in words[2:])


# ---------------------------------------------------------------------------------- remote_agent_command


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


def _host_of(argv: list[str]) -> str:
    return argv[argv.index("--") - 1]


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
            return finished(argv, 255, stderr="ssh: connect to host gpu2 port 22: Connection timed out\n")
        if host == "gpu3":
            return finished(argv, stdout=preflight_answer(minitrain="0.0.1", probe="c0ffee"))
        if host == "gpu4":
            return finished(argv, stdout=preflight_answer(minitrain=minitrain.__version__,
                                              probe_error="No such file or directory"))
        raise AssertionError(host)

    cluster = cluster_of("gpu1", "gpu2", "gpu3", "gpu4", python=sys.executable, workdir=str(tmp_path))
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

    cluster = cluster_of("gpu1", "gpu2", python=sys.executable, workdir=str(tmp_path),
                       ssh=SSHOptions(port=2222))
    preflight(cluster, storage_probe=(str(probe), "abc"), expected_version=minitrain.__version__,
              pythonpath=(str(ROOT),), run=fake_run)
    assert len(calls) == 2 and all(argv[0] == "ssh" and "BatchMode=yes" in argv for argv in calls)
    assert all(argv[argv.index("-p") + 1] == "2222" for argv in calls)


def test_preflight_other_content_means_other_storage(tmp_path):
    probe = tmp_path / "marker"
    probe.write_text("someone else's run")
    with pytest.raises(PreflightError, match="holds other content"):
        preflight(cluster_of("gpu1", python=sys.executable, workdir=str(tmp_path)),
                  storage_probe=(str(probe), "mine"), expected_version=minitrain.__version__,
                  pythonpath=(str(ROOT),), run=_as_sshd)


def test_preflight_local_host_runs_without_ssh(tmp_path):
    """A real check on this machine: right version and storage pass, a wrong version or python fails."""
    probe = tmp_path / "marker"
    probe.write_text("xyz")
    local = cluster_of("localhost", python=sys.executable, workdir=str(tmp_path))
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
    missing = cluster_of("localhost", python=str(tmp_path / "no" / "python"), workdir=str(tmp_path))
    with pytest.raises(PreflightError, match=r"localhost: python .*/no/python not found"):
        preflight(missing, expected_version=minitrain.__version__)
    nowhere = cluster_of("localhost", python=sys.executable, workdir=str(tmp_path / "gone"))
    with pytest.raises(PreflightError, match="localhost: the workdir .*gone does not exist"):
        preflight(nowhere, expected_version=minitrain.__version__)
