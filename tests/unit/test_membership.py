"""minitrain.coordinator.facts.membership: which node agents are in the run, and the lost hosts' backoff."""

from __future__ import annotations

from controller_support import FakeAgents, FakeClock, agent_node

from minitrain.coordinator.facts import events as ev
from minitrain.coordinator.facts.membership import HostBackoff, Membership


def _membership(agents, local=("a",)):
    clock = FakeClock()
    return Membership(("a", "b", "c"), frozenset(local), agents, clock), clock


def test_missing_nodes_and_why_their_agents_will_not_come():
    agents = FakeAgents(dead={"b": "exit code 1", "z": "not in the run"})
    members, _ = _membership(agents)
    assert members.missing() == ("a", "b", "c")
    members.connected(ev.AgentConnected(agent_node("a")))
    assert members.missing() == ("b", "c")
    assert members.failed_to_start(members.missing()) == "node agent(s) failed to start: b: exit code 1"
    assert members.failed_to_start(()) == ""
    assert [n.node_id for n in members.usable()] == ["a"]


def test_a_loss_counts_once_and_only_for_the_agent_s_current_stream():
    members, _ = _membership(FakeAgents())
    members.connected(ev.AgentConnected(agent_node("b"), stream=2))
    assert not members.lose(ev.AgentLost("b", "old stream ended", stream=1))  # a reconnect's old stream
    assert members.lose(ev.AgentLost("b", "lease expired", stream=2))
    assert not members.lose(ev.AgentLost("b", "again", stream=2))
    assert dict(members.lost) == {"b": "lease expired"} and members.lost_text() == "b (lease expired)"
    assert members.missing() == ("a", "c") and members.usable() == []


def test_a_lost_local_agent_is_relaunched_at_once_a_remote_host_after_its_backoff():
    agents = FakeAgents(relaunchable={"a", "b"})
    members, clock = _membership(agents)
    for node_id in ("a", "b"):
        members.connected(ev.AgentConnected(agent_node(node_id)))
        members.lose(ev.AgentLost(node_id, "gone"))
    members.relaunch_lost()
    assert agents.relaunched == ["a"] and dict(members.lost) == {"b": "gone"}
    assert members.missing() == ("a", "c")  # relaunched: waited for again
    clock.now = HostBackoff.FIRST_S
    members.relaunch_lost()
    assert agents.relaunched == ["a", "b"] and not members.lost


def test_relaunched_agents_that_do_not_come_back_are_forgotten_and_back_off_longer():
    agents = FakeAgents(relaunchable={"a", "b"})
    members, clock = _membership(agents, local=("a", "b"))
    for node_id in ("a", "b"):
        members.connected(ev.AgentConnected(agent_node(node_id)))
        members.lose(ev.AgentLost(node_id, "gone"))
    members.relaunch_lost()
    members.connected(ev.AgentConnected(agent_node("a"), stream=1))
    members.forget_relaunched("the agents' start timed out")
    assert agents.forgotten == ["b"]
    assert dict(members.lost) == {"b": "it did not come back (the agents' start timed out)"}
    assert [n.node_id for n in members.usable()] == ["a"]


def test_host_backoff_doubles_and_is_capped():
    backoff = HostBackoff()
    assert backoff.may_retry("h1", 0.0)
    backoff.failed("h1", 100.0)
    assert not backoff.may_retry("h1", 129.0) and backoff.may_retry("h1", 130.0)
    backoff.failed("h1", 130.0)
    assert not backoff.may_retry("h1", 189.0) and backoff.may_retry("h1", 190.0)
    for _ in range(10):
        backoff.failed("h1", 1000.0)
    assert backoff.may_retry("h1", 1000.0 + HostBackoff.LONGEST_S)
