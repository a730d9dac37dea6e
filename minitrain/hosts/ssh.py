"""Reaching hosts with the system ``ssh`` client, and checking them before a run (L1: stdlib + L0).

`ssh_argv` and `remote_agent_command` are pure: they build command lines and do no I/O, so a launcher
can log or dry-run them. `preflight` checks every host of a cluster in parallel, before any agent or
worker starts, and raises one `PreflightError` listing every host that is not ready and why.

Secrets never appear in a command line built here (no function takes one): ssh forwards its stdin
to the remote command, so the caller writes the run token (and the run's TLS certificate) on the ssh
process's stdin, as the local launcher does for a local agent. Remote ``ps`` and ssh logs therefore
never show it, and SSH encrypts it on the way.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Optional, Union

from minitrain.errors import LaunchError
from minitrain.hosts.cluster import ClusterConfig, HostSpec, SSHOptions
from minitrain.hosts.srun import PREFLIGHT_STEP_NAME, srun_argv, srun_environment

# The line of the pre-flight script's answer; anything else on stdout (a chatty .bashrc) is ignored.
PREFLIGHT_MARKER = "MINITRAIN_PREFLIGHT "
_MAX_PARALLEL = 64
_PROBE_READ_LIMIT = 1 << 16

# Runs on every host with the cluster's python; only stdlib, and syntax old interpreters still parse,
# so that a wrong python is reported as such instead of as a SyntaxError.
PREFLIGHT_SCRIPT = """\
import json, sys
out = {"python": sys.executable, "python_version": "%d.%d.%d" % tuple(sys.version_info[:3])}
try:
    import minitrain
    out["minitrain"] = str(getattr(minitrain, "__version__", None))
except Exception as error:
    out["minitrain_error"] = "%s: %s" % (type(error).__name__, error)
if len(sys.argv) > 1:
    try:
        with open(sys.argv[1], "rb") as probe:
            out["probe"] = probe.read(__LIMIT__).decode("utf-8", "replace")
    except (OSError, IOError) as error:
        out["probe_error"] = getattr(error, "strerror", None) or str(error)
print("__MARKER__" + json.dumps(out))
""".replace("__LIMIT__", str(_PROBE_READ_LIMIT)).replace("__MARKER__", PREFLIGHT_MARKER)


class PreflightError(LaunchError):
    """Some hosts are not ready for a run. `failures` maps host name -> the reasons (in host order)."""

    def __init__(self, message: str, failures: Mapping[str, Sequence[str]]):
        super().__init__(message)
        self.failures = {host: list(reasons) for host, reasons in failures.items()}

    def __reduce__(self):
        return (self.__class__, (self.args[0], self.failures))

    def unreachable_only(self) -> bool:
        """Every failing host failed only because it could not be reached (ssh timed out or could not
        connect), not because it is misconfigured (keys, python, minitrain version, storage)."""
        return all(reason.startswith(_UNREACHABLE) and not any(hint in reason for _, hint in _SSH_HINTS)
                   for reasons in self.failures.values() for reason in reasons)


def ssh_argv(host: HostSpec, ssh: SSHOptions, remote_command: Union[Sequence[str], str]) -> list[str]:
    """The ``ssh`` command line that runs `remote_command` on `host`. Pure: no I/O.

    Always: ``-o BatchMode=yes`` (never prompt), ``-o StrictHostKeyChecking=yes`` (``accept-new``
    only with `ssh.accept_new_host_keys`), ``-o ConnectTimeout=N``, ``-o ServerAliveInterval=2
    -o ServerAliveCountMax=3`` (a dead link ends the session in ~6 s), then ``-p``, ``-i``, ``-l``,
    ``-o UserKnownHostsFile=`` when set, each extra ``-o``, ``-T`` (no tty), the host, ``--`` and the
    remote command as one string. A list is joined with `shlex.join`, so every element reaches the
    remote shell as one word; a string is taken as a ready shell line (see `remote_agent_command`).
    The remote command's stdin is ssh's stdin: pass secrets there, never in `remote_command`.
    """
    strict = "accept-new" if ssh.accept_new_host_keys else "yes"
    argv = ["ssh", "-o", "BatchMode=yes", "-o", f"StrictHostKeyChecking={strict}",
            "-o", f"ConnectTimeout={max(1, math.ceil(ssh.connect_timeout_s))}",
            "-o", "ServerAliveInterval=2", "-o", "ServerAliveCountMax=3"]
    if ssh.port is not None:
        argv += ["-p", str(ssh.port)]
    if ssh.identity_file is not None:
        argv += ["-i", ssh.identity_file]
    if ssh.user is not None:
        argv += ["-l", ssh.user]
    if ssh.known_hosts_file is not None:
        argv += ["-o", f"UserKnownHostsFile={ssh.known_hosts_file}"]
    for option in ssh.extra_options:
        argv += ["-o", option]
    command = remote_command if isinstance(remote_command, str) else shlex.join(remote_command)
    return argv + ["-T", host.name, "--", command]


def _shell_line(workdir: str, env: Mapping[str, str], argv: Sequence[str]) -> str:
    """``cd WORKDIR && exec env K=V... ARGV...`` with every variable part quoted for a POSIX shell."""
    assignments = [f"{name}={value}" for name, value in env.items()]
    return f"cd {shlex.quote(workdir)} && exec " + shlex.join(["env", *assignments, *argv])


def _pythonpath_env(pythonpath: Sequence[str]) -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join(pythonpath)} if pythonpath else {}


def remote_agent_command(python: str, coordinator_address: str, node_id: str, run_id: str, workdir: str,
                         pythonpath: Sequence[str] = (), extra_env: Mapping[str, str] = {}) -> str:
    """The remote shell line that starts a node agent: a ready string for `ssh_argv`. Pure.

    ``cd WORKDIR && exec env PYTHONUNBUFFERED=1 [PYTHONPATH=P1:P2] PYTHON -m minitrain.agent
    --coordinator ADDR --node-id ID --run-id RUN``, each part shell-quoted, so `shlex.split` of it gives
    those words back. ``exec`` makes the agent the ssh session's process: when the session ends, the
    agent is the one that sees it. PYTHONPATH, when given, replaces the host's own. The run token is
    not here: write it as the first line of the ssh process's stdin, the run's certificate after it.
    `extra_env` (no secrets: it is on the command line) is added: the GPUs the run claimed there.
    """
    env = {"PYTHONUNBUFFERED": "1", **_pythonpath_env(pythonpath), **extra_env}
    argv = [python, "-m", "minitrain.agent", "--coordinator", coordinator_address, "--node-id", node_id,
            "--run-id", run_id]
    return _shell_line(workdir, env, argv)


def remote_python_command(python: str, workdir: str, pythonpath: Sequence[str], args: Sequence[str]) -> str:
    """The remote shell line that runs ``PYTHON ARGS...`` in `workdir` with the agents' PYTHONPATH, as
    the session's process (``exec``): for the resource ledger's holder (`minitrain.hosts.hold`). Pure."""
    return _shell_line(workdir, {"PYTHONUNBUFFERED": "1", **_pythonpath_env(pythonpath)}, [python, *args])


# ---------------------------------------------------------------------------------- pre-flight

Runner = Callable[..., subprocess.CompletedProcess]


def preflight(cluster: ClusterConfig, *, storage_probe: Optional[tuple[str, str]] = None,
              expected_version: str, timeout_s: float = 20, pythonpath: Sequence[str] = (),
              run: Runner = subprocess.run) -> None:
    """Check every host of `cluster` at once; raise one `PreflightError` naming each host not ready.

    Per host, in one ssh session (local hosts: one subprocess, no ssh; a Slurm cluster: one job step
    started with srun, see `minitrain.hosts.srun`): ssh reaches it (BatchMode),
    the cluster's python exists and runs in the cluster's workdir, ``import minitrain`` there gives
    `expected_version`, and with ``storage_probe=(path, content)`` the file at `path` holds `content`
    (the caller wrote it first with fresh random content: this proves the storage is shared).
    `pythonpath` is the PYTHONPATH the agents will get. Each host has `timeout_s` to answer. Hosts
    are checked in parallel threads; `run` (``subprocess.run``'s signature) is injectable for tests.
    Returns None when every host is ready; starts nothing that outlives the check.
    """
    hosts = cluster.hosts
    with ThreadPoolExecutor(max_workers=min(_MAX_PARALLEL, len(hosts)),
                            thread_name_prefix="minitrain-preflight") as pool:
        futures = [pool.submit(_check_host, cluster, host, storage_probe, expected_version, timeout_s,
                               tuple(pythonpath), run) for host in hosts]
        results = [future.result() for future in futures]
    failures = {host.name: reasons for host, reasons in zip(hosts, results) if reasons}
    if failures:
        lines = [f"  {name}: {reason}" for name, reasons in failures.items() for reason in reasons]
        raise PreflightError(f"pre-flight failed on {len(failures)} of {len(hosts)} host(s); nothing was "
                             f"started:\n" + "\n".join(lines), failures)


def _check_host(cluster: ClusterConfig, host: HostSpec, storage_probe: Optional[tuple[str, str]],
                expected_version: str, timeout_s: float, pythonpath: tuple[str, ...],
                run: Runner) -> list[str]:
    """The reasons `host` is not ready (empty when it is)."""
    python, workdir = cluster.resolved_python(), cluster.resolved_workdir()
    argv = [python, "-c", PREFLIGHT_SCRIPT] + ([storage_probe[0]] if storage_probe else [])
    kwargs = dict(capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    srun = not host.local and cluster.launcher == "srun"
    if host.local or srun:
        env = dict(os.environ)
        if pythonpath:
            env["PYTHONPATH"] = os.pathsep.join([*pythonpath, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        if srun:
            command = srun_argv(host.name, argv, workdir, job_id=cluster.slurm_job_id,
                                step_name=PREFLIGHT_STEP_NAME)
            kwargs = dict(kwargs, env=srun_environment(env))
        else:
            command, kwargs = argv, dict(kwargs, cwd=workdir, env=env)
    else:
        command = ssh_argv(host, cluster.ssh, _shell_line(workdir, _pythonpath_env(pythonpath), argv))
    try:
        result = run(command, **kwargs)
    except subprocess.TimeoutExpired:
        what = "the check" if host.local else "srun" if srun else "ssh"
        return [f"{what} did not answer within {timeout_s:g} s"]
    except FileNotFoundError as error:
        if srun:
            return ["srun is not installed here (no 'srun' on PATH), although this is a Slurm allocation; "
                    "install Slurm's client commands, or set MINITRAIN_SLURM=0 and name the hosts"]
        if not host.local:
            return ["the ssh client is not installed here (no 'ssh' on PATH)"]
        if error.filename == workdir:
            return [f"the workdir {workdir} does not exist"]
        return [f"python {python} not found"]
    except OSError as error:
        what = f"python {python}" if host.local else "srun" if srun else "ssh"
        return [f"cannot run {what}: {error.strerror or error}"]
    return _judge(host, result, python, workdir, storage_probe, expected_version, srun)


def _tail(text: Optional[str]) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


_SSH_HINTS = (
    ("Host key verification failed", "the host's key is not in known_hosts: add it (ssh-keyscan, after "
                                     "checking it) or opt in with accept_new_host_keys=True"),
    ("Permission denied", "no key was accepted: check the user (ssh_user) and key (ssh_identity_file), "
                          "or load the key into ssh-agent; passwords cannot be typed in BatchMode"),
)


# How `_check_host` and `_judge` word a host that does not answer (PreflightError.unreachable_only).
_UNREACHABLE = ("ssh did not answer within", "ssh failed:")


def _ssh_hint(stderr: Optional[str]) -> str:
    for needle, hint in _SSH_HINTS:
        if needle in (stderr or ""):
            return f"; {hint}"
    return ""


def _srun_error(stderr: str) -> str:
    """srun's own first error line (its later lines repeat it per task)."""
    for line in stderr.splitlines():
        if line.startswith("srun: error:"):
            return line[len("srun: error:"):].strip()
    return _tail(stderr)


def _answer(stdout: Optional[str]) -> Optional[dict]:
    for line in reversed((stdout or "").splitlines()):
        if line.startswith(PREFLIGHT_MARKER):
            try:
                answer = json.loads(line[len(PREFLIGHT_MARKER):])
            except ValueError:
                return None
            return answer if isinstance(answer, dict) else None
    return None


def _judge(host: HostSpec, result: subprocess.CompletedProcess, python: str, workdir: str,
           storage_probe: Optional[tuple[str, str]], expected_version: str, srun: bool = False) -> list[str]:
    code = result.returncode
    answer = _answer(result.stdout) if code == 0 else None
    if answer is None:
        if srun and "srun:" in (result.stderr or ""):
            return [f"srun failed: {_srun_error(result.stderr)} (exit {code})"]
        if code == 255 and not host.local:
            return [f"ssh failed: {_tail(result.stderr)} (exit 255){_ssh_hint(result.stderr)}"]
        if code == 127:
            return [f"python {python} not found"]
        if code == 126:
            return [f"python {python} cannot be run: {_tail(result.stderr)}"]
        return [f"the check failed in {workdir} with python {python}: {_tail(result.stderr)} (exit {code})"]
    reasons = []
    if "minitrain_error" in answer:
        reasons.append(f"python {python} cannot import minitrain: {answer['minitrain_error']}")
    elif answer.get("minitrain") != expected_version:
        reasons.append(f"minitrain {answer.get('minitrain')} != driver's {expected_version} "
                       f"(python {python}); install the same version on every host")
    if storage_probe is not None:
        path, content = storage_probe
        if "probe_error" in answer:
            detail = answer["probe_error"]
        elif answer.get("probe") != content:
            detail = "the file there holds other content (a different filesystem at the same path)"
        else:
            detail = None
        if detail is not None:
            reasons.append(f"cannot see the run's storage at {path} ({detail}); shared storage is "
                           f"required for multi-host runs")
    return reasons
