"""minitrain.coordinator.facts.attempt.AttemptTracker driven by the event records of coordinator/facts/events.py.

No processes: each test plays the facts an agent and its workers would send, in the order they would
arrive, and asks the tracker what it concluded.
"""

from __future__ import annotations

import pickle
import signal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minitrain.coordinator.facts import events as ev
from minitrain.coordinator.facts.attempt import AttemptTracker
from minitrain.coordinator.policy.ranks import assign_ranks
from minitrain.errors import root_cause, root_cause_line
from minitrain.records import FailureKind, NodeInfo, Phase, WorkerFailure

ATTEMPT = 2


def _node(node_id: str, hostname: str) -> NodeInfo:
    return NodeInfo(node_id=node_id, hostname=hostname, address="127.0.0.1", agent_pid=1, cpus=2,
                    memory_bytes=1 << 30)


NODES = [_node("n-a", "host-a"), _node("n-b", "host-b")]


def make_tracker(num_workers: int = 4) -> AttemptTracker:
    """Ranks 0,1 on host-a and 2,3 on host-b (SPREAD keeps ranks node-ordered)."""
    assignments = assign_ranks(NODES, num_workers, placement_strategy="SPREAD")
    return AttemptTracker.create(ATTEMPT, assignments, {n.node_id: n.hostname for n in NODES})


def node_of(tracker: AttemptTracker, rank: int) -> str:
    return tracker.ranks[rank].assignment.node_id


def start(tracker: AttemptTracker, rank: int, phase: Phase = Phase.TRAINING) -> None:
    """Spawn, connect and move one rank to `phase`."""
    pid = 1000 + rank
    tracker.on_spawned(ev.WorkerSpawned(node_of(tracker, rank), ATTEMPT, rank, pid))
    tracker.on_connected(ev.WorkerConnected(ATTEMPT, rank, pid, "host"))
    for p in (Phase.DIST_INIT, Phase.TRAINING, Phase.CHECKPOINT_UPLOAD, Phase.FINISHING):
        if p > phase:
            break
        tracker.on_phase(ev.WorkerPhaseChanged(ATTEMPT, rank, p))


def exited(tracker: AttemptTracker, rank: int, *, exit_code=None, sig=None, stopped_by_agent=False,
           time=50.0, spawn_error="", oom=False) -> None:
    tracker.on_exited(ev.WorkerExited(
        node_id=node_of(tracker, rank), attempt=ATTEMPT, rank=rank, pid=1000 + rank, exit_code=exit_code,
        signal=sig, stopped_by_agent=stopped_by_agent, time=time, spawn_error=spawn_error,
        oom_suspected=oom,
    ))


def reported(tracker: AttemptTracker, rank: int, exc_type="builtins.ValueError", message="boom",
             time=40.0, phase=Phase.TRAINING) -> None:
    # As the servicer builds it: no node and pid 0; the tracker fills them in.
    failure = WorkerFailure(rank=rank, node="", pid=0, phase=phase, time=time, exc_type=exc_type,
                            message=message, traceback="Traceback ...\nValueError: boom\n")
    tracker.on_failed(ev.WorkerFailed(ATTEMPT, failure, pickle.dumps(ValueError(message))))


def finish(tracker: AttemptTracker, rank: int) -> None:
    start(tracker, rank, Phase.FINISHING)
    tracker.on_done(ev.WorkerDone(ATTEMPT, rank))
    exited(tracker, rank, exit_code=0)


# ---------------------------------------------------------------------------------- tests


def test_create_names_ranks_by_hostname():
    tracker = make_tracker()
    assert sorted(tracker.ranks) == [0, 1, 2, 3]
    assert [tracker.ranks[r].node_name for r in range(4)] == ["host-a", "host-a", "host-b", "host-b"]
    assert tracker.nodes() == {"n-a", "n-b"}
    assert not tracker.failed() and not tracker.finished() and not tracker.all_exited()


def test_all_training_needs_every_rank():
    tracker = make_tracker()
    for rank in range(3):
        start(tracker, rank)
    assert not tracker.all_training()
    start(tracker, 3, Phase.DIST_INIT)
    assert not tracker.all_training()
    tracker.on_phase(ev.WorkerPhaseChanged(ATTEMPT, 3, Phase.TRAINING))
    assert tracker.all_training()


def test_clean_finish_is_not_a_failure():
    tracker = make_tracker()
    for rank in range(4):
        finish(tracker, rank)
    assert not tracker.failed()
    assert tracker.failures() == []
    assert tracker.finished() and tracker.all_exited()


def test_all_done_counts_each_rank_once_in_any_order():
    tracker = make_tracker(num_workers=4)
    for rank in (2, 0, 2, 3):  # a repeated WorkerDone counts once
        tracker.on_done(ev.WorkerDone(ATTEMPT, rank))
        assert not tracker.all_done()
    tracker.on_done(ev.WorkerDone(ATTEMPT, 9))  # not a rank of this attempt
    assert not tracker.all_done()
    tracker.on_done(ev.WorkerDone(ATTEMPT, 1))
    assert tracker.all_done() and tracker.done_count == 4


def test_finished_waits_for_exit_after_done():
    tracker = make_tracker(num_workers=1)
    start(tracker, 0, Phase.FINISHING)
    tracker.on_done(ev.WorkerDone(ATTEMPT, 0))
    assert not tracker.finished()
    exited(tracker, 0, exit_code=0)
    assert tracker.finished()


def test_exit_zero_without_done_is_a_failure():
    tracker = make_tracker()
    start(tracker, 1)
    exited(tracker, 1, exit_code=0)
    assert tracker.failed() and not tracker.finished()
    (failure,) = tracker.failures()
    assert failure.rank == 1 and failure.exit_code == 0
    assert failure.exc_type == "WorkerProcessError"
    assert "before its training function returned" in failure.message


def test_exit_code_is_a_failure_with_the_last_phase():
    tracker = make_tracker()
    start(tracker, 2, Phase.DIST_INIT)
    exited(tracker, 2, exit_code=3, time=77.0)
    (failure,) = tracker.failures()
    assert (failure.rank, failure.exit_code, failure.signal, failure.phase) == (2, 3, None, Phase.DIST_INIT)
    assert (failure.node, failure.pid, failure.time) == ("host-b", 1002, 77.0)
    assert failure.exc_type == "" and failure.cause == "exited with code 3"


def test_death_before_connecting_keeps_unspecified_phase():
    tracker = make_tracker()
    tracker.on_spawned(ev.WorkerSpawned("n-a", ATTEMPT, 0, 1000))
    exited(tracker, 0, exit_code=1)
    (failure,) = tracker.failures()
    assert failure.phase is Phase.UNSPECIFIED and failure.pid == 1000


def test_signal_is_a_failure_with_the_signal():
    tracker = make_tracker()
    start(tracker, 0)
    exited(tracker, 0, sig=int(signal.SIGKILL), oom=True)
    (failure,) = tracker.failures()
    assert failure.signal == signal.SIGKILL and failure.exit_code is None and failure.oom_suspected
    assert "SIGKILL (9)" in failure.cause and "out-of-memory" in failure.cause


def test_spawn_error_is_a_failure_saying_so():
    tracker = make_tracker()
    exited(tracker, 3, exit_code=None, spawn_error="No such file or directory: 'python9'")
    (failure,) = tracker.failures()
    assert failure.exc_type == "WorkerProcessError"
    assert "could not be started" in failure.message and "python9" in failure.message


def test_reported_exception_then_exit_is_one_failure_with_both():
    tracker = make_tracker()
    start(tracker, 1)
    reported(tracker, 1, time=40.0)
    assert tracker.failed()
    exited(tracker, 1, exit_code=1, time=41.0)
    (failure,) = tracker.failures()
    assert tracker.failure_order == [1]
    assert failure.exc_type == "builtins.ValueError" and failure.message == "boom"
    assert failure.exit_code == 1 and failure.signal is None
    assert failure.node == "host-a" and failure.pid == 1001  # filled in from what the tracker knew
    assert failure.time == 40.0  # when the exception happened, not when the process ended
    assert failure.traceback.startswith("Traceback")
    assert pickle.loads(tracker.exc_pickles()[1]).args == ("boom",)


def test_second_reported_exception_is_ignored():
    tracker = make_tracker()
    start(tracker, 0)
    reported(tracker, 0, message="first")
    reported(tracker, 0, message="second")
    (failure,) = tracker.failures()
    assert failure.message == "first" and tracker.failure_order == [0]


def test_exit_stopped_by_agent_is_not_a_failure():
    tracker = make_tracker()
    start(tracker, 0)
    tracker.note_stop()
    exited(tracker, 0, sig=int(signal.SIGTERM), stopped_by_agent=True)
    exited(tracker, 1, sig=int(signal.SIGKILL), stopped_by_agent=True)
    assert not tracker.failed() and tracker.failures() == []
    assert tracker.ranks[0].exited and tracker.ranks[1].exited


def test_duplicate_exit_is_ignored():
    tracker = make_tracker()
    start(tracker, 0)
    exited(tracker, 0, exit_code=3)
    exited(tracker, 0, exit_code=4)
    (failure,) = tracker.failures()
    assert failure.exit_code == 3


def test_events_for_unknown_ranks_are_ignored():
    tracker = make_tracker(num_workers=2)
    tracker.on_spawned(ev.WorkerSpawned("n-a", ATTEMPT, 9, 1))
    tracker.on_phase(ev.WorkerPhaseChanged(ATTEMPT, 9, Phase.TRAINING))
    tracker.on_done(ev.WorkerDone(ATTEMPT, 9))
    reported(tracker, 9)
    tracker.on_exited(ev.WorkerExited("n-a", ATTEMPT, 9, 1, 1, None, False, 1.0))
    assert not tracker.failed() and sorted(tracker.ranks) == [0, 1]


def test_node_lost_fails_its_unfinished_ranks_only():
    tracker = make_tracker()
    for rank in range(4):
        start(tracker, rank)
    tracker.on_node_lost("n-b", "heartbeats stopped", time=90.0)
    assert tracker.failure_order == [2, 3]
    for failure in tracker.failures():
        assert failure.exc_type == "NodeLostError" and failure.node == "host-b"
        assert "host-b" in failure.message and "heartbeats stopped" in failure.message
        assert failure.time == 90.0 and failure.phase is Phase.TRAINING
    assert tracker.ranks[2].exited and tracker.ranks[3].exited
    assert not tracker.ranks[0].exited and not tracker.ranks[1].exited


def test_node_lost_skips_exited_and_done_ranks():
    tracker = make_tracker()
    finish(tracker, 2)  # exited cleanly before the node went away
    start(tracker, 3, Phase.FINISHING)
    tracker.on_done(ev.WorkerDone(ATTEMPT, 3))  # done, exit not yet seen
    tracker.on_node_lost("n-b", "connection broke", time=1.0)
    assert not tracker.failed()
    assert tracker.ranks[3].exited


def test_node_lost_during_stop_is_the_root_cause_over_its_peers_broken_collectives():
    # The agent of n-b dies: ranks 0 and 1 on n-a fail first ("Connection closed by peer"), minitrain
    # starts stopping the attempt, and only then is the loss of n-b learned.
    tracker = make_tracker()
    for rank in range(4):
        start(tracker, rank)
    for rank in (0, 1):
        failure = WorkerFailure(rank=rank, node="", pid=0, phase=Phase.TRAINING, time=10.0,
                                exc_type="builtins.RuntimeError",
                                message="[gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.0.0.2]:4242")
        tracker.on_failed(ev.WorkerFailed(ATTEMPT, failure, b""))
    tracker.note_stop()
    tracker.on_node_lost("n-b", "its session ended", time=11.0)
    assert tracker.failure_order == [0, 1, 2, 3]
    root = root_cause(tracker.failures())
    assert root.exc_type == "NodeLostError" and root.rank == 2
    assert tracker.all_exited() is False and tracker.ranks[2].exited and tracker.ranks[3].exited


def test_node_lost_keeps_an_already_reported_exception():
    tracker = make_tracker()
    start(tracker, 0)
    reported(tracker, 0)
    tracker.on_node_lost("n-a", "gone", time=99.0)
    assert tracker.failure_order == [0, 1]
    assert tracker.ranks[0].failure.exc_type == "builtins.ValueError"
    assert tracker.ranks[1].failure.exc_type == "NodeLostError"


def test_failure_order_keeps_arrival_order():
    tracker = make_tracker()
    for rank in range(4):
        start(tracker, rank)
    exited(tracker, 2, exit_code=1, time=5.0)
    reported(tracker, 0, time=1.0)  # earlier timestamp, learned later
    exited(tracker, 3, sig=9, time=6.0)
    exited(tracker, 1, exit_code=7, time=7.0)
    exited(tracker, 0, exit_code=1, time=8.0)
    assert tracker.failure_order == [2, 0, 3, 1]
    assert [f.rank for f in tracker.failures()] == [2, 0, 3, 1]
    assert tracker.all_exited()


@pytest.mark.parametrize("phase", list(Phase))
def test_phase_is_recorded_as_sent(phase):
    tracker = make_tracker(num_workers=1)
    tracker.on_phase(ev.WorkerPhaseChanged(ATTEMPT, 0, phase))
    exited(tracker, 0, exit_code=2)
    assert tracker.failures()[0].phase is phase


def test_the_root_cause_line_follows_every_change_of_the_failures():
    """It is kept between changes (asked at every loop turn) and formatted anew when a failure is
    recorded or amended: an exit learned first, then the exception the worker reported, then a peer."""
    tracker = make_tracker()
    for rank in range(4):
        start(tracker, rank)
    assert tracker.root_cause_line() == ""
    exited(tracker, 1, exit_code=1, time=40.0)
    first = tracker.root_cause_line()
    assert first.startswith("rank 1 on host-a") and tracker.root_cause_line() is first
    reported(tracker, 1, time=39.0)
    assert "ValueError: boom" in tracker.root_cause_line()
    tracker.on_node_lost(node_of(tracker, 2), "lease expired", time=10.0)
    assert tracker.root_cause_line() == root_cause_line(tracker.failures())
    assert tracker.root_cause_line().startswith("rank 2 on host-b")


def test_progress_and_judged_failures_are_written_through_the_tracker():
    tracker = make_tracker()
    start(tracker, 0)
    tracker.progressed(0, 5.0)
    assert tracker.ranks[0].last_progress == 5.0 and tracker.ranks[0].last_round is None
    tracker.reported(0, 3, 7.0)
    assert (tracker.ranks[0].last_progress, tracker.ranks[0].last_round) == (7.0, 3)
    tracker.progressed(99, 1.0)
    tracker.reported(99, 0, 1.0)  # an unknown rank: ignored
    tracker.fail(WorkerFailure(rank=0, node="", pid=0, phase=Phase.TRAINING, time=8.0, exc_type="WorkerHangError",
                               message="silent"))
    (failure,) = tracker.failures()
    assert failure.node == "host-a" and failure.exc_type == "WorkerHangError" and tracker.exc_pickles() == {}


def test_a_round_a_failed_rank_reported_is_pending_while_a_live_rank_can_still_report_it():
    tracker = make_tracker()
    for rank in range(4):
        start(tracker, rank)
    assert tracker.ranks_behind() == (None, ()) and not tracker.round_pending()  # nobody failed
    for rank, last in ((0, 2), (1, 3), (2, 3), (3, 1)):
        for round_ in range(last + 1):
            tracker.reported(rank, round_, 1.0)
    reported(tracker, 1)  # failed after its report of round 3
    assert tracker.ranks_behind() == (3, (0, 3)) and tracker.round_pending()
    tracker.reported(0, 3, 2.0)
    tracker.on_done(ev.WorkerDone(ATTEMPT, 3, reports=2))  # a finished rank holds back no later round
    assert tracker.ranks_behind() == (3, ()) and not tracker.round_pending()


def test_no_round_is_pending_when_it_can_no_longer_complete():
    tracker = make_tracker(2)
    for rank in range(2):
        start(tracker, rank)
    reported(tracker, 1)  # failed before any report: no round of it can complete
    tracker.reported(0, 0, 1.0)
    assert tracker.ranks_behind() == (None, ()) and not tracker.round_pending()
    tracker = make_tracker(2)
    tracker.reported(1, 0, 1.0)
    reported(tracker, 1)
    assert tracker.round_pending()
    exited(tracker, 0, stopped_by_agent=True)  # the rank behind is gone without reporting it
    assert tracker.ranks_behind() == (0, (0,)) and not tracker.round_pending()
    tracker = make_tracker(2)
    tracker.reported(0, 0, 1.0)
    tracker.reported(1, 0, 1.0)
    tracker.reported(1, 1, 1.0)
    reported(tracker, 1)
    reported(tracker, 0)  # the peer failed too (its collective broke): round 0, the lowest, is complete
    assert tracker.ranks_behind() == (0, ()) and not tracker.round_pending()


def test_all_exited_and_all_drained_stay_right_whatever_the_order_ranks_exit_and_streams_open_in():
    """The two questions are answered from counts (a scan of the ranks at every loop turn would cost
    a share of the controller growing with the world size); the answers must not depend on the order."""
    tracker = make_tracker(4)
    for rank in (0, 1, 2, 3):
        tracker.on_connected(ev.WorkerConnected(ATTEMPT, rank, 100 + rank, "h"))
    answers = []
    for rank in (0, 1, 3):  # rank 2 is late
        tracker.on_stream_closed(ev.WorkerStreamClosed(ATTEMPT, rank))
        tracker.on_exited(ev.WorkerExited(node_id=node_of(tracker, rank), attempt=ATTEMPT, rank=rank, pid=100 + rank,
                                          exit_code=0, signal=None, stopped_by_agent=True, time=1.0))
        answers.append((tracker.all_exited(), tracker.all_drained()))
    assert answers == [(False, False)] * 3
    tracker.on_stream_closed(ev.WorkerStreamClosed(ATTEMPT, 2))
    assert tracker.all_drained() and not tracker.all_exited()
    # A stream that opens after the scan passed its rank: not drained any more.
    tracker.on_connected(ev.WorkerConnected(ATTEMPT, 0, 100, "h"))
    assert not tracker.all_drained()
    tracker.on_stream_closed(ev.WorkerStreamClosed(ATTEMPT, 0))
    assert tracker.all_drained()
    tracker.on_exited(ev.WorkerExited(node_id=node_of(tracker, 2), attempt=ATTEMPT, rank=2, pid=102, exit_code=0,
                                      signal=None, stopped_by_agent=True, time=1.0))
    assert tracker.all_exited()


EVENTS = st.lists(st.tuples(st.sampled_from(["connect", "close", "exit", "stop", "phase", "done", "lost", "fail"]),
                            st.integers(0, 3), st.sampled_from(list(Phase))), max_size=40)


@settings(max_examples=300, deadline=None)
@given(EVENTS)
def test_the_counted_answers_equal_a_scan_of_every_rank_after_any_sequence_of_events(events):
    """Any order and repetition of the facts (a stream that reopens, an exit after the node was lost, a
    phase that comes twice, a rank that is done and fails): all_training, all_exited, all_drained,
    all_done and finished say what a scan of the ranks says."""
    tracker = make_tracker(4)
    for kind, rank, phase in events:
        if kind == "connect":
            tracker.on_connected(ev.WorkerConnected(ATTEMPT, rank, 1000 + rank, "h"))
        elif kind == "close":
            tracker.on_stream_closed(ev.WorkerStreamClosed(ATTEMPT, rank))
        elif kind == "exit":
            exited(tracker, rank, exit_code=0)
        elif kind == "stop":
            exited(tracker, rank, sig=signal.SIGTERM, stopped_by_agent=True)
        elif kind == "phase":
            tracker.on_phase(ev.WorkerPhaseChanged(ATTEMPT, rank, phase))
        elif kind == "done":
            tracker.on_done(ev.WorkerDone(ATTEMPT, rank))
        elif kind == "lost":
            tracker.on_node_lost(node_of(tracker, rank), "lease", 60.0)
        else:
            reported(tracker, rank)
        states = list(tracker.ranks.values())
        assert tracker.all_training() == all(s.phase >= Phase.TRAINING for s in states)
        assert tracker.all_exited() == all(s.exited for s in states)
        assert tracker.all_drained() == (not any(s.stream_open for s in states))
        assert tracker.all_done() == all(s.done for s in states)
        assert tracker.finished() == all(s.done and s.exited and s.failure is None for s in states)
        assert tracker.lost_a_node() == any(s.failure is not None and s.failure.kind is FailureKind.NODE_LOST
                                            for s in states)


FAILURE_EVENTS = st.lists(st.tuples(st.sampled_from(["died", "raised", "peer", "lost", "stopped"]),
                                    st.integers(0, 3), st.sampled_from([10.0, 20.0, 30.0])), max_size=30)


@settings(max_examples=300, deadline=None)
@given(FAILURE_EVENTS)
def test_the_kept_root_cause_equals_the_one_found_by_a_scan_after_any_sequence_of_failures(events):
    """The root cause is kept as failures come in (a scan at every change was quadratic at thousands of
    failures): an exit learned before the rank's own exception (which amends it, also into a peer's
    consequence), a node lost, ties in time broken by rank; always what `errors.root_cause` finds."""
    tracker = make_tracker(4)
    for kind, rank, time in events:
        if kind == "died":
            exited(tracker, rank, exit_code=1, time=time)
        elif kind == "raised":
            reported(tracker, rank, time=time)
        elif kind == "peer":  # a collective that broke because a peer went away
            reported(tracker, rank, exc_type="RuntimeError", message="Connection closed by peer", time=time)
        elif kind == "lost":
            tracker.on_node_lost(node_of(tracker, rank), "lease", time)
        else:
            exited(tracker, rank, sig=signal.SIGTERM, stopped_by_agent=True, time=time)
        assert tracker.root_cause_line() == root_cause_line(tracker.failures())
        assert tracker.lost_a_node() == any(f.kind is FailureKind.NODE_LOST for f in tracker.failures())


def test_the_rendezvous_and_the_stop_are_told_to_the_tracker_through_its_methods():
    tracker = make_tracker()
    assert tracker.rendezvous is None and not tracker.stop_requested
    tracker.on_store_ready(ev.StoreReady(ATTEMPT, "10.0.0.1", 29500))
    tracker.note_stop()
    assert tracker.rendezvous == ("10.0.0.1", 29500) and tracker.stop_requested
    with pytest.raises(AttributeError):
        tracker.stop_requested = False  # read-only: the tracker is written only through its methods
    with pytest.raises(AttributeError):
        tracker.rendezvous = None
