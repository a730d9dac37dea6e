"""Fakes shared by minitrain.hosts.ssh's tests (tests/unit/test_ssh_commands.py without processes,
tests/process/test_ssh.py with a shell standing in for sshd): a host, a cluster of named hosts, a finished
`ssh` and a host's answer to the pre-flight check."""

from __future__ import annotations

import json
import subprocess

from minitrain.hosts import ssh
from minitrain.hosts.cluster import ClusterConfig, HostSpec

GPU1 = HostSpec("gpu1", 8)


def cluster_of(*names: str, **kwargs) -> ClusterConfig:
    """A ClusterConfig of the named hosts; `kwargs` are its other fields."""
    return ClusterConfig(hosts=tuple(HostSpec(n) for n in names), **kwargs)


def finished(argv, code=0, stdout="", stderr="") -> subprocess.CompletedProcess:
    """What a `run` returns for a command that ended with `code` and printed `stdout` and `stderr`."""
    return subprocess.CompletedProcess(argv, code, stdout, stderr)


def preflight_answer(**fields) -> str:
    """A host's pre-flight output: login noise, then the marker and `fields` as JSON."""
    return "Welcome to gpuN (motd noise)\n" + ssh.PREFLIGHT_MARKER + json.dumps(fields) + "\n"
