"""The run directory's JSON-lines files (monitoring/jsonl_files.py): lines appended on the writer's
thread arrive whole and in order, a torn last line is not read back, and a storage that fails is
given up on with one warning."""

from __future__ import annotations

import logging
import threading
from pathlib import PurePosixPath

from minitrain.monitoring.jsonl_files import JsonlAppender, read_jsonl
from minitrain.storage.filesystem import Storage


def test_lines_are_written_in_order_and_a_torn_last_line_is_not_read(tmp_path):
    storage = Storage.for_run(str(tmp_path), "run")
    storage.makedirs()
    appender = JsonlAppender(storage)
    for i in range(3):
        appender.add("events.jsonl", {"i": i})
    appender.add("other.jsonl", {"path": PurePosixPath("/a/b")})  # not JSON: written as its str()
    appender.close()
    storage.append_text("events.jsonl", '[1]\n{"torn": ')
    assert read_jsonl(storage, "events.jsonl") == [{"i": i} for i in range(3)]  # not the list, not the torn line
    assert read_jsonl(storage, "other.jsonl") == [{"path": "/a/b"}] and read_jsonl(storage, "absent.jsonl") == []


class Failing:
    def __init__(self):
        self.calls = 0

    def append_text(self, name, text):
        self.calls += 1
        raise OSError("read-only file system")

    def url(self, name):
        return f"mem://{name}"


def test_a_failing_storage_is_given_up_on_with_one_warning(caplog):
    storage = Failing()
    appender = JsonlAppender(storage)
    with caplog.at_level(logging.WARNING, logger="minitrain"):
        appender.add("a.jsonl", {"n": 1})
        appender.add("b.jsonl", {"n": 2})
        appender.close()
        appender.add("a.jsonl", {"n": 3})  # after the failure: dropped at once
    assert storage.calls == 1
    [warning] = caplog.records
    assert "could not write mem://a.jsonl (read-only file system)" in warning.getMessage()


def test_without_storage_nothing_is_written(caplog):
    # Nothing is queued, so no writer thread starts, and nothing fails to be written.
    before = set(threading.enumerate())
    appender = JsonlAppender(None)
    with caplog.at_level(logging.WARNING, logger="minitrain"):
        appender.add("a.jsonl", {"n": 1})
        started = [t for t in set(threading.enumerate()) - before if t.name == "minitrain-monitor-writer"]
        appender.close()
    assert started == [] and caplog.records == []
