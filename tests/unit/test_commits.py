"""`Commits`' storage chores around the attempts: a failure to save the run's history or to delete what
earlier attempts left uncommitted is logged, never raised (the run's own outcome matters more)."""

from __future__ import annotations

import logging

from minitrain.coordinator.facts.commits import Commits


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
