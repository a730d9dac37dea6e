"""Composes one run's coordinator: server, agents, controller; tears all of it down at the end."""

from __future__ import annotations

import logging
import queue
from typing import Callable, Protocol, Sequence

from minitrain import knobs
from minitrain.coordinator.controller import Controller, RunSpec
from minitrain.coordinator.facts.commits import CheckpointBook
from minitrain.coordinator.facts.metrics_log import MetricsLog
from minitrain.coordinator.observers import RunObserver
from minitrain.coordinator.transport.server import CoordinatorServer
from minitrain.coordinator.transport.service import CoordinatorService, Hub, LogSinkProtocol
from minitrain.errors import LaunchError
from minitrain.lease import LEASE_TIMEOUT_S
from minitrain.records import RunOutcome
from minitrain.rpc import tls
from minitrain.rpc.auth import new_token

logger = logging.getLogger("minitrain")


class Launcher(Protocol):
    """Starts node agents (see minitrain.hosts.launcher)."""

    def bind_hosts(self) -> tuple[str, ...]:
        """The local addresses the nodes reach this machine by (the coordinator binds only these)."""

    def bind_host_for(self, node_id: str) -> str:
        """Which of `bind_hosts()` the node `node_id` reaches this machine by."""

    def start(self, node_ids: list[str], address_for: Callable[[str], str], token: str, run_id: str,
              tls_cert: bytes = b"", local_stream: str = ""):
        """Start one agent per node id, each told to dial `address_for(node_id)` and given the token and
        the run's TLS certificate (empty when every bind is loopback) on stdin; an agent started on this
        machine may open its stream on `local_stream` (the coordinator's local socket, "" for none)
        instead. Returns handles with `dead_agents()`, `relaunch(node_id)` and `stop()`."""


def run_coordinator(spec: RunSpec, launcher: Launcher, log_sink: LogSinkProtocol,
                    checkpoints: CheckpointBook, metrics_log: MetricsLog,
                    observers: Sequence[RunObserver] = ()) -> RunOutcome:
    """Serve one run to its end and leave nothing running. `observers` are told of the run's
    progress (`minitrain.coordinator.observers`).

    A fresh 256-bit token authenticates every RPC of the run. An agent on this machine streams over the
    coordinator's local socket (`minitrain.coordinator.transport.local_agents`) unless MINITRAIN_LOCAL_AGENT_STREAM=0.
    When the coordinator binds any address that is not loopback (a multi-host run), a fresh certificate and
    key (`tls.new_run_identity`, in memory only) encrypt every connection there. A launcher with
    `run_credentials()` (agents that join, `minitrain.hosts.joining`) gives the token, identity and fixed
    port instead.
    KeyboardInterrupt propagates after the workers were stopped.
    """
    bind_hosts = launcher.bind_hosts()
    shared = getattr(launcher, "run_credentials", None)  # a joined run's (minitrain.hosts.joining)
    if shared is not None:
        token, identity, port = shared()
    else:
        token, port = new_token(), 0
        identity = tls.new_run_identity(bind_hosts) if any(map(tls.uses_tls, bind_hosts)) else None
    events: "queue.SimpleQueue" = queue.SimpleQueue()
    hub = Hub()
    service = CoordinatorService(spec.run_id, events, hub, log_sink, lease_timeout_s=LEASE_TIMEOUT_S,
                                 node_ids=tuple(spec.node_ids))
    server = CoordinatorServer(service, hub, token, hosts=bind_hosts, identity=identity, port=port,
                               local_agents=knobs.LOCAL_AGENT_STREAM.get()).start()
    agents = None
    try:
        try:
            agents = launcher.start(list(spec.node_ids), lambda node_id: server.address_for(
                launcher.bind_host_for(node_id)), token, spec.run_id,
                identity.cert_pem if identity is not None else b"", local_stream=server.local_agent_address)
        except OSError as exc:
            raise LaunchError(f"could not start the node agents: {exc}") from exc
        return Controller(spec, hub, events, agents, checkpoints, metrics_log, observers=observers).run()
    finally:
        if agents is not None:
            agents.stop()
        server.stop()
