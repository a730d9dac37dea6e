"""The local mirror of an in-process (memory://) run directory (minitrain.storage.mirror)."""

from __future__ import annotations

import glob
import os
import tempfile
import uuid

import pytest
from fsspec.implementations.memory import MemoryFileSystem

from minitrain.storage.filesystem import Storage, StorageError
from minitrain.storage.mirror import lives_in_this_process, local_mirror


class _UnreadableMemory(MemoryFileSystem):
    """A memory filesystem whose files cannot be read back (a download fails half-way)."""

    def get_file(self, *args, **kwargs):
        raise OSError("injected read failure")


@pytest.fixture
def base():
    path = f"/minitrain-mirror-{uuid.uuid4().hex}"
    yield path
    fs = MemoryFileSystem()
    if fs.exists(path):
        fs.rm(path, recursive=True)


def _staging_dirs() -> set[str]:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "minitrain_memory_run_*")))


def test_the_run_works_on_a_copy_that_replaces_the_memory_run_directory(base):
    storage = Storage.for_run(f"memory://{base}", "run")
    assert lives_in_this_process(storage) and not lives_in_this_process(Storage.for_run("/tmp", "run"))
    storage.write_text_atomic("old/kept.txt", "1")
    storage.write_text_atomic("evicted/gone.txt", "2")
    before = _staging_dirs()
    with local_mirror(storage) as local:
        assert local.is_local and local.read_text("old/kept.txt") == "1"
        local.remove_tree("evicted")
        local.write_text_atomic("new/made.txt", "3")
        assert not storage.exists("new/made.txt")  # published on exit only
    assert storage.read_text("old/kept.txt") == "1" and storage.read_text("new/made.txt") == "3"
    assert not storage.exists("evicted")
    assert _staging_dirs() == before


def test_a_failed_copy_leaves_the_memory_run_directory_as_it_was(base):
    storage = Storage(_UnreadableMemory(), f"{base}/run")
    storage.write_text_atomic("checkpoint_000000/state.txt", "committed")
    before = _staging_dirs()
    with pytest.raises(StorageError, match="injected read failure"):
        with local_mirror(storage):
            pytest.fail("the run must not start on an incomplete copy")
    assert storage.read_text("checkpoint_000000/state.txt") == "committed"
    assert _staging_dirs() == before
