"""Starting node agents (L1): a local subprocess, an ssh session, or a Slurm job step (``srun``), all
behind the same handle type: the process here (the agent, ssh or srun) ends when the agent does.

The run token, and for a multi-host run the run's TLS certificate after it, go to the agent on its
stdin (over the SSH channel for a remote host, srun's stdin forwarding for a step), never on its
command line or in its environment.
The agent's own stderr (not its workers' output, which travels over gRPC) is relayed to the driver's
log so a crash at start-up is explained.
"""

from __future__ import annotations

import collections
import logging
import os
import subprocess
import threading
from dataclasses import dataclass, field
from typing import Optional

from minitrain import procs
from minitrain.errors import LaunchError
from minitrain.hosts import hostinfo
from minitrain.hosts.cluster import ClusterConfig, HostSpec
from minitrain.hosts.srun import srun_argv, srun_environment
from minitrain.hosts.ssh import remote_agent_command, ssh_argv

logger = logging.getLogger("minitrain")

_TAIL_LINES = 40


@dataclass
class AgentProcess:
    """One started agent: its process and the tail of its stderr."""

    node_id: str
    process: subprocess.Popen
    tail: collections.deque = field(default_factory=lambda: collections.deque(maxlen=_TAIL_LINES))
    relay: Optional[threading.Thread] = None
    expected_exit: bool = False

    def failure(self) -> Optional[str]:
        """Why the agent ended, or None while it runs (or when its exit was expected)."""
        code = self.process.poll()
        if code is None or self.expected_exit:
            return None
        exit_code, signal = procs.decode_returncode(code)
        how = f"killed by signal {signal}" if signal else f"exited with code {exit_code}"
        if self.relay is not None:
            self.relay.join(timeout=2)
        tail = "\n".join(self.tail)
        return f"the agent process {how}" + (f"; its last output:\n{tail}" if tail else "")


class LaunchedAgents:
    """The agents of one run; implements the controller's `AgentHandles`.

    `start_agent(node_id)` starts one more agent (used to replace a dead one); None when the
    launcher cannot start agents again.
    """

    def __init__(self, agents: list[AgentProcess], start_agent=None):
        self.agents = agents
        self._start_agent = start_agent

    def forget(self, node_id: str) -> None:
        """A relaunched agent did not connect: stop it and expect nothing more from that node."""
        for agent in self.agents:
            if agent.node_id == node_id and not agent.expected_exit:
                agent.expected_exit = True
                procs.stop_process_group(agent.process, grace_s=1.0)

    def relaunch(self, node_id: str) -> bool:
        """Replace the agent of `node_id` with a new one; False when this launcher cannot."""
        if self._start_agent is None:
            return False
        for agent in self.agents:
            if agent.node_id == node_id:
                agent.expected_exit = True
        self.agents.append(self._start_agent(node_id))
        return True

    def dead_agents(self) -> dict[str, str]:
        """node_id -> why, for agents that ended unexpectedly."""
        dead = {}
        for agent in self.agents:
            why = agent.failure()
            if why is not None:
                dead[agent.node_id] = why
        return dead

    def stop(self, timeout_s: float = 10.0, grace_s: float = 2.0) -> None:
        """Wait up to `timeout_s` for each agent to exit after its Shutdown; then stop its group."""
        for agent in self.agents:
            agent.expected_exit = True
            try:
                agent.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                logger.warning("agent %s (pid %d) did not exit; stopping it", agent.node_id,
                               agent.process.pid)
            # The agent's group may still hold stragglers even after a clean exit.
            procs.stop_process_group(agent.process, grace_s=grace_s)
            if agent.relay is not None:
                agent.relay.join(timeout=2)
            for stream in (agent.process.stdin, agent.process.stdout, agent.process.stderr):
                if stream is not None:
                    stream.close()


def _relay(agent: AgentProcess) -> None:
    stream = agent.process.stderr
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", "replace").rstrip("\n")
        agent.tail.append(line)
        logger.warning("[agent %s] %s", agent.node_id, line)


class ClusterLauncher:
    """Starts one agent per host of a `ClusterConfig`: over SSH for remote hosts (as a Slurm job step
    with srun when the cluster's launcher is "srun"), as a local subprocess (in its own session) for
    this machine. Node ids are the host names.

    The coordinator binds only the local addresses the hosts reach this machine by: 127.0.0.1 when
    every host is this machine, else the address on the route to each remote host (an agent on this
    machine then dials that address too, so that the addresses it reports are reachable from the
    other hosts). `pythonpath` is put first on every agent's PYTHONPATH, so agents and workers import
    the same minitrain and user modules as the driver (the hosts must share them: NFS, containers).
    `agent_env` (host -> variables) is added to that host's agent's environment: the GPUs the run
    claimed there (`minitrain.hosts.reserve`), so its workers use those GPUs and no others.
    """

    def __init__(self, cluster: ClusterConfig, pythonpath: tuple[str, ...] = (),
                 agent_env: Optional[dict[str, dict[str, str]]] = None):
        self._cluster = cluster
        self._agent_env = agent_env or {}  # host -> what its agent's environment adds (its claimed GPUs)
        self._hosts = {host.name: host for host in cluster.hosts}
        self._pythonpath = pythonpath
        self._routes: dict[str, str] = {}

    def _route(self, host: HostSpec) -> str:
        if host.name not in self._routes:
            address, _ = hostinfo.route_to(host.name)
            if not address:
                raise LaunchError(f"no route from this machine to host {host.name!r}; check the name "
                                  "and the network (minitrain.init(hosts=...) / the hostfile)")
            self._routes[host.name] = address
        return self._routes[host.name]

    def bind_host_for(self, node_id: str) -> str:
        """The local address `node_id` reaches this machine by."""
        if self._cluster.all_local:
            return "127.0.0.1"
        host = self._hosts[node_id]
        if host.local:
            remote = next(h for h in self._cluster.hosts if not h.local)
            return self._route(remote)
        return self._route(host)

    def bind_hosts(self) -> tuple[str, ...]:
        """Every distinct local address the hosts reach this machine by."""
        return tuple(dict.fromkeys(self.bind_host_for(name) for name in self._hosts))

    def _argv(self, host: HostSpec, coordinator_address: str, run_id: str, local_stream: str = "") -> list[str]:
        python = self._cluster.resolved_python()
        agent = [python, "-m", "minitrain.agent", "--coordinator", coordinator_address,
                 "--node-id", host.name, "--run-id", run_id]
        if host.local:
            return agent + (["--local-stream", local_stream] if local_stream else [])
        if self._cluster.launcher == "srun":
            return srun_argv(host.name, agent, self._cluster.resolved_workdir(),
                             job_id=self._cluster.slurm_job_id)
        command = remote_agent_command(python, coordinator_address, host.name, run_id,
                                       self._cluster.resolved_workdir(), self._pythonpath,
                                       self._agent_env.get(host.name, {}))
        return ssh_argv(host, self._cluster.ssh, command)

    def start(self, node_ids: list[str], address_for, token: str, run_id: str,
              tls_cert: bytes = b"", local_stream: str = "") -> LaunchedAgents:
        """Start one agent per node id and hand each, on stdin (never argv or environment), the token
        on the first line and then `tls_cert` (the run's certificate in PEM, to pin; empty when every
        address is loopback); `address_for(node_id)` is the coordinator address that agent dials. An
        agent on this machine opens its stream on `local_stream` (the coordinator's local socket,
        "local:<path>") when one is given."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([*self._pythonpath, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env["PYTHONUNBUFFERED"] = "1"
        if self._cluster.launcher == "srun":
            env = srun_environment(env)

        def start_agent(node_id: str) -> AgentProcess:
            argv = self._argv(self._hosts[node_id], address_for(node_id), run_id, local_stream)
            process = procs.spawn(argv, env={**env, **self._agent_env.get(node_id, {})}, stdout=subprocess.DEVNULL)
            process.stdin.write(token.encode() + b"\n" + tls_cert)
            process.stdin.close()
            agent = AgentProcess(node_id, process)
            agent.relay = threading.Thread(target=_relay, args=(agent,), daemon=True,
                                           name=f"minitrain-agent-{node_id}-stderr")
            agent.relay.start()
            return agent

        return LaunchedAgents([start_agent(node_id) for node_id in node_ids], start_agent)
