"""An elastic run as the real Controller drives it (in process, without agents or workers): it starts
with the hosts that answered, sizes the attempt to what fits, and readies a host that comes back for the
start it would get when the run grows."""

from __future__ import annotations

import queue

from minitrain import commands as cmd
from minitrain.config import CheckpointConfig, FailureConfig
from minitrain.coordinator.facts import events as ev
from minitrain.coordinator.controller import POLL_S, Controller, LaunchSettings, RunSpec
from minitrain.coordinator.facts.metrics_log import MetricsLog
from minitrain.coordinator.policy.elastic import Sizing
from minitrain.records import NodeInfo
from minitrain.run_state import RunState
from minitrain.storage.checkpoint_manager import CheckpointManager
from minitrain.storage.filesystem import Storage


class Agents:
    """The launcher's handles: the agents in `dead` ended before they connected."""

    def __init__(self, dead=()):
        self.dead = set(dead)
        self.forgotten = []

    def dead_agents(self):
        return {node_id: "the agent process exited with code 255" for node_id in self.dead}

    def relaunch(self, node_id):
        return False

    def forget(self, node_id):
        self.forgotten.append(node_id)
        self.dead.discard(node_id)


class Hub:
    """An Outbox that records what is sent to agents."""

    def __init__(self):
        self.sent = []

    def to_agent(self, node_id, command):
        self.sent.append((node_id, command))
        return True

    def to_worker(self, attempt, rank, command):
        return True

    def close_worker(self, attempt, rank):
        pass


def _node(node_id: str) -> NodeInfo:
    return NodeInfo(node_id=node_id, hostname=node_id, address="10.0.0.1", agent_pid=1, cpus=8, memory_bytes=1,
                    ifname="eth0")


def _controller(tmp_path, agents, hub, start_wait_s=5.0):
    storage = Storage.for_run(str(tmp_path), "run")
    storage.makedirs()
    spec = RunSpec(run_id="r", num_workers=2, node_ids=("h0", "h1"), node_slots={"h0": 1, "h1": 1},
                   launch=LaunchSettings("e", storage.url(), b"", "gloo", 60.0, "/work", {"A": "1"}),
                   failure_limits=FailureConfig(max_failures=0),
                   sizing=Sizing(min_workers=1, resize_interval_s=5.0, start_wait_s=start_wait_s))
    events = queue.SimpleQueue()
    controller = Controller(spec, hub, events, agents, CheckpointManager.load(storage, CheckpointConfig()),
                            MetricsLog(storage))
    return controller, events


def _starts(hub):
    return [(node_id, len(command.workers)) for node_id, command in hub.sent if isinstance(command, cmd.StartWorkers)]


def test_a_host_whose_agent_died_is_left_out_and_the_run_starts_with_what_fits(tmp_path):
    agents, hub = Agents(dead={"h1"}), Hub()
    controller, events = _controller(tmp_path, agents, hub)
    controller.begin()
    events.put(ev.AgentConnected(_node("h0"), stream=1))
    for _ in range(5):
        controller.step()
    assert controller.state is RunState.STARTING
    assert _starts(hub) == [("h0", 1)]  # one worker: h1's agent died, min (1) fits on h0
    assert agents.forgotten == ["h1"]  # out of the run until it is probed again
    controller.end()


def test_a_host_that_connects_while_the_run_is_smaller_gets_a_warm_fork_server_for_its_start(tmp_path):
    hub = Hub()
    controller, events = _controller(tmp_path, Agents(), hub, start_wait_s=0.0)
    controller.begin()
    events.put(ev.AgentConnected(_node("h0"), stream=1))
    for _ in range(5):
        controller.step()
    assert _starts(hub) == [("h0", 1)]  # no wait: min fitted and MINITRAIN_ELASTIC_START_WAIT_S=0
    assert controller.step() == POLL_S  # an elastic run's intervals are looked at every POLL_S, even idle
    hub.sent.clear()
    events.put(ev.AgentConnected(_node("h1"), stream=2))
    controller.step()
    warm = [(node_id, command) for node_id, command in hub.sent if isinstance(command, cmd.PrepareForkServers)]
    # The environment of h1's start in a 2-worker attempt (worker_group.node_env), in the run's cwd.
    assert warm == [("h1", cmd.PrepareForkServers(1, env={"A": "1", "GLOO_SOCKET_IFNAME": "eth0",
                                                          "NCCL_SOCKET_IFNAME": "eth0"}, cwd="/work"))]
    controller.end()


def test_growth_counts_a_host_that_came_back_only_once_its_agent_answered_the_warm_up(tmp_path):
    """The group trains on at its size while the returned host imports torch, instead of being stopped
    at the next checkpoint and waiting for that import in the next attempt's rendezvous."""
    controller, events = _controller(tmp_path, Agents(), Hub(), start_wait_s=0.0)
    controller.begin()
    events.put(ev.AgentConnected(_node("h0"), stream=1))
    for _ in range(5):
        controller.step()
    events.put(ev.AgentConnected(_node("h1"), stream=2))
    controller.step()

    def fits():
        seen = controller._observe(0.0)
        return seen.fits, seen.fits_ready

    assert fits() == (2, 1)  # h1 is in, but still warming up
    events.put(ev.NodeWarmed("h1", stream=1, ready=True))  # an answer from an older agent of h1: ignored
    controller.step()
    assert fits() == (2, 1)
    events.put(ev.NodeWarmed("h1", stream=2, ready=False, detail="its fork server exited 3 times"))
    controller.step()
    assert fits() == (2, 2)  # no warm worker there will ever be: grown onto cold rather than never
    events.put(ev.AgentConnected(_node("h1"), stream=3))  # a new agent there: readied again, waited for again
    controller.step()
    assert fits() == (2, 1)
    events.put(ev.AgentLost("h1", "its connection broke", stream=3))
    controller.step()
    assert fits() == (1, 1)
    controller.end()
