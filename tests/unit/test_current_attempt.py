"""`CurrentAttempt` on its own: where each event of an attempt is recorded, which events are stale, and
what the observers are told of the attempt (its start, its end once, telemetry with host, pid and phase,
stacks). The whole controller around it is stepped in test_controller.py."""

from __future__ import annotations

from controller_support import RecordingObserver, RecordingOutbox, agent_node, run_storage

from minitrain.commands import Assignment, CheckpointList, DumpStacks, PhaseAck, Release, StartWorkers
from minitrain.config import CheckpointConfig
from minitrain.coordinator.current_attempt import CurrentAttempt
from minitrain.coordinator.facts import events as ev
from minitrain.coordinator.facts.commits import Commits
from minitrain.coordinator.facts.hang_watch import HangWatch
from minitrain.coordinator.facts.metrics_log import MetricsLog, read_metrics_history
from minitrain.coordinator.facts.worker_group import LaunchSettings
from minitrain.coordinator.observers import Observers, TelemetrySample
from minitrain.coordinator.policy.hangs import HangRule
from minitrain.records import Phase, ReportRecord, WorkerAssignment, WorkerFailure
from minitrain.storage.checkpoint_manager import CheckpointManager
from minitrain.storage.filesystem import Storage

NODES = {n: agent_node(n) for n in ("n0", "n1")}


def _current(tmp_path, told=None, now=lambda: 100.0):
    storage = run_storage(tmp_path)
    outbox = RecordingOutbox()
    observers = Observers([told] if told is not None else [])
    commits = Commits(CheckpointManager.load(storage, CheckpointConfig()), MetricsLog(storage), outbox, now,
                      observers)
    hangs = HangWatch(HangRule(timeout_s=None))
    current = CurrentAttempt(commits, hangs, observers, outbox, now)
    return current, outbox, commits, hangs, current.handlers()


def _start(current, attempt=0):
    assignments = [WorkerAssignment(rank=r, local_rank=0, world_size=2, node_id=f"n{r}", node_rank=r,
                                    local_world_size=1) for r in range(2)]
    current.start(attempt, assignments, NODES, LaunchSettings("e", "/run", b"", "gloo", 60.0, "", {}))


def _send(handlers, *events):
    for event in events:
        handlers[type(event)](event)


def test_start_places_the_group_and_tells_the_observers_and_end_is_told_once(tmp_path):
    told = RecordingObserver()
    current, outbox, commits, _, _ = _current(tmp_path, told)
    current.end(restarting=False)  # no attempt started: nothing to tell
    assert current.group is None and told.calls == []
    _start(current)
    assert sorted(outbox.agent_kinds(StartWorkers)) == ["n0", "n1"]
    [info] = told.named("on_attempt_start")
    assert info.attempt == 0 and info.hosts == ("host-n0", "host-n1") and commits.report_base == 0
    # each host's total memory, from its agent's hello: what the dashboard's node memory plot shows
    assert info.host_memory_bytes == {"host-n0": NODES["n0"].memory_bytes, "host-n1": NODES["n1"].memory_bytes}
    current.end(restarting=True)
    current.end(restarting=False)
    [end] = told.named("on_attempt_end")
    assert end.attempt == 0 and end.restarting and end.failures == ()


def test_events_of_another_attempt_are_stale_and_a_stale_worker_is_sent_away(tmp_path):
    current, outbox, _, _, handlers = _current(tmp_path)
    _send(handlers, ev.WorkerConnected(0, 0, 100, "h"))  # no attempt runs yet
    assert outbox.closed == [(0, 0)]
    _start(current, attempt=1)
    _send(handlers, ev.WorkerConnected(0, 1, 101, "h"), ev.WorkerPhaseChanged(0, 0, Phase.TRAINING),
          ev.WorkerConnected(1, 0, 200, "h"))
    assert outbox.closed == [(0, 0), (0, 1)]
    tracker = current.group.tracker
    assert tracker.ranks[0].connected and tracker.ranks[0].phase < Phase.TRAINING
    assert (1, 0) in outbox.worker_kinds(Assignment)


def test_reports_are_judged_one_by_one_and_move_the_commits_and_the_hang_clock(tmp_path):
    current, outbox, commits, hangs, handlers = _current(tmp_path, now=lambda: 50.0)
    _send(handlers, ev.ReportsReceived((ReportRecord(0, 0, 0, "{}", 1.0),)))  # no attempt: dropped
    _start(current)
    _send(handlers, *(ev.WorkerPhaseChanged(0, r, Phase.TRAINING) for r in range(2)))
    assert outbox.worker_kinds(PhaseAck) == [(0, 0), (0, 1)]
    _send(handlers, ev.ReportsReceived((ReportRecord(0, 0, 0, '{"a": 1}', 1.0), ReportRecord(3, 1, 0, "{}", 1.0),
                                        ReportRecord(0, 1, 0, '{"a": 2}', 1.0))))
    commits.persist()  # rank 0's metrics reach metrics.jsonl, the run's one record of them
    metrics_jsonl = read_metrics_history(Storage.for_run(str(tmp_path), "run"))
    assert [entry["metrics"] for entry in metrics_jsonl] == [{"a": 1}] and commits.report_base == 0
    assert commits.history.last_metrics == {"a": 1}
    assert [current.group.tracker.ranks[r].last_round for r in range(2)] == [0, 0]
    assert hangs.pace.slowest(0) is None  # told of the start and one report: no interval of its own yet
    _send(handlers, ev.WorkerDone(0, 0, reports=1), ev.WorkerDone(0, 1, reports=1))
    assert (0, 0) in outbox.worker_kinds(Release)  # every rank done: rank 0 may exit


def test_telemetry_is_told_with_host_pid_and_phase_and_stacks_are_told_and_kept(tmp_path):
    told = RecordingObserver()
    current, outbox, _, _, handlers = _current(tmp_path, told)
    _start(current)
    _send(handlers, ev.WorkerSpawned("n1", 0, 1, 4242), ev.WorkerPhaseChanged(0, 1, Phase.TRAINING))
    sample = TelemetrySample(attempt=0, rank=1, time=1.0, reports=0)
    _send(handlers, ev.TelemetryReceived(0, sample), ev.TelemetryReceived(0, TelemetrySample(0, 9, 1.0, 0)),
          ev.TelemetryReceived(5, sample))
    [decorated] = told.named("on_telemetry")
    assert (decorated.host, decorated.pid, decorated.phase, decorated.rank) == ("host-n1", 4242, "TRAINING", 1)
    _send(handlers, ev.StacksWanted(1))
    assert outbox.sent[-1] == ("agent", "n1", DumpStacks(0))
    _send(handlers, ev.StackDumped(0, 1, "stack"))
    [dump] = told.named("on_stacks")
    assert (dump.rank, dump.text) == (1, "stack")


def test_a_lost_node_fails_its_ranks_and_a_checkpoint_list_is_answered(tmp_path):
    current, outbox, _, _, handlers = _current(tmp_path)
    current.node_lost("n1", "gone")  # no attempt: nothing to fail
    _start(current)
    _send(handlers, ev.CheckpointsRequested(0, 0, 7, rounds=0))
    assert (0, 0) in outbox.worker_kinds(CheckpointList)
    current.node_lost("n1", "lease expired")
    [failure] = current.group.tracker.failures()
    assert isinstance(failure, WorkerFailure) and failure.rank == 1 and "lease expired" in failure.message
