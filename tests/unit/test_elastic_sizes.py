"""Elastic sizes (ScalingConfig(num_workers=(min, max))): the config, the size an attempt gets
(coordinator/policy/elastic.py) and the policy's resize rows (decide), scripted with no processes."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, strategies as st

from decide_support import run_script

from minitrain import ScalingConfig
from minitrain.coordinator.policy.actions import (
    GROW, SHRINK, CloseStreams, DropDeadAgents, MoveTo, RelaunchAgents, StartAttempt, StopWorkers,
)
from minitrain.coordinator.facts.membership import HostBackoff
from minitrain.coordinator.policy.decide import decide
from minitrain.coordinator.policy.elastic import Resize, Sizing, attempt_size, fitting_workers, resize_reason
from minitrain.coordinator.policy.loop import Loop, Rules, Seen, Wait
from minitrain.errors import ConfigError
from minitrain.records import NodeInfo
from minitrain.run_state import RunState, check_move

S = RunState
ELASTIC = Rules(max_failures=0, stop_grace_s=3.0, sizing=Sizing(min_workers=1, resize_interval_s=5.0))
RUNNING_2 = Seen(has_attempt=True, all_training=True, size=2, fits=2, fits_ready=2)


def _run(script, loop, rules=ELASTIC):
    return run_script(script, loop, rules)


def _running(size_at=0.0, failures=0) -> Loop:
    return Loop(state=S.RUNNING, waiting_for=Wait.WORKERS, failures=failures, sized_at=size_at)


# ---------------------------------------------------------------------------------- config

def test_an_elastic_range_is_accepted_and_gives_min_max_and_the_resources_of_max():
    config = ScalingConfig(num_workers=(1, 4), elastic_resize_monitor_interval_s=5)
    assert config.num_workers == (1, 4) and config.elasticity_enabled
    assert (config.min_workers, config.max_workers) == (1, 4)
    assert config.elastic_resize_monitor_interval_s == 5.0
    assert config.total_resources == {"CPU": 4.0}
    assert ScalingConfig(num_workers=[2, 2]).num_workers == (2, 2)  # a list is taken as the pair
    fixed = ScalingConfig(num_workers=3)
    assert not fixed.elasticity_enabled and (fixed.min_workers, fixed.max_workers) == (3, 3)
    assert ScalingConfig(num_workers=(1, 2)).elastic_resize_monitor_interval_s == 60.0  # Ray's default


@pytest.mark.parametrize("kwargs, words", [
    ({"num_workers": (3, 2)}, r"num_workers=\(3, 2\) .*1 <= min <= max"),
    ({"num_workers": (0, 2)}, r"num_workers=\(0, 2\) .*1 <= min <= max"),
    ({"num_workers": (1,)}, r"num_workers must be an int or a \(min, max\) tuple of two ints, got \(1,\)"),
    ({"num_workers": (1, "2")}, r"num_workers must be .* got \(1, '2'\)"),
    ({"num_workers": (True, 2)}, r"num_workers must be .* got \(True, 2\)"),
    ({"num_workers": (1, 2), "elastic_resize_monitor_interval_s": 0}, r"elastic_resize_monitor_interval_s .*> 0, got 0"),
    ({"num_workers": (1, 2), "elastic_resize_monitor_interval_s": float("nan")},
     r"elastic_resize_monitor_interval_s"),
    ({"num_workers": 2, "elastic_resize_monitor_interval_s": 5}, r"elastic_resize_monitor_interval_s=5 .*fixed int"),
])
def test_bad_elastic_settings_name_the_field_the_value_and_the_fix(kwargs, words):
    with pytest.raises(ConfigError, match=words) as caught:
        ScalingConfig(**kwargs)
    assert "e.g." in str(caught.value) or "Remove" in str(caught.value)


# ---------------------------------------------------------------------------------- sizes

def _node(name: str, cpus: int = 8, gpus: int = 0) -> NodeInfo:
    return NodeInfo(node_id=name, hostname=name, address="10.0.0.1", agent_pid=1, cpus=cpus, memory_bytes=2**30,
                    gpu_ids=tuple(range(gpus)))


def test_the_size_is_what_the_usable_nodes_hold_capped_at_max_and_refused_below_min():
    nodes = [_node("h0"), _node("h1")]
    slots = {"h0": 1, "h1": 1}
    assert fitting_workers(nodes, 4, slots=slots) == 2
    assert fitting_workers(nodes[:1], 4, slots=slots) == 1
    assert fitting_workers(nodes, 1, slots=slots) == 1
    assert fitting_workers([], 4) == 0
    assert fitting_workers([_node("g0", gpus=2), _node("g1", gpus=1)], 8, gpus_per_worker=1.0) == 3
    assert fitting_workers(nodes, 4, placement_strategy="STRICT_PACK", slots={"h0": 2, "h1": 2}) == 2
    assert attempt_size(3, 1, 2) == 2 and attempt_size(1, 1, 2) == 1
    with pytest.raises(ConfigError, match=r"only 1 worker\(s\) fit .*num_workers=\(2, 4\)\) needs at least 2"):
        attempt_size(1, 2, 4)


def test_a_resize_says_which_host_was_lost_or_came_back():
    assert resize_reason(SHRINK, {"h1": "its stream ended"}, ()) == "host h1 lost (its stream ended)"
    assert resize_reason(GROW, {}, {"h1"}) == "host(s) h1 back in the run, at the checkpoint boundary"
    resize = Resize(2, 2, 1, "host h1 lost (x)", 10.0)
    assert resize.line == "resize 2 -> 1 workers: host h1 lost (x)"
    assert resize.as_dict()["to_workers"] == 1


def test_an_elastic_run_probes_a_lost_host_once_per_interval():
    backoff = HostBackoff(5.0, 5.0)
    backoff.failed("h1", 100.0)
    backoff.failed("h1", 100.0)  # lost again: still the interval, not doubled
    assert not backoff.may_retry("h1", 104.9) and backoff.may_retry("h1", 105.0)


# ---------------------------------------------------------------------------------- shrink

def test_a_node_loss_with_enough_survivors_is_a_resize_that_charges_nothing():
    failed = replace(RUNNING_2, failed=True, root_cause="rank 1 on h1: node h1 was lost")
    loop, actions = _run([(failed, 10.0)], _running())
    # Nothing charged yet: the losses are judged once the attempt is down.
    assert (loop.state, loop.failures, loop.judging) == (S.RESTARTING, 0, True)
    assert actions == [MoveTo(S.RESTARTING, failed.root_cause), StopWorkers(3.0)]
    down = replace(failed, all_exited=True, all_drained=True, lost_in_attempt=True, lost_nodes=True, fits=1)
    loop, _ = _run([(down, 10.5)], loop)  # exited: drain
    loop, actions = _run([(down, 10.6)], loop)
    assert loop.state is S.STARTING and loop.failures == 0 and loop.resize == SHRINK and loop.attempt == 1
    assert actions[:2] == [CloseStreams(), RelaunchAgents()]  # the lost host is probed, not waited for
    assert StartAttempt(1, SHRINK) in actions and loop.sized_at == 10.6


def test_a_crash_without_a_node_loss_is_charged_and_fails_a_spent_budget():
    failed = replace(RUNNING_2, failed=True, root_cause="rank 1 raised ValueError")
    loop, _ = _run([(failed, 10.0)], _running())
    down = replace(failed, all_exited=True, all_drained=True, fits=2)
    loop, actions = _run([(down, 10.4), (down, 10.5)], loop)
    assert (loop.state, loop.target, loop.failures) == (S.STOPPING, S.FAILED, 1)
    assert actions[0] == CloseStreams() and MoveTo(S.STOPPING, failed.root_cause, S.FAILED) in actions
    loop, actions = _run([(down, 10.6)], loop)
    assert loop.state is S.FAILED
    allowed, actions = _run([(failed, 10.0), (down, 10.4), (down, 10.5)], _running(), replace(ELASTIC, max_failures=1))
    assert allowed.state is S.STARTING and allowed.failures == 1 and allowed.resize == ""


def test_a_node_loss_that_leaves_fewer_than_min_is_charged_and_waits_for_the_agents_as_a_fixed_run():
    rules = replace(ELASTIC, sizing=replace(ELASTIC.sizing, min_workers=2), max_failures=1)
    failed = replace(RUNNING_2, failed=True, root_cause="node lost")
    down = replace(failed, all_exited=True, all_drained=True, lost_in_attempt=True, lost_nodes=True, fits=1)
    loop, actions = _run([(failed, 10.0), (down, 10.4), (down, 10.5)], _running(), rules)
    assert loop.failures == 1 and loop.waiting_for is Wait.AGENTS and RelaunchAgents() in actions


# ---------------------------------------------------------------------------------- grow

def test_growth_waits_the_interval_then_the_next_committed_checkpoint():
    small = Seen(has_attempt=True, all_training=True, size=1, fits=2, fits_ready=2, checkpoints_committed=3)
    loop = _running(size_at=100.0)
    loop, actions = _run([(small, 104.0)], loop)
    assert loop.grow_armed is None and actions == []  # the interval has not passed
    loop, actions = _run([(small, 105.0), (small, 106.0)], loop)
    assert loop.grow_armed == 3 and loop.state is S.RUNNING  # due, waiting for the next checkpoint
    loop, actions = _run([(replace(small, checkpoints_committed=4), 107.0)], loop)
    assert (loop.state, loop.resize, loop.failures) == (S.RESTARTING, GROW, 0)
    assert actions == [MoveTo(S.RESTARTING, "resize 1 -> 2 workers at the checkpoint boundary: more workers fit"),
                       StopWorkers(3.0)]
    down = replace(small, all_exited=True, all_drained=True)
    loop, actions = _run([(down, 107.5), (down, 108.0)], loop)
    assert loop.state is S.STARTING and StartAttempt(1, GROW) in actions and loop.sized_at == 108.0


def test_growth_is_called_off_when_the_capacity_goes_again():
    small = Seen(has_attempt=True, all_training=True, size=1, fits=2, fits_ready=2, checkpoints_committed=3)
    loop, _ = _run([(small, 105.0)], _running())
    assert loop.grow_armed == 3
    loop, _ = _run([(replace(small, fits=1, fits_ready=1, checkpoints_committed=4), 106.0)], loop)
    assert loop.grow_armed is None and loop.state is S.RUNNING


def test_growth_waits_for_the_returned_node_to_be_warm_and_the_group_trains_on_meanwhile():
    # The node is back (fits 2) but its warm worker still imports torch (fits_ready 1): checkpoints
    # pass the interval without a growth; once it is ready, the next checkpoint grows the run.
    warming = Seen(has_attempt=True, all_training=True, size=1, fits=2, fits_ready=1, checkpoints_committed=3)
    loop, actions = _run([(warming, 105.0), (replace(warming, checkpoints_committed=5), 109.0)], _running())
    assert loop.grow_armed is None and loop.state is S.RUNNING and actions == []
    ready = replace(warming, fits_ready=2, checkpoints_committed=5)
    loop, actions = _run([(ready, 110.0)], loop)
    assert loop.grow_armed == 5 and loop.state is S.RUNNING
    loop, actions = _run([(replace(ready, checkpoints_committed=6), 110.5)], loop)
    assert (loop.state, loop.resize, loop.failures) == (S.RESTARTING, GROW, 0)


def test_dead_probes_are_dropped_and_lost_hosts_probed_while_running():
    seen = replace(RUNNING_2, size=1, agents_missing=("h1",), agents_failed="h1: ssh exited 255", probe_due=True)
    _, actions = _run([(seen, 1.0)], _running(size_at=0.0))
    assert actions == [DropDeadAgents(), RelaunchAgents()]
    _, fixed = _run([(seen, 1.0)], _running(), replace(ELASTIC, sizing=None))
    assert fixed == []  # a fixed-size run never probes while it runs


def test_launch_starts_with_the_hosts_that_answered_when_min_fits():
    loop, _ = _run([(Seen(agents_missing=("h1",)), 0.0)], Loop())
    seen = Seen(agents_missing=("h1",), agents_failed="node agent(s) failed to start: h1", fits=1)
    started, actions = _run([(seen, 1.0)], loop)
    assert started.state is S.STARTING and actions[0] == DropDeadAgents() and StartAttempt(0) in actions
    failed, _ = _run([(replace(seen, fits=0), 1.0)], loop)
    assert failed.target is S.FAILED


def test_launch_waits_a_little_for_the_other_hosts_once_min_fits():
    rules = replace(ELASTIC, sizing=replace(ELASTIC.sizing, start_wait_s=5.0))
    loop, _ = _run([(Seen(agents_missing=("h0", "h1")), 0.0)], Loop(), rules)
    some = Seen(agents_missing=("h1",), fits=1)
    loop, actions = _run([(some, 1.0), (some, 5.9)], loop, rules)
    assert loop.state is S.LAUNCHING and loop.min_fit_at == 1.0 and actions == []
    everyone, actions = _run([(Seen(fits=2), 2.0)], loop, rules)
    assert everyone.state is S.STARTING  # every host in: at once
    late, actions = _run([(some, 6.0)], loop, rules)
    assert late.state is S.STARTING and actions[0] == DropDeadAgents() and StartAttempt(0) in actions
    assert "not yet in: h1" in actions[1].reason


_SEEN = st.builds(
    Seen, agents_missing=st.sampled_from([(), ("n1",)]), agents_failed=st.sampled_from(["", "died"]),
    lost_nodes=st.booleans(), has_attempt=st.booleans(), failed=st.booleans(), finished=st.booleans(),
    all_training=st.booleans(), all_exited=st.booleans(), all_drained=st.booleans(), round_pending=st.booleans(),
    root_cause=st.just("cause"), interrupted=st.booleans(), fits=st.integers(0, 3), fits_ready=st.integers(0, 3),
    size=st.integers(0, 2),
    lost_in_attempt=st.booleans(), checkpoints_committed=st.integers(0, 3), probe_due=st.booleans())


@given(st.lists(st.tuples(_SEEN, st.floats(0, 5)), max_size=40), st.integers(-1, 2))
def test_any_elastic_sequence_moves_only_along_allowed_transitions_and_resizes_charge_nothing(script, max_failures):
    rules = replace(ELASTIC, max_failures=max_failures)
    loop, now, state = Loop(), 0.0, S.PENDING
    for seen, step in script:
        now += step
        decision = decide(loop, seen, now, rules)
        for action in decision.actions:
            if isinstance(action, MoveTo):
                check_move(state, action.state, action.target, heading=decision.loop.target)
                state = action.state
            if isinstance(action, StartAttempt) and action.resize:
                assert decision.loop.failures == loop.failures  # a resize is never charged
        assert decision.loop.state is state
        assert decision.loop.failures <= loop.failures + 1
        loop = decision.loop


def test_an_elastic_start_leaves_out_hosts_that_do_not_answer_but_never_misconfigured_ones():
    from minitrain.hosts.ssh import PreflightError

    def error(**failures):
        return PreflightError("pre-flight failed", failures)

    assert error(h1=["ssh did not answer within 20 s"]).unreachable_only()
    assert error(h1=["ssh failed: ssh: connect to host h1 port 22: Connection timed out (exit 255)"]).unreachable_only()
    assert not error(h1=["ssh failed: Permission denied (exit 255); no key was accepted: check the user (ssh_user) "
                         "and key (ssh_identity_file), or load the key into ssh-agent; passwords cannot be typed "
                         "in BatchMode"]).unreachable_only()
    assert not error(h1=["ssh did not answer within 20 s"],
                     h2=["minitrain 0.1 != driver's 0.2 (python python3); install the same version on every host"]
                     ).unreachable_only()
