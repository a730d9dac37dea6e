"""Which hosts a run uses and how to reach them (L1: stdlib + L0 only).

A cluster is a list of hosts plus the SSH options that reach them. It comes from, in order:

1. `init(hosts=...)` or `init(hostfile=...)`, the process-wide cluster (as Ray's `ray.init`);
2. the environment: ``MINITRAIN_HOSTS`` (a host list) or ``MINITRAIN_HOSTFILE`` (a hostfile path);
3. a Slurm allocation (``SLURM_JOB_ID`` set, unless ``MINITRAIN_SLURM=0``): its nodes and slots
   (`minitrain.hosts.slurm_env`), with agents started as job steps by ``srun`` instead of ssh;
4. the default: this machine alone, ``localhost`` run without ssh.

`current_cluster()` returns the first that applies. The two host syntaxes (a Horovod-style host list,
a DeepSpeed/MPI hostfile) and `HostSpec` are `minitrain.hosts.host_list`'s.

``slots`` caps the workers placed on a host; None leaves it to the host's resources. Hosts named
``localhost``, ``127.0.0.1`` or ``::1`` are local: their agent runs as a subprocess, without ssh.
"""

from __future__ import annotations

import math
import os
import re
import sys
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Optional, Union

from minitrain import knobs
from minitrain.errors import ConfigError
from minitrain.hosts import slurm_env
# Hosts as written and the two host-list syntaxes live in host_list; importers of this module keep
# finding them here.
from minitrain.hosts.host_list import (  # noqa: F401
    LOCAL_HOST_NAMES, HostSpec, is_local_host, load_hostfile, parse_host_list, parse_hostfile)

# The names of the environment variables read here (their table is minitrain.knobs); minitrain.tune
# sets them for its trial processes.
HOSTS_ENV_VAR = knobs.HOSTS.name
HOSTFILE_ENV_VAR = knobs.HOSTFILE.name
SLURM_ENV_VAR = knobs.SLURM.name

# How agents are started on the hosts that are not this machine.
LAUNCHERS = ("ssh", "srun", "join")

_SSH_OPTION = re.compile(r"([A-Za-z][A-Za-z0-9]*)=(\S.*)", re.DOTALL)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SSH_USER = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.$@-]*")

# ssh keeps the first value it is given for an option, and ssh_argv puts its own first: an extra option
# for one of these would be silently ignored, so it is refused with the field to use instead.
_RESERVED_SSH_OPTIONS = {
    "batchmode": "minitrain always sets BatchMode=yes: nothing can answer a password prompt",
    "stricthostkeychecking": "use accept_new_host_keys=True to accept unknown hosts' keys on first use",
    "userknownhostsfile": "use known_hosts_file=...",
    "connecttimeout": "use connect_timeout_s=...",
    "port": "use port=...",
    "identityfile": "use identity_file=...",
    "user": "use user=...",
    "serveraliveinterval": "minitrain sets it so that a dead link ends the session",
    "serveralivecountmax": "minitrain sets it so that a dead link ends the session",
}


@dataclass(frozen=True, kw_only=True, slots=True)
class SSHOptions:
    """How the system ``ssh`` client reaches every host of a cluster (see `minitrain.hosts.ssh.ssh_argv`).

    Host keys are checked strictly by default (``StrictHostKeyChecking=yes``: the host must already be
    in known_hosts). `accept_new_host_keys=True` opts in to ``accept-new`` (trust on first use; a
    changed key is still refused). There is no way to turn checking off. `extra_options` are
    ``"Key=Value"`` strings passed as ``-o Key=Value``; options minitrain sets itself are refused.
    `identity_file` and `known_hosts_file` are stored with ``~`` expanded.
    """

    user: Optional[str] = None
    port: Optional[int] = None
    identity_file: Optional[str] = None
    extra_options: tuple[str, ...] = ()
    accept_new_host_keys: bool = False
    known_hosts_file: Optional[str] = None
    connect_timeout_s: float = 10

    def __post_init__(self):
        if self.user is not None and (not isinstance(self.user, str) or not _SSH_USER.fullmatch(self.user)):
            raise ConfigError(f"SSHOptions.user must be None or a user name such as 'ubuntu', got "
                              f"{self.user!r}. Leave it None to use ssh's default (your ~/.ssh/config "
                              f"or the local user name).")
        if self.port is not None and (isinstance(self.port, bool) or not isinstance(self.port, int)
                                      or not 1 <= self.port <= 65535):
            raise ConfigError(f"SSHOptions.port must be None or an int in 1..65535, got {self.port!r}. "
                              f"Leave it None for ssh's default (22 or your ~/.ssh/config).")
        if self.identity_file is not None:
            object.__setattr__(self, "identity_file", _readable_identity_file(self.identity_file))
        object.__setattr__(self, "extra_options", _ssh_extra_options(self.extra_options))
        if not isinstance(self.accept_new_host_keys, bool):
            raise ConfigError(f"SSHOptions.accept_new_host_keys must be True or False, got "
                              f"{self.accept_new_host_keys!r}.")
        if self.known_hosts_file is not None:
            object.__setattr__(self, "known_hosts_file", self._checked_known_hosts())
        timeout = self.connect_timeout_s
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout) \
                or timeout <= 0:
            raise ConfigError(f"SSHOptions.connect_timeout_s must be a number of seconds > 0, got "
                              f"{timeout!r}. The default is 10.")

    def _checked_known_hosts(self) -> str:
        if not isinstance(self.known_hosts_file, str) or not self.known_hosts_file:
            raise ConfigError(f"SSHOptions.known_hosts_file must be None or a path, got "
                              f"{self.known_hosts_file!r}.")
        path = os.path.expanduser(self.known_hosts_file)
        if not self.accept_new_host_keys and not os.path.exists(path):
            raise ConfigError(f"SSHOptions.known_hosts_file={self.known_hosts_file!r} does not exist, and "
                              f"with strict host key checking every host would be refused. Fill it with "
                              f"`ssh-keyscan HOST >> {path}` (after checking the keys), or set "
                              f"accept_new_host_keys=True to record keys on first use.")
        return path


def _readable_identity_file(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"SSHOptions.identity_file must be None or the path of a private key, got "
                          f"{value!r}.")
    path = os.path.expanduser(value)
    if not os.path.isfile(path):
        raise ConfigError(f"SSHOptions.identity_file={value!r} does not exist or is not a file. Give the "
                          f"path of an existing private key, or None to use ssh's defaults/agent.")
    if not os.access(path, os.R_OK):
        raise ConfigError(f"SSHOptions.identity_file={value!r} is not readable by this user. Fix its "
                          f"permissions (chmod 600, owned by you), or use another key.")
    return path


def _ssh_extra_options(value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise ConfigError(f"SSHOptions.extra_options must be a tuple of 'Key=Value' strings, got "
                          f"{value!r}. Write extra_options=('ProxyJump=bastion',) for one option.")
    options = tuple(value)
    for option in options:
        match = _SSH_OPTION.fullmatch(option) if isinstance(option, str) else None
        if match is None:
            raise ConfigError(f"SSHOptions.extra_options has {option!r}; each option must look like "
                              f"'Key=Value' (as ssh -o takes it), e.g. 'ProxyJump=bastion'.")
        why = _RESERVED_SSH_OPTIONS.get(match.group(1).lower())
        if why is not None:
            raise ConfigError(f"SSHOptions.extra_options has {option!r}, which minitrain sets itself; "
                              f"{why}.")
    return options


@dataclass(frozen=True, kw_only=True, slots=True)
class ClusterConfig:
    """The hosts of a run and how to start agents on them.

    `python` is the interpreter on every host; None means the driver's `sys.executable` path, which
    works when the hosts share the install (NFS, identical containers). `workdir` is where agents
    start (and what they put first on PYTHONPATH); None means the driver's cwd. Both must be absolute
    (or `python` a bare command name): they are quoted, so ``~`` would not be expanded remotely.
    `env_vars_to_forward` names extra driver environment variables whose values workers receive.
    `launcher` is how agents start on hosts that are not this machine: ``"ssh"``, or ``"srun"`` (a job
    step per host inside the Slurm allocation `slurm_job_id`, see `minitrain.hosts.srun`), or ``"join"``:
    the driver starts no agent there and waits for them to join (`join`, a
    `minitrain.hosts.joining.JoinConfig`: the address they dial, the run id and token they present).
    """

    hosts: tuple[HostSpec, ...]
    ssh: SSHOptions = field(default_factory=SSHOptions)
    python: Optional[str] = None
    env_vars_to_forward: tuple[str, ...] = ()
    workdir: Optional[str] = None
    launcher: str = "ssh"
    slurm_job_id: Optional[str] = None
    join: Optional[object] = None  # a minitrain.hosts.joining.JoinConfig exactly when launcher == "join"

    def __post_init__(self):
        hosts = tuple(self.hosts) if isinstance(self.hosts, (list, tuple)) else None
        if not hosts or not all(isinstance(h, HostSpec) for h in hosts):
            raise ConfigError(f"ClusterConfig.hosts must be a non-empty tuple of HostSpec, got "
                              f"{self.hosts!r}. Build it with parse_host_list(['gpu1:8', 'gpu2:8']) or "
                              f"load_hostfile(path).")
        _refuse_duplicates(hosts)
        object.__setattr__(self, "hosts", hosts)
        if not isinstance(self.ssh, SSHOptions):
            raise ConfigError(f"ClusterConfig.ssh must be an SSHOptions, got {self.ssh!r}.")
        if self.python is not None:
            _check_path("python", self.python, allow_bare_name=True)
        if self.workdir is not None:
            _check_path("workdir", self.workdir, allow_bare_name=False)
        names = self.env_vars_to_forward
        if isinstance(names, str) or not isinstance(names, (list, tuple)) or \
                not all(isinstance(n, str) and _ENV_NAME.fullmatch(n) for n in names):
            raise ConfigError(f"ClusterConfig.env_vars_to_forward must be a tuple of environment variable "
                              f"names, got {names!r}. Write ('WANDB_PROJECT',) for one name.")
        object.__setattr__(self, "env_vars_to_forward", tuple(names))
        if self.launcher not in LAUNCHERS:
            raise ConfigError(f"ClusterConfig.launcher must be one of {LAUNCHERS}, got {self.launcher!r}. "
                              f"'srun' is chosen by itself inside a Slurm allocation.")
        if (self.launcher == "srun") != (self.slurm_job_id is not None):
            raise ConfigError(f"ClusterConfig.slurm_job_id must be the allocation's job id exactly when "
                              f"launcher='srun', got launcher={self.launcher!r}, "
                              f"slurm_job_id={self.slurm_job_id!r}. Build a Slurm cluster with "
                              f"cluster_from_slurm().")
        from minitrain.hosts.joining import JoinConfig

        if (self.launcher == "join") != isinstance(self.join, JoinConfig):
            raise ConfigError(f"ClusterConfig.join must be a JoinConfig exactly when launcher='join', got "
                              f"launcher={self.launcher!r}, join={self.join!r}. See docs/joining.md.")

    @property
    def all_local(self) -> bool:
        """True when every host is this machine (no ssh needed)."""
        return all(host.local for host in self.hosts)

    def replaced_at_once(self) -> frozenset:
        """The hosts whose lost agent is replaced at once, without a remote host's backoff: this machine,
        and every node of a Slurm allocation (the node is the job's until the job ends: an agent step
        that died is started again inside the allocation; a node Slurm lost fails its new step at once),
        and every host of a joined run (its host starts a new agent, e.g. a restarted pod: the run waits
        for it to join, `JoinConfig.timeout_s`, instead of leaving the host out for a backoff)."""
        return frozenset(host.name for host in self.hosts if host.local or self.launcher in ("srun", "join"))

    def resolved_python(self) -> str:
        """The interpreter to run on the hosts: `python`, or the driver's `sys.executable`."""
        return self.python if self.python is not None else sys.executable

    def resolved_workdir(self) -> str:
        """The directory agents start in: `workdir`, or the driver's current directory."""
        return self.workdir if self.workdir is not None else os.getcwd()


def _check_path(name: str, value: object, *, allow_bare_name: bool) -> None:
    bare = allow_bare_name and isinstance(value, str) and value and "/" not in value
    if not isinstance(value, str) or not (bare or os.path.isabs(value)) or "\n" in value or "\0" in value:
        kind = "an absolute path or a command name such as 'python3'" if allow_bare_name else \
            "an absolute path"
        raise ConfigError(f"ClusterConfig.{name} must be None or {kind}, got {value!r}. Paths are used "
                          f"as written on every host ('~' and relative paths are not expanded there); "
                          f"None uses the driver's own.")


def _refuse_duplicates(hosts: tuple[HostSpec, ...]) -> None:
    seen: set[str] = set()
    for host in hosts:
        key = host.name.lower()
        if key in seen:
            raise ConfigError(f"host {host.name!r} is listed twice. List each host once and give it "
                              f"slots=N for several workers.")
        seen.add(key)


def cluster_from_environment(environ: Optional[Mapping[str, str]] = None) -> Optional[ClusterConfig]:
    """The cluster named by ``MINITRAIN_HOSTS`` or ``MINITRAIN_HOSTFILE`` in `environ` (default:
    os.environ), else None.

    Empty values count as unset. Both set is a `ConfigError`. SSH options and the rest are defaults.
    """
    hosts = knobs.HOSTS.get(environ)
    hostfile = knobs.HOSTFILE.get(environ)
    if hosts and hostfile:
        raise ConfigError(f"both {HOSTS_ENV_VAR}={hosts!r} and {HOSTFILE_ENV_VAR}={hostfile!r} are set; "
                          f"set only one of them.")
    if hosts:
        try:
            return ClusterConfig(hosts=parse_host_list(hosts))
        except ConfigError as error:
            raise ConfigError(f"{HOSTS_ENV_VAR}: {error}") from error
    if hostfile:
        return ClusterConfig(hosts=load_hostfile(hostfile))
    return None


def cluster_from_slurm(environ: Optional[Mapping[str, str]] = None) -> Optional[ClusterConfig]:
    """The cluster of the Slurm allocation described by `environ` (default: os.environ), or None.

    None outside an allocation (``SLURM_JOB_ID`` unset) and with ``MINITRAIN_SLURM=0``; with
    ``MINITRAIN_SLURM=1`` outside an allocation, a `ConfigError`. Inside one: every node of
    ``SLURM_JOB_NODELIST`` with its slots (`minitrain.hosts.slurm_env`), none of them local (even the
    node this driver runs on gets its agent as a job step, with the step's share of the allocation),
    agents started by ``srun``. A bad Slurm variable raises `slurm_env.SlurmEnvironmentError`.
    """
    environ = os.environ if environ is None else environ
    mode = knobs.SLURM.get(environ)
    if mode is False:
        return None
    allocation = slurm_env.allocation_from_environment(environ)
    if allocation is None:
        if mode:
            raise ConfigError(f"{SLURM_ENV_VAR}=1 requires a Slurm allocation, but {slurm_env.JOB_ID} is not "
                              f"set. Run inside sbatch or salloc, or unset {SLURM_ENV_VAR}.")
        return None
    hosts = []
    for name, slots in zip(allocation.nodes, allocation.slots):
        try:
            hosts.append(HostSpec(name, slots, local=False))
        except ConfigError as error:
            raise slurm_env.SlurmEnvironmentError(
                f"{slurm_env.NODELIST} names {name!r}, which minitrain cannot use as a host name: {error}") \
                from None
    return ClusterConfig(hosts=tuple(hosts), launcher="srun", slurm_job_id=allocation.job_id)


# ---------------------------------------------------------------------------------- ambient cluster

_lock = threading.Lock()
_initialized: Optional[ClusterConfig] = None


def init(hosts: Union[str, Iterable[str], None] = None, hostfile: Union[str, os.PathLike, None] = None, *,
         ssh_user: Optional[str] = None, ssh_port: Optional[int] = None,
         ssh_identity_file: Optional[str] = None, ssh_options: tuple[str, ...] = (),
         ssh_known_hosts_file: Optional[str] = None,
         accept_new_host_keys: bool = False, python: Optional[str] = None,
         env_vars_to_forward: tuple[str, ...] = (), workdir: Optional[str] = None) -> ClusterConfig:
    """Set the process-wide cluster that runs use (as `ray.init` does), and return it.

    Give exactly one of `hosts` (a host list, see `parse_host_list`) or `hostfile` (a path, see
    `parse_hostfile`); otherwise `ConfigError`. Everything is validated before anything changes; a
    second call replaces the first cluster. The environment variables are not read once `init` ran.
    """
    global _initialized
    if (hosts is None) == (hostfile is None):
        raise ConfigError(f"init() takes exactly one of hosts=... or hostfile=..., got hosts={hosts!r}, "
                          f"hostfile={hostfile!r}.")
    specs = parse_host_list(hosts) if hosts is not None else load_hostfile(hostfile)
    ssh = SSHOptions(user=ssh_user, port=ssh_port, identity_file=ssh_identity_file,
                     extra_options=tuple(ssh_options), known_hosts_file=ssh_known_hosts_file,
                     accept_new_host_keys=accept_new_host_keys)
    cluster = ClusterConfig(hosts=specs, ssh=ssh, python=python, env_vars_to_forward=env_vars_to_forward,
                            workdir=workdir)
    with _lock:
        _initialized = cluster
    return cluster


def use_cluster(cluster: ClusterConfig) -> ClusterConfig:
    """Make `cluster` the process-wide cluster, as `init()` does with its arguments, and return it.

    For a process handed a cluster already built and checked: a tuner's trial process gets only the
    hosts reserved for it, with the driver's SSH options, interpreter and workdir.
    """
    global _initialized
    if not isinstance(cluster, ClusterConfig):
        raise ConfigError(f"use_cluster() takes a ClusterConfig, got {cluster!r}.")
    with _lock:
        _initialized = cluster
    return cluster


def current_cluster() -> ClusterConfig:
    """The cluster of the next run: the `init()` one, else ``MINITRAIN_HOSTS``/``MINITRAIN_HOSTFILE``,
    else the Slurm allocation this process runs in (`cluster_from_slurm`), else localhost alone.

    The environment is read on every call (no caching), so changing it between runs takes effect.
    """
    with _lock:
        cluster = _initialized
    if cluster is not None:
        return cluster
    from_env = cluster_from_environment()
    if from_env is not None:
        return from_env
    from_slurm = cluster_from_slurm()
    if from_slurm is not None:
        return from_slurm
    return ClusterConfig(hosts=(HostSpec("localhost", None, local=True),))


def shutdown() -> None:
    """Forget the `init()` cluster; `current_cluster()` goes back to the environment or localhost."""
    global _initialized
    with _lock:
        _initialized = None
