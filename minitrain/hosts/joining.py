"""Agents that join by themselves (L1): the run's side of ``launcher="join"``.

In a joined run the driver starts no agent on the hosts that are not this machine: something else
(a Kubernetes pod, a Slurm step, a person) starts ``python -m minitrain.launch --join HOST:PORT`` there,
and that agent dials the coordinator itself (`minitrain.agent.join`). What both sides share:

- the **run token**, at least 32 characters, from a file (``--token-file`` or
  ``MINITRAIN_JOIN_TOKEN_FILE``: a Secret mounted as a file) or the ``MINITRAIN_JOIN_TOKEN`` variable
  (a Secret as an environment variable); never from argv, which every user of the host can read in
  ``ps``. There is no default: a run without one is refused (`read_token`);
- the **address** joiners dial (`JoinConfig.address`, e.g. the master's DNS name and port): the
  coordinator listens on that port on every interface, and the run's TLS certificate is derived from
  the token and that host name (`minitrain.rpc.tls.join_identity`), so a joiner trusts it without being
  handed it;
- the **run id** (`JoinConfig.run_id`, e.g. the Kubernetes job's name): a joiner for another run, or for
  a run that is over and was followed by another, is refused with the reason.

Node ids are the host names of the cluster; each joiner says which it is (``--node-id``). The agents
of hosts marked local (this machine) are started here as in any run, dialling the same address.
"""

from __future__ import annotations

import collections
import logging
import os
from dataclasses import dataclass, field
from typing import Mapping, Optional

from minitrain import knobs
from minitrain.errors import ConfigError

logger = logging.getLogger("minitrain")

MIN_TOKEN_CHARS = 32  # a token of fewer characters could be guessed; `new_token()` makes 43


@dataclass(frozen=True)
class JoinConfig:
    """How the agents of a joined run reach its coordinator.

    `address` is ``HOST:PORT`` as the joiners dial it (the coordinator listens on PORT on every
    interface; HOST names the TLS certificate). `run_id` is the id joiners present. `token` is the run
    token (kept out of repr). `timeout_s` is how long the coordinator waits for the joiners.
    """

    address: str
    run_id: str
    token: str = field(repr=False)
    timeout_s: float = 600.0

    def __post_init__(self):
        host, port = split_address(self.address, "JoinConfig.address")
        if not isinstance(self.run_id, str) or not self.run_id or any(c.isspace() for c in self.run_id):
            raise ConfigError(f"JoinConfig.run_id must be a non-empty string without spaces, got {self.run_id!r}; "
                              f"every joiner passes the same one (--run-id).")
        check_token(self.token, "JoinConfig.token")
        if isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, (int, float)) or not self.timeout_s > 0:
            raise ConfigError(f"JoinConfig.timeout_s must be a number of seconds > 0, got {self.timeout_s!r}.")

    @property
    def host(self) -> str:
        """The host joiners dial (names the TLS certificate)."""
        return split_address(self.address, "JoinConfig.address")[0]

    @property
    def port(self) -> int:
        """The port the coordinator listens on."""
        return split_address(self.address, "JoinConfig.address")[1]


def split_address(address: object, field_name: str) -> tuple[str, int]:
    """(host, port) of ``HOST:PORT`` (``[v6]:PORT`` too); ConfigError naming `field_name` otherwise."""
    host, colon, port = address.rpartition(":") if isinstance(address, str) else ("", "", "")
    host = host.strip("[]")
    if not colon or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ConfigError(f"{field_name} must be HOST:PORT with a port in 1..65535, got {address!r}; e.g. "
                          f"'trainer-master-0:29500'.")
    return host, int(port)


def check_token(token: object, where: str) -> str:
    """`token`, or ConfigError when it is not a string of at least MIN_TOKEN_CHARS printable characters."""
    if not isinstance(token, str) or len(token) < MIN_TOKEN_CHARS or not token.isprintable() or " " in token:
        shown = f"{len(token)} characters" if isinstance(token, str) else repr(type(token).__name__)
        raise ConfigError(f"{where} must be a run token of at least {MIN_TOKEN_CHARS} printable characters "
                          f"without spaces, got {shown}. Make one with `python -c \"import secrets; "
                          f"print(secrets.token_urlsafe(32))\"` and share it as a Secret.")
    return token


def read_token(token_file: Optional[str] = None, environ: Optional[Mapping[str, str]] = None) -> str:
    """The run token: from `token_file`, else the file ``MINITRAIN_JOIN_TOKEN_FILE`` names, else
    ``MINITRAIN_JOIN_TOKEN``. ConfigError naming the source when none is set, the file cannot be read
    or the token is too short: a joined run never runs with a made-up token."""
    path = token_file or knobs.JOIN_TOKEN_FILE.get(environ)
    if path:
        where = f"the token file {path!r}" + ("" if token_file else f" ({knobs.JOIN_TOKEN_FILE.name})")
        try:
            with open(os.path.expanduser(path), encoding="utf-8") as file:
                text = file.read().strip()
        except OSError as error:
            raise ConfigError(f"cannot read {where}: {error.strerror or error}. Mount the run's token "
                              f"Secret there, or set {knobs.JOIN_TOKEN.name}.") from None
        return check_token(text, where)
    text = knobs.JOIN_TOKEN.get(environ)
    if text:
        return check_token(text, knobs.JOIN_TOKEN.name)
    raise ConfigError(f"a run whose agents join needs the run token: give --token-file PATH, or set "
                      f"{knobs.JOIN_TOKEN_FILE.name} (a Secret mounted as a file) or {knobs.JOIN_TOKEN.name} "
                      f"(a Secret as an environment variable). minitrain does not invent one.")


# ---------------------------------------------------------------------------------- the run's side


@dataclass
class _JoinedAgent:
    node_id: str
    process: Optional[object] = None  # subprocess.Popen of a local agent; None for a joiner
    tail: collections.deque = field(default_factory=lambda: collections.deque(maxlen=40))


class JoinedAgents:
    """The agents of a joined run; the controller's `AgentHandles`.

    Joiners are not this process's children: one that is lost shows as its stream ending (the
    coordinator's lease), never here, and it is not started again from here: `relaunch` only says a
    new agent is expected, which its host starts (Kubernetes restarting the pod), and the controller
    waits for it as for any relaunched agent (up to `JoinConfig.timeout_s`). The local agents are
    children, relaunched as in any run.
    """

    def __init__(self, local, local_ids: frozenset = frozenset()):
        self._local = local  # minitrain.hosts.launcher.LaunchedAgents of the local hosts, or None
        self._local_ids = local_ids

    def forget(self, node_id: str) -> None:
        if self._local is not None:
            self._local.forget(node_id)

    def relaunch(self, node_id: str) -> bool:
        if node_id in self._local_ids:
            return self._local is not None and self._local.relaunch(node_id)
        logger.warning("node %s: waiting for its agent to join again (its host starts it)", node_id)
        return True

    def dead_agents(self) -> dict[str, str]:
        return self._local.dead_agents() if self._local is not None else {}

    def stop(self, timeout_s: float = 10.0, grace_s: float = 2.0) -> None:
        if self._local is not None:
            self._local.stop(timeout_s, grace_s)


class JoinLauncher:
    """The launcher of a ``launcher="join"`` cluster: starts the agents of this machine's hosts (dialling
    `JoinConfig.address`, as joiners do) and waits for the others to join (`run_credentials`)."""

    def __init__(self, cluster, local_launcher):
        self._cluster = cluster
        self._join: JoinConfig = cluster.join
        self._local_launcher = local_launcher  # a ClusterLauncher: how this machine's agents start
        self._local = {host.name for host in cluster.hosts if host.local}

    def run_credentials(self):
        """(token, TLS identity, port): the run's shared token, the identity derived from it and the
        fixed port joiners dial."""
        from minitrain.rpc import tls

        return self._join.token, tls.join_identity(self._join.token, self._join.host), self._join.port

    def bind_hosts(self) -> tuple[str, ...]:
        """Every interface, serving TLS; but a loopback `JoinConfig.address` (every agent on this machine)
        is bound alone, plaintext, since agents dial loopback without TLS (`tls.uses_tls`): serving TLS
        there broke the run's own local agent (a PyTorchJob with ``MASTER_ADDR=127.0.0.1``)."""
        from minitrain.rpc import tls

        return ("0.0.0.0",) if tls.uses_tls(self._join.host) else (self._join.host,)

    def bind_host_for(self, node_id: str) -> str:
        return self.bind_hosts()[0]

    def start(self, node_ids: list[str], address_for, token: str, run_id: str, tls_cert: bytes = b"",
              local_stream: str = ""):
        """Start the agents of the local hosts among `node_ids` (on `local_stream` when given, see
        `ClusterLauncher.start`); the others join by themselves."""
        local = [node_id for node_id in node_ids if node_id in self._local]
        waiting = [node_id for node_id in node_ids if node_id not in self._local]
        if waiting:
            logger.info("waiting up to %g s for the agents of %s to join at %s (run %s)", self._join.timeout_s,
                        ", ".join(waiting), self._join.address, run_id)
        handles = None
        if local:
            handles = self._local_launcher.start(local, lambda _: self._join.address, token, run_id, tls_cert,
                                                 local_stream)
        return JoinedAgents(handles, frozenset(local))
