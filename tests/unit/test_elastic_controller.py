"""An elastic run as the real Controller drives it (in process, without agents or workers): it starts
with the hosts that answered, sizes the attempt to what fits, and readies a host that comes back for the
start it would get when the run grows."""

from __future__ import annotations

import queue

from controller_support import FakeAgents, RecordingOutbox, agent_node, make_controller

from minitrain import commands as cmd
from minitrain.config import FailureConfig
from minitrain.coordinator.controller import POLL_S
from minitrain.coordinator.facts import events as ev
from minitrain.coordinator.policy.elastic import Sizing
from minitrain.run_state import RunState


def _node(node_id: str):
    return agent_node(node_id, hostname=node_id, address="10.0.0.1", cpus=8, memory_bytes=1, ifname="eth0")


def _controller(tmp_path, agents, outbox, start_wait_s=5.0):
    events = queue.SimpleQueue()
    controller = make_controller(tmp_path, outbox, agents, events=events, cwd="/work", worker_env={"A": "1"},
                                 num_workers=2, node_ids=("h0", "h1"), node_slots={"h0": 1, "h1": 1},
                                 failure_limits=FailureConfig(max_failures=0),
                                 sizing=Sizing(min_workers=1, resize_interval_s=5.0, start_wait_s=start_wait_s))
    return controller, events


def _starts(outbox):
    return [(node_id, len(command.workers)) for node_id, command in outbox.delivered("agent", cmd.StartWorkers)]


def test_a_host_whose_agent_died_is_left_out_and_the_run_starts_with_what_fits(tmp_path):
    agents, outbox = FakeAgents(dead={"h1": "the agent process exited with code 255"}), RecordingOutbox()
    controller, events = _controller(tmp_path, agents, outbox)
    controller.begin()
    events.put(ev.AgentConnected(_node("h0"), stream=1))
    for _ in range(5):
        controller.step()
    assert controller.state is RunState.STARTING
    assert _starts(outbox) == [("h0", 1)]  # one worker: h1's agent died, min (1) fits on h0
    assert agents.forgotten == ["h1"]  # out of the run until it is probed again
    controller.end()


def test_a_host_that_connects_while_the_run_is_smaller_gets_a_warm_fork_server_for_its_start(tmp_path):
    outbox = RecordingOutbox()
    controller, events = _controller(tmp_path, FakeAgents(), outbox, start_wait_s=0.0)
    controller.begin()
    events.put(ev.AgentConnected(_node("h0"), stream=1))
    for _ in range(5):
        controller.step()
    assert _starts(outbox) == [("h0", 1)]  # no wait: min fitted and MINITRAIN_ELASTIC_START_WAIT_S=0
    assert controller.step() == POLL_S  # an elastic run's intervals are looked at every POLL_S, even idle
    outbox.take()
    events.put(ev.AgentConnected(_node("h1"), stream=2))
    controller.step()
    warm = outbox.delivered("agent", cmd.PrepareForkServers)
    # The environment of h1's start in a 2-worker attempt (worker_group.node_env), in the run's cwd.
    assert warm == [("h1", cmd.PrepareForkServers(1, env={"A": "1", "GLOO_SOCKET_IFNAME": "eth0",
                                                          "NCCL_SOCKET_IFNAME": "eth0"}, cwd="/work"))]
    controller.end()


def test_growth_counts_a_host_that_came_back_only_once_its_agent_answered_the_warm_up(tmp_path):
    """The group trains on at its size while the returned host imports torch, instead of being stopped
    at the next checkpoint and waiting for that import in the next attempt's rendezvous."""
    controller, events = _controller(tmp_path, FakeAgents(), RecordingOutbox(), start_wait_s=0.0)
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
