"""Unit tests for preemption outside processes: get_preemption_info() without a preemption, the config,
Ray's PreemptionInfo / PreemptionError shapes, the agreed round and the coordinator's record of it.
The real protocol, with processes and signals, is tests/e2e/test_preemption_signals.py."""

from __future__ import annotations

import pickle
import signal

from hypothesis import given, strategies as st

from controller_support import RecordingOutbox

import minitrain
from minitrain import FailureConfig, PreemptionError, PreemptionInfo, RunConfig, ScalingConfig, _session
from minitrain.commands import PreemptionNotice, PreemptionRound
from minitrain.context import TrainContext
from minitrain.coordinator.facts import events as ev
from minitrain.coordinator.facts.attempt import AttemptTracker
from minitrain.coordinator.facts.preemption import DRIVER, Preemption, agreed_round
from minitrain.records import WorkerAssignment
from minitrain.torch import TorchTrainer


def test_exported_beside_get_context_and_get_checkpoint():
    assert {"get_preemption_info", "PreemptionError", "PreemptionInfo"} <= set(minitrain.__all__)
    assert minitrain._EXPORTS["get_preemption_info"] == minitrain._EXPORTS["get_context"] == "minitrain.train_api"
    assert minitrain.get_preemption_info.__doc__
    assert issubclass(PreemptionError, minitrain.TrainingFailedError)


def test_outside_a_training_function_returns_none_without_error():
    _session.set_current(None)
    assert minitrain.get_preemption_info() is None


class _WorkerLikeSession:
    context = TrainContext(experiment_name="x", world_rank=1, world_size=2)

    def report(self, metrics, checkpoint=None, checkpoint_dir_name=None, **options) -> None:
        pass

    def get_checkpoint(self):
        return None


def test_inside_a_session_without_preemption_support_returns_none():
    _session.set_current(_WorkerLikeSession())
    try:
        assert minitrain.get_preemption_info() is None
    finally:
        _session.set_current(None)


def _train() -> dict:
    return {"preemption": minitrain.get_preemption_info(), "rank": minitrain.get_context().get_world_rank()}


def test_inside_a_local_mode_training_function_returns_none(tmp_path):
    result = TorchTrainer(_train, scaling_config=ScalingConfig(num_workers=0),
                          run_config=RunConfig(name="preempt", storage_path=str(tmp_path))).fit()
    assert result.return_value == {"preemption": None, "rank": 0}


# ---------------------------------------------------------------------------- config and Ray's shapes


def test_the_default_signals_are_usr2_and_term_and_any_spelling_is_stored_as_names():
    assert FailureConfig().preemption_signals == ("SIGUSR2", "SIGTERM")
    assert FailureConfig().preemption_timeout_s == 20.0
    config = FailureConfig(preemption_signals=["usr1", int(signal.SIGUSR2), "SIGUSR1"])
    assert config.preemption_signals == ("SIGUSR1", "SIGUSR2")
    assert FailureConfig(preemption_signals=()).preemption_signals == ()


def test_preemption_info_has_rays_constructor_and_properties():
    info = PreemptionInfo(deadline_ms=1234, preempted_node_to_ranks={"n2": [3, 2], "n1": [0]})
    assert info.preempted_node_ids == ["n1", "n2"] and info.preempted_ranks == [0, 2, 3]
    assert PreemptionInfo(None, {}).preempted_ranks == [] and info.round == -1


def test_preemption_error_has_rays_attributes_and_pickles():
    info = PreemptionInfo(5, {"n": [0]}, round=4, signal="SIGUSR2")
    error = PreemptionError(info, drain_timed_out=True, message="preempted", resumable=False,
                            checkpoint_dir="checkpoint_000004")
    back = pickle.loads(pickle.dumps(error))
    assert (back.preemption_info, back.drain_timed_out, str(back), back.resumable, back.checkpoint_dir) == (
        info, True, "preempted", False, "checkpoint_000004")
    assert PreemptionError(info).drain_timed_out is False  # Ray's signature: (preemption_info, drain_timed_out)


# ---------------------------------------------------------------------------- the agreed round


@given(st.lists(st.integers(min_value=0, max_value=10_000), min_size=1, max_size=64))
def test_the_agreed_round_is_above_every_answer_and_one_past_the_largest(answers):
    """A rank told None after n reports must not be told otherwise at n; the rank that answered the
    most is held at max + 1 reports until it learns the round, so it must not be past it."""
    round_ = agreed_round(answers)
    assert all(round_ > n for n in answers) and round_ == max(answers) + 1


def _tracker(nodes=("n1", "n1", "n2")) -> AttemptTracker:
    assignments = [WorkerAssignment(rank, 0, len(nodes), 1, 0, node) for rank, node in enumerate(nodes)]
    return AttemptTracker.create(3, assignments, {})


def test_a_signal_is_again_only_when_its_process_had_one():
    preemption = Preemption(RecordingOutbox(), clock=lambda: 100.0, timeout_s=20.0)
    preemption.signalled(ev.PreemptionSignalled("n2", "SIGTERM", 99.0))
    preemption.signalled(ev.PreemptionSignalled("", "SIGTERM", 99.0))  # every pod at once: one preemption
    assert preemption.take_new() == (2, False)
    preemption.signalled(ev.PreemptionSignalled("n1", "SIGTERM", 99.5))
    assert preemption.take_new() == (1, False)
    preemption.signalled(ev.PreemptionSignalled("n2", "SIGTERM", 99.6))  # n2 again: hurry
    assert preemption.take_new() == (1, True) and preemption.take_new() == (0, False)


def test_the_round_is_chosen_once_every_rank_answered_and_sent_to_every_rank():
    outbox, tracker = RecordingOutbox(), _tracker()
    preemption = Preemption(outbox, clock=lambda: 100.0, timeout_s=20.0)
    preemption.signalled(ev.PreemptionSignalled("n2", "SIGUSR2", 99.0))
    assert preemption.take_new() == (1, False) and preemption.take_new() == (0, False)
    preemption.notify(tracker)
    assert [c for _, c in outbox.delivered("worker")] == [PreemptionNotice()] * 3
    preemption.seen(ev.PreemptionSeen(3, 0, 7))
    preemption.seen(ev.PreemptionSeen(2, 1, 99))  # a stale attempt's answer counts for nothing
    preemption.settle(tracker)
    assert preemption.round is None  # ranks 1 and 2 have not answered
    preemption.seen(ev.PreemptionSeen(3, 1, 9))
    tracker.ranks[2].done = True  # a finished rank is not waited for
    preemption.settle(tracker)
    assert preemption.round == 10
    sent = [c for _, c in outbox.delivered("worker")[3:]]
    assert sent == [PreemptionRound(10, 120_000, (("n2", (2,)),), "SIGUSR2")] * 3
    assert preemption.info.preempted_node_to_ranks == {"n2": [2]} and preemption.info.deadline_ms == 120_000


def test_the_round_is_reached_when_every_rank_reported_it_or_ended():
    outbox, tracker = RecordingOutbox(), _tracker(("n1", "n2"))
    preemption = Preemption(outbox, clock=lambda: 0.0, timeout_s=5.0)
    preemption.signalled(ev.PreemptionSignalled(DRIVER, "SIGTERM", 0.0))
    preemption.notify(tracker)
    for rank in (0, 1):
        preemption.seen(ev.PreemptionSeen(3, rank, 4))
    preemption.settle(tracker)
    assert preemption.round == 5 and preemption.info.preempted_node_to_ranks == {"n1": [0], "n2": [1]}
    tracker.ranks[0].last_round = 5
    tracker.ranks[1].last_round = 4
    assert not preemption.reached(tracker) and preemption.active
    tracker.ranks[1].last_round = 5
    assert preemption.reached(tracker) and preemption.completed and not preemption.active


def test_without_an_agreed_round_the_outcome_names_the_signals():
    preemption = Preemption(RecordingOutbox(), clock=lambda: 10.0, timeout_s=5.0)
    assert preemption.outcome_info(None) is None
    preemption.signalled(ev.PreemptionSignalled("n7", "SIGUSR2", 0.0))
    info = preemption.outcome_info(None)
    assert info == PreemptionInfo(15_000, {"n7": []}, round=-1, signal="SIGUSR2")



# ---------------------------------------------------------------------------- the driver's handlers


def test_a_signal_before_the_loop_is_kept_for_it_and_one_after_is_dropped():
    import os
    import signal as signals
    import threading

    from minitrain.coordinator.preemption_signals import preemption_deferred, preemption_noted

    if threading.current_thread() is not threading.main_thread():
        return  # handlers are installed from the main thread only
    noted = []
    with preemption_deferred(("SIGUSR2",)):
        os.kill(os.getpid(), signals.SIGUSR2)  # storage checks, agents starting: kept, the driver lives
        with preemption_noted(("SIGUSR2",), noted.append):
            assert noted == ["SIGUSR2"]  # handed to the loop as it starts
            os.kill(os.getpid(), signals.SIGUSR2)
            assert noted == ["SIGUSR2", "SIGUSR2"]
        os.kill(os.getpid(), signals.SIGUSR2)  # the loop is over: kept for nobody
    assert noted == ["SIGUSR2", "SIGUSR2"]
    assert signals.getsignal(signals.SIGUSR2) is signals.SIG_DFL


def test_a_users_own_handler_is_left_alone():
    import signal as signals
    import threading

    from minitrain.coordinator.preemption_signals import preemption_deferred, preemption_noted

    if threading.current_thread() is not threading.main_thread():
        return
    mine = lambda signum, frame: None  # noqa: E731
    saved = signals.signal(signals.SIGUSR2, mine)
    try:
        with preemption_deferred(("SIGUSR2",)), preemption_noted(("SIGUSR2",), lambda name: None):
            assert signals.getsignal(signals.SIGUSR2) is mine
    finally:
        signals.signal(signals.SIGUSR2, saved)


# ---------------------------------------------------------------------------- the worker's side


class _Client:
    """The part of WorkerClient a PreemptionGate uses."""

    def __init__(self, noticed=False, round_=None):
        self.preemption_noticed = noticed
        self._round = round_
        self.held = 0

    def wait_preemption_round(self, timeout_s):
        assert self._round is not None, "would wait for the round"
        return PreemptionRound(self._round, 1_000, (("n1", (0, 1)),), "SIGUSR2")

    def wait_closed(self, timeout_s):
        self.held += 1


def test_the_gate_says_none_before_the_round_and_the_info_from_it_on():
    from minitrain.worker.preemption import PreemptionGate

    assert PreemptionGate(_Client()).info(100) is None  # no notice: an attribute read, no wait
    gate = PreemptionGate(_Client(noticed=True, round_=5))
    assert gate.info(4) is None
    info = gate.info(5)
    assert info == PreemptionInfo(1_000, {"n1": [0, 1]}, round=5, signal="SIGUSR2") and gate.info(9) == info


def test_the_gate_holds_a_rank_only_past_the_agreed_round():
    from minitrain.worker.preemption import PreemptionGate

    client = _Client(noticed=True, round_=5)
    gate = PreemptionGate(client)
    gate.after_report(5)  # its report of round 4: the round-5 report (the checkpoint) comes next
    assert client.held == 0
    gate.after_report(6)  # its report of round 5 is in: nothing is computed past it
    assert client.held == 1
