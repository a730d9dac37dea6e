"""`Commits`' storage chores around the attempts: a failure to save the run's history or to delete what
earlier attempts left uncommitted is logged, never raised (the run's own outcome matters more); rank 0's
reports go to metrics.jsonl and leave no growing record in the driver."""

from __future__ import annotations

import logging
import tracemalloc

from minitrain.config import CheckpointConfig
from minitrain.coordinator.facts.attempt import AttemptTracker
from minitrain.coordinator.facts.commits import Commits
from minitrain.coordinator.facts.metrics_log import MetricsLog, read_metrics_history
from minitrain.records import ReportRecord, WorkerAssignment
from minitrain.storage.checkpoint_manager import CheckpointManager
from minitrain.storage.filesystem import Storage


class Book:
    """A checkpoint book whose storage fails on `save` and `delete_garbage` when told to."""

    report_index, latest, records, committed_dir_names = 0, None, (), set()

    def __init__(self, fail: bool, garbage=()):
        self.fail, self.garbage, self.saved = fail, list(garbage), 0

    def save(self):
        if self.fail:
            raise OSError("disk full")
        self.saved += 1

    def delete_garbage(self):
        if self.fail:
            raise OSError("permission denied")
        return self.garbage


class Log:
    def flush(self):
        pass


def test_a_failure_to_save_or_to_delete_is_logged_and_the_run_goes_on(caplog):
    commits = Commits(Book(fail=True), Log(), outbox=None)
    with caplog.at_level(logging.INFO, logger="minitrain"):
        commits.persist()
        commits.delete_uncommitted()
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("ERROR", "could not save the run's metrics history or index: disk full"),
        ("WARNING", "could not delete the uncommitted uploads of earlier attempts (permission denied); the next "
                    "attempt deletes them")]


def test_what_was_deleted_is_said_and_the_index_saved(caplog):
    book = Book(fail=False, garbage=["checkpoint_000003", ".staging"])
    commits = Commits(book, Log(), outbox=None)
    with caplog.at_level(logging.INFO, logger="minitrain"):
        commits.persist()
        commits.delete_uncommitted()
    assert book.saved == 1
    assert [r.getMessage() for r in caplog.records] == [
        "removed what earlier attempts left uncommitted: checkpoint_000003, .staging"]


def _report_batches(count: int, start: int = 0, batch: int = 1000):
    """`count` rank-0 reports of a one-rank attempt from round `start` on, in batches as a relay sends them."""
    for first in range(start, start + count, batch):
        yield tuple(ReportRecord(0, 0, r, '{"loss": 0.5, "step": %d}' % r, 1.0) for r in range(first, first + batch))


def test_rank_0_reports_leave_the_driver_s_memory_flat(tmp_path):
    """Every rank-0 report is written to metrics.jsonl and only the latest kept in the driver: of what the
    commit path allocates for reports 10,000 to 100,000, less than 1 MiB is still held after them (a list of
    every report's metrics held ~30 MB). Traced from the 10,000th report on: tracing costs the whole test
    most of its time."""
    storage = Storage.for_run(str(tmp_path), "run")
    storage.makedirs()
    commits = Commits(CheckpointManager.load(storage, CheckpointConfig()), MetricsLog(storage), outbox=None)
    commits.start_attempt(world_size=1)
    tracker = AttemptTracker.create(0, [WorkerAssignment(0, 0, 1, 1, 0, "n0")], {"n0": "h0"})
    for reports in _report_batches(10_000):
        commits.on_reports(tracker, reports)
    tracemalloc.start()
    try:
        for reports in _report_batches(90_000, start=10_000):
            commits.on_reports(tracker, reports)
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    commits.persist()
    assert commits.history.last_metrics == {"loss": 0.5, "step": 99_999}
    assert commits.checkpoints.report_index == 100_000  # every report completed its round
    assert len(read_metrics_history(storage)) == 100_000
    assert held < 1 << 20, f"{held} bytes still held of what 90,000 more reports allocated"


def test_progress_is_a_round_beyond_the_furthest_committed_and_rounds_redone_after_a_resume_are_not(tmp_path):
    """An attempt resumes from the latest checkpoint: its round r is the step after the checkpoint's plus r,
    whatever the run-wide round numbers (which only grow) say. Only a round past the furthest step any
    attempt committed before is progress."""
    storage = Storage.for_run(str(tmp_path), "run")
    storage.makedirs()
    commits = Commits(CheckpointManager.load(storage, CheckpointConfig()), MetricsLog(storage), outbox=None)

    def attempt(number: int, *rounds: int, checkpoint_at: int = -1) -> bool:
        """Attempt `number` commits `rounds` (one rank), a checkpoint with round `checkpoint_at`."""
        commits.start_attempt(world_size=1)
        tracker = AttemptTracker.create(number, [WorkerAssignment(0, 0, 1, 1, 0, "n0")], {"n0": "h0"})
        for r in rounds:
            name = ""
            if r == checkpoint_at:  # written in place, as NO_UPLOAD does
                name = f"checkpoint_a{number}_r{r}"
                (tmp_path / "run" / name).mkdir()
                (tmp_path / "run" / name / "state").write_text(str(r))
            commits.on_reports(tracker, (ReportRecord(number, 0, r, "{}", 1.0, checkpoint_dir_name=name),))
        return commits.progressed

    assert attempt(0, 0, 1, 2, 3, 4, checkpoint_at=1)  # steps 0-4, a checkpoint after step 1
    assert commits.last_round == 4
    assert not attempt(1)  # failed before its first report
    assert not attempt(2, 0, 1, 2)  # resumed after step 1: steps 2-4 again
    assert commits.last_round == 7  # (run-wide numbers go on)
    assert attempt(3, 0, 1, 2, 3)  # steps 2-5: step 5 is new
    assert attempt(4, 0, 1, 2, 3, 4, checkpoint_at=2)  # steps 2-6, a checkpoint after step 4
    assert not attempt(5, 0, 1)  # resumed after step 4: steps 5-6 again
    assert attempt(6, 0, 1, 2)  # steps 5-7
