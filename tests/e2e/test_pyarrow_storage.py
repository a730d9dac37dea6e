"""A real fit() on storage given as a pyarrow filesystem, as Ray's storage guide writes it.

2 gloo workers on CPU report a checkpoint each round; the filesystem object crosses to the workers
pickled, the coordinator commits through it, and what comes back (`Result.filesystem`,
`Checkpoint.filesystem`, in the driver and in the workers) answers Ray's documented pyarrow calls.
"""

from __future__ import annotations

import os
import tempfile

import pytest
from fsspec.implementations.local import LocalFileSystem

import minitrain
from minitrain import RunConfig, ScalingConfig
from minitrain.torch import TorchTrainer

pafs = pytest.importorskip("pyarrow.fs")
pytestmark = pytest.mark.e2e


def train_reports_two_checkpoints(config):
    import pyarrow.fs

    rank = minitrain.get_context().get_world_rank()
    for step in range(2):
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, f"rank{rank}.txt"), "w") as handle:
                handle.write(str(step))
            minitrain.report({"step": step}, checkpoint=minitrain.Checkpoint.from_directory(tmp))
    # In the worker, the persisted checkpoint's filesystem is the pyarrow one the driver was given.
    checkpoint = minitrain.get_checkpoint()
    assert isinstance(checkpoint.filesystem, pyarrow.fs.FileSystem), type(checkpoint.filesystem)
    assert checkpoint.filesystem.get_file_info(f"{checkpoint.path}/rank{rank}.txt").size == 1


@pytest.mark.parametrize("kind", ["pyarrow-local", "fsspec-handler", "subtree"])
def test_fit_on_a_pyarrow_storage_filesystem(tmp_path, kind):
    results = tmp_path / "results"
    results.mkdir()
    given, storage_path = {
        "pyarrow-local": (pafs.LocalFileSystem(), str(results)),
        # Ray's storage guide: an fsspec filesystem wrapped for pyarrow.
        "fsspec-handler": (pafs.PyFileSystem(pafs.FSSpecHandler(LocalFileSystem())), str(results)),
        "subtree": (pafs.SubTreeFileSystem(str(results), pafs.LocalFileSystem()), "runs"),
    }[kind]
    result = TorchTrainer(train_reports_two_checkpoints, scaling_config=ScalingConfig(num_workers=2),
                          run_config=RunConfig(name="arrow", storage_path=storage_path,
                                               storage_filesystem=given)).fit()

    assert result.metrics == {"step": 1}
    assert result.filesystem is given and result.checkpoint.filesystem is given
    # Ray's docs: list the run directory and copy the checkpoint out, through pyarrow.
    listed = result.filesystem.get_file_info(pafs.FileSelector(result.path, recursive=True))
    assert {"checkpoint_manager_snapshot.json", "metrics.jsonl"} <= {info.base_name for info in listed}
    local = tmp_path / "downloaded"
    local.mkdir()
    pafs.copy_files(result.checkpoint.path, str(local), source_filesystem=result.checkpoint.filesystem)
    assert sorted(os.listdir(local)) == ["rank0.txt", "rank1.txt"]
    assert (local / "rank1.txt").read_text() == "1"
    on_disk = results / "runs" / "arrow" if kind == "subtree" else results / "arrow"
    assert sorted(d for d in os.listdir(on_disk) if d.startswith("checkpoint_0")) == [
        "checkpoint_000000", "checkpoint_000001"]


def test_fit_on_default_storage_hands_back_pyarrow_filesystems(tmp_path):
    """No storage_filesystem given (a plain local storage_path): Ray's `result.filesystem.get_file_info(...)`
    and `open_input_file(...)` still work, because what is handed back is pyarrow's LocalFileSystem, in the
    driver and in the workers (the training function asserts it), as Ray hands back."""
    result = TorchTrainer(train_reports_two_checkpoints, scaling_config=ScalingConfig(num_workers=2),
                          run_config=RunConfig(name="plain", storage_path=str(tmp_path / "results"))).fit()

    assert result.metrics == {"step": 1}
    assert type(result.filesystem) is pafs.LocalFileSystem
    assert type(result.checkpoint.filesystem) is pafs.LocalFileSystem
    assert all(type(c.filesystem) is pafs.LocalFileSystem for c, _ in result.best_checkpoints)
    # Ray's "Inspecting results" guide: walk the run directory through result.filesystem.
    listed = result.filesystem.get_file_info(pafs.FileSelector(result.path, recursive=True))
    assert {"checkpoint_manager_snapshot.json", "metrics.jsonl", "rank1.txt"} <= {i.base_name for i in listed}
    with result.filesystem.open_input_file(f"{result.checkpoint.path}/rank0.txt") as handle:
        assert handle.read() == b"1"
    with result.checkpoint.as_directory() as local:  # unchanged: the checkpoint directory itself
        assert sorted(os.listdir(local)) == ["rank0.txt", "rank1.txt"]
