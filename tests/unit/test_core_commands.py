"""The coordinator's core says what it wants done in command records (`minitrain.commands`), through an
`Outbox`: `WorkerGroup` and `Commits` are stepped here with a recording outbox (tests/controller_support.py),
without protobuf, processes or a server."""

from __future__ import annotations

from controller_support import RecordingOutbox

from minitrain import commands as cmd
from minitrain.config import CheckpointConfig
from minitrain.coordinator.facts import events as ev
from minitrain.coordinator.facts.attempt import AttemptTracker
from minitrain.coordinator.facts.commits import Commits
from minitrain.coordinator.facts.metrics_log import MetricsLog
from minitrain.coordinator.facts.worker_group import LaunchSettings, ResumePoint, WorkerGroup
from minitrain.records import NodeInfo, Phase, ReportRecord, WorkerAssignment
from minitrain.storage.checkpoint_manager import CheckpointManager
from minitrain.storage.filesystem import Storage


NODES = {"n0": NodeInfo(node_id="n0", hostname="host0", address="10.0.0.1", agent_pid=1, cpus=4, memory_bytes=1,
                        gpu_ids=(0, 1), ifname="eth0"),
         "n1": NodeInfo(node_id="n1", hostname="host1", address="10.0.0.2", agent_pid=2, cpus=4, memory_bytes=1)}
ASSIGNMENTS = [WorkerAssignment(0, 0, 3, 2, 0, "n0", (1,)), WorkerAssignment(1, 1, 3, 2, 0, "n0", (0,)),
               WorkerAssignment(2, 0, 3, 1, 1, "n1")]
SETTINGS = LaunchSettings("exp", "/runs/exp", b"payload", "gloo", 30.0, "/work", {"A": "1"}, relay=True)
RESUME = ResumePoint("checkpoint_000004", 5, ("checkpoint_000004",))


def start_group(outbox, now=lambda: 100.0):
    return WorkerGroup.start(1, ASSIGNMENTS, NODES, outbox, SETTINGS, RESUME, now)


def test_start_sends_each_node_its_workers_and_a_closed_node_is_lost():
    outbox = RecordingOutbox(gone={"n1"})
    group = start_group(outbox)
    (kind0, node0, start0), (kind1, node1, start1) = outbox.take()
    assert (kind0, node0, kind1, node1) == ("agent", "n0", "agent", "n1")
    assert start0 == cmd.StartWorkers(
        attempt=1, workers=(cmd.WorkerLaunch(0, 0), cmd.WorkerLaunch(1, 1)), cwd="/work",
        env={"A": "1", "GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1",
             "CUDA_VISIBLE_DEVICES": "0,1"}, relay=True, replicas=True)  # two nodes: their tiers replicate
    assert start1.workers == (cmd.WorkerLaunch(2, 0),) and start1.env == {"A": "1"}
    assert group.tracker.ranks[2].exited and not group.tracker.ranks[0].exited  # n1's rank is lost


def test_a_connected_worker_gets_its_assignment_then_the_rendezvous():
    outbox = RecordingOutbox()
    group = start_group(outbox)
    outbox.take()
    group.handle(ev.WorkerConnected(1, 1, pid=11, hostname="host0"))
    [(kind, address, assignment)] = outbox.take()
    assert (kind, address) == ("worker", (1, 1))
    assert assignment == cmd.Assignment(
        worker=ASSIGNMENTS[1], experiment_name="exp", backend="gloo", dist_timeout_s=30.0, payload=b"payload",
        store_address="10.0.0.1", storage_path="/runs/exp", initial_checkpoint_dir="checkpoint_000004",
        report_index_base=5, committed_dir_names=("checkpoint_000004",))
    group.handle(ev.StoreReady(1, "10.0.0.1", 29500))
    assert outbox.take() == [("worker", (1, 1), cmd.Rendezvous("10.0.0.1", 29500))]  # only the connected rank
    group.handle(ev.WorkerConnected(1, 0, pid=10, hostname="host0"))
    sent = outbox.take()
    assert [c for _, _, c in sent][1:] == [cmd.Rendezvous("10.0.0.1", 29500)]  # at once: the store is known
    group.handle(ev.WorkerPhaseChanged(1, 0, Phase.TRAINING))
    assert outbox.take() == [("worker", (1, 0), cmd.PhaseAck(Phase.TRAINING))]


def test_an_unknown_rank_or_one_connecting_after_the_stop_is_closed():
    outbox = RecordingOutbox()
    group = start_group(outbox)
    outbox.take()
    group.handle(ev.WorkerConnected(1, 7, pid=1, hostname="h"))
    assert outbox.take() == [("close", (1, 7), None)]
    group.stop(grace_s=5.0)
    assert sorted(outbox.take(), key=str) == [("agent", "n0", cmd.StopWorkers(1, 5.0)),
                                              ("agent", "n1", cmd.StopWorkers(1, 5.0))]
    group.handle(ev.WorkerConnected(1, 0, pid=1, hostname="h"))
    assert outbox.take() == [("close", (1, 0), None)]


def test_stop_stacks_fork_servers_release_and_close():
    outbox = RecordingOutbox()
    group = start_group(outbox)
    outbox.take()
    group.prepare_fork_servers()
    assert sorted(outbox.take(), key=str) == [("agent", "n0", cmd.PrepareForkServers(2)),
                                              ("agent", "n1", cmd.PrepareForkServers(1))]
    assert group.ask_stacks(2)
    assert outbox.take() == [("agent", "n1", cmd.DumpStacks(1))]
    group.collect_stacks()
    assert sorted(n for _, n, c in outbox.take() if c == cmd.DumpStacks(1)) == ["n0", "n1"]
    for rank in range(3):
        group.handle(ev.WorkerConnected(1, rank, pid=rank, hostname="h"))
    outbox.take()
    group.release_when_all_done()
    assert outbox.take() == []  # no rank is done yet
    for rank in range(3):
        group.handle(ev.WorkerDone(1, rank))
    group.release_when_all_done()
    assert outbox.take() == [("worker", (1, 0), cmd.Release())]
    outbox.gone = {"n1"}
    group.stop(grace_s=2.0)
    assert sorted(outbox.take(), key=str) == [("agent", "n0", cmd.StopWorkers(1, 2.0)),
                                              ("agent", "n1", cmd.StopWorkers(1, 2.0))]
    group.close_streams()
    # n1 is lost, and its rank's stream is closed too: a rank of a lost node may be frozen, not gone.
    assert group.tracker.ranks[2].exited
    assert sorted(a for kind, a, _ in outbox.take() if kind == "close") == [(1, 0), (1, 1), (1, 2)]


def _commits(tmp_path, outbox, world):
    storage = Storage.for_run(str(tmp_path), "run")
    storage.makedirs()
    commits = Commits(CheckpointManager.load(storage, CheckpointConfig()), MetricsLog(storage), outbox,
                      clock=lambda: 50.0)
    commits.start_attempt(world)
    tracker = AttemptTracker.create(0, [WorkerAssignment(r, r, world, world, 0, "n0") for r in range(world)],
                                    {"n0": "host0"})
    return commits, tracker, storage


def test_commits_sends_receipts_and_acknowledges_a_checkpoint_round_once_committed(tmp_path):
    outbox = RecordingOutbox()
    commits, tracker, storage = _commits(tmp_path, outbox, world=2)
    commits.on_reports(tracker, [ReportRecord(0, 0, 0, '{"loss": 1.0}', 1.0, wants_receipt=True),
                                 ReportRecord(0, 1, 0, '{"loss": 2.0}', 1.0)])
    assert outbox.take() == [("worker", (0, 0), cmd.ReportReceipt(0))]
    storage.fs.makedirs(storage.path("ckpt_a"), exist_ok=True)
    commits.on_reports(tracker, [ReportRecord(0, 0, 1, '{"loss": 0.5}', 2.0, "ckpt_a", wants_ack=True)])
    assert outbox.take() == []  # rank 1 has not reported round 1: nothing is committed
    commits.on_reports(tracker, [ReportRecord(0, 1, 1, '{"loss": 0.6}', 2.0, "ckpt_a", wants_ack=True)])
    assert outbox.take() == [("worker", (0, 0), cmd.ReportAck(1)), ("worker", (0, 1), cmd.ReportAck(1))]
    assert [r.dir_name for r in commits.checkpoints.records] == ["ckpt_a"]


def test_commits_answers_a_checkpoint_list_once_the_asking_ranks_rounds_are_processed(tmp_path):
    outbox = RecordingOutbox()
    commits, tracker, storage = _commits(tmp_path, outbox, world=1)
    commits.request_checkpoint_list(ev.CheckpointsRequested(0, 0, request_id=3, rounds=1))
    assert outbox.take() == []  # round 0 is not processed yet
    storage.fs.makedirs(storage.path("ckpt_a"), exist_ok=True)
    commits.on_reports(tracker, [ReportRecord(0, 0, 0, '{"loss": 0.5}', 2.0, "ckpt_a", wants_ack=True)])
    assert outbox.take() == [("worker", (0, 0), cmd.ReportAck(0)),
                             ("worker", (0, 0), cmd.CheckpointList(3, (cmd.CheckpointEntry("ckpt_a", {"loss": 0.5}),)))]
