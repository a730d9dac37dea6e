"""A local filesystem whose uploads are slow: each file put waits `delay_s` first.

It lives in its own module so worker processes can import it by reference when they unpickle the
run's storage.
"""

from __future__ import annotations

import time

from fsspec.implementations.local import LocalFileSystem


class SlowLocalFileSystem(LocalFileSystem):
    """LocalFileSystem with a delay before every `put_file` (a slow link to storage)."""

    def __init__(self, delay_s: float = 0.5, **kwargs):
        super().__init__(**kwargs)
        self.delay_s = delay_s

    def put_file(self, lpath, rpath, **kwargs):
        time.sleep(self.delay_s)
        return super().put_file(lpath, rpath, **kwargs)
