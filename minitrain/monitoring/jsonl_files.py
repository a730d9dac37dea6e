"""JSON-lines files of the run directory: appended on a thread of their own, and read back.

The run monitor writes its events.jsonl and telemetry.jsonl through a `JsonlAppender` (at most every
FLUSH_S seconds, and when the run ends) and rebuilds its record from them with `read_jsonl`.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any, Optional

logger = logging.getLogger("minitrain")

FLUSH_S = 1.0  # the longest a line waits before it is written

_ENCODER = json.JSONEncoder(default=str)  # json.dumps(entry, default=str), without a new encoder per line


class JsonlAppender:
    """Appends JSON lines to files of the run directory on a thread of its own; gives up (logging
    once) at the first failure. Entries are encoded on that thread, not the caller's (the controller's
    thread feeds thousands of telemetry samples a second at scale), so an entry must not be changed
    once added."""

    def __init__(self, storage: Any):
        self._storage = storage
        self._pending: dict[str, list[dict]] = {}
        self._cond = threading.Condition()
        self._closing = False
        self._failed = False
        self._thread: Optional[threading.Thread] = None

    def add(self, name: str, entry: dict) -> None:
        """Queue one line for file `name`: `entry` as JSON (values it cannot encode as their str())."""
        if self._storage is None or self._failed:
            return
        with self._cond:
            pending = self._pending.get(name)
            if pending is None:
                pending = self._pending[name] = []
            pending.append(entry)
            if self._thread is None and not self._closing:
                self._thread = threading.Thread(target=self._run, name="minitrain-monitor-writer", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait(FLUSH_S)
                closing = self._closing
            self._flush()
            if closing:
                return

    def _flush(self) -> None:
        with self._cond:
            pending, self._pending = self._pending, {}
        for name, entries in pending.items():
            if self._failed:
                return
            try:
                self._storage.append_text(name, "".join([_ENCODER.encode(entry) + "\n" for entry in entries]))
            except Exception as exc:  # noqa: BLE001 - the record is optional; the run is not
                self._failed = True
                logger.warning("could not write %s (%s); the run goes on, its monitoring history is kept in "
                               "memory only", self._storage.url(name), exc)

    def close(self, timeout_s: float = 30.0) -> None:
        """Write what is queued and stop the thread."""
        with self._cond:
            self._closing = True
            thread = self._thread
            self._cond.notify_all()
        if thread is not None:
            thread.join(timeout_s)
        else:
            self._flush()


def read_jsonl(storage: Any, name: str) -> list[dict]:
    """The intact lines of a JSON-lines file of the run directory (a torn last line is ignored)."""
    if not storage.exists(name):
        return []
    text = storage.read_text(name)
    entries = []
    for line in text[:text.rfind("\n") + 1].splitlines():
        if line.strip():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict):
                entries.append(entry)
    return entries
