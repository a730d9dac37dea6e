"""Integrity end to end: every report that returned is kept, and the run directory belongs to the run.

Each test is a regression test of one way a run could lose committed work or touch the user's files
(2 gloo workers on CPU, real agents and workers, storage under tmp_path).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

import minitrain
from minitrain import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from minitrain.errors import ConfigError, WorkerGroupError
from minitrain.storage.layout import INDEX_NAME, METRICS_NAME
from minitrain.storage.run_lock import RunLockedError
from minitrain.torch import TorchTrainer

from integrity_training import (GatedSlowFileSystem, checkpoint_with_linked_dir, freeze_agent_during_upload,
                                list_after_own_reports, report_epochs, report_then_fail, returned_everywhere,
                                tree_digest)

pytestmark = pytest.mark.e2e


def _trainer(fn, storage_path, name="run", config=None, max_failures=0, **run_kwargs):
    return TorchTrainer(fn, train_loop_config=config or {}, scaling_config=ScalingConfig(num_workers=2),
                        run_config=RunConfig(name=name, storage_path=str(storage_path),
                                             failure_config=FailureConfig(max_failures=max_failures),
                                             **run_kwargs))


def _index(run_path) -> dict:
    return json.loads(open(os.path.join(run_path, INDEX_NAME)).read())


def _metrics_lines(run_path) -> list[dict]:
    return [json.loads(line) for line in open(os.path.join(run_path, METRICS_NAME)).read().splitlines()]


def _wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


# ---------------------------------------------------------------------------------- reports that returned


@pytest.mark.parametrize("end", ["raise", "exit", "raise_rank1"])
def test_every_report_that_returned_on_every_rank_is_committed_when_a_failure_follows_at_once(tmp_path, end):
    # Both ranks report 10 times and fail 0 ms after the last report() returned (on every
    # rank, or on rank 1 alone while rank 0 is still reporting).
    notes = tmp_path / "notes"
    notes.mkdir()
    with pytest.raises(WorkerGroupError):
        _trainer(report_then_fail, tmp_path, config={"end": end, "notes": str(notes)}).fit()
    returned = returned_everywhere(str(notes))
    if end != "raise_rank1":
        assert returned == set(range(10))
    run = tmp_path / "run"
    index = _index(run)
    committed = {r["checkpoint_dir_name"] for r in index["checkpoint_results"]}
    assert committed >= {f"checkpoint_{i:06d}" for i in returned if i % 2 == 1}
    assert index["current_report_index"] >= len(returned)
    logged = [entry["metrics"]["i"] for entry in _metrics_lines(run)]
    assert logged == sorted(logged) and set(logged) >= returned
    checkpoint_rounds = [i for i in returned if i % 2 == 1]
    if checkpoint_rounds:  # a later round may be committed too: its report reached the coordinator
        latest = minitrain.Result.from_path(str(run)).checkpoint
        step = int(os.path.basename(latest.path).removeprefix("checkpoint_"))
        assert step >= max(checkpoint_rounds)
        assert open(os.path.join(latest.path, "step.txt")).read() == str(step)
    assert not os.path.exists(run / ".staging")  # nothing uncommitted was left behind


def test_get_all_reported_checkpoints_waits_for_the_callers_own_reports(tmp_path):
    # Rank 1 asks right after 3 fast reports; rank 0's slow checkpoints must be in the answer.
    result = _trainer(list_after_own_reports, tmp_path).fit()
    assert [os.path.basename(c.path) for c, _ in result.best_checkpoints] == ["checkpoint_000001",
                                                                              "checkpoint_000002"]


def test_a_resumed_run_with_nothing_left_to_do_returns_the_latest_committed_metrics(tmp_path):
    first = _trainer(report_epochs, tmp_path, config={"epochs": 3}).fit()
    assert first.metrics == {"epoch": 2, "loss": 1.0 / 3}
    again = _trainer(report_epochs, tmp_path, config={"epochs": 3}).fit()
    assert again.metrics == {"epoch": 2, "loss": 1.0 / 3}
    assert os.path.basename(again.checkpoint.path) == "checkpoint_000002"


# ---------------------------------------------------------------------------------- fencing


def test_a_late_write_of_a_lost_nodes_rank_never_lands_in_a_committed_checkpoint(tmp_path):
    # Rank 0 freezes its agent (SIGSTOP), then writes checkpoint round 1 to storage that
    # stalls. The node is declared lost, the next attempt commits a checkpoint of the same name, and
    # only then does the old rank's write go through: the committed files must be the new attempt's.
    marker = str(tmp_path / "frozen_agent")
    fs = GatedSlowFileSystem(writer_file=marker + ".writer", committed_name="checkpoint_000001",
                             index_path=str(tmp_path / "results" / "run" / INDEX_NAME))
    # Without a memory tier the worker writes to storage itself, which is what this test freezes.
    trainer = _trainer(freeze_agent_during_upload, tmp_path / "results", config={"marker": marker, "files": 6},
                       max_failures=1, storage_filesystem=fs,
                       checkpoint_config=CheckpointConfig(memory_tier_bytes=0))
    try:
        result = trainer.fit()
        run = tmp_path / "results" / "run"
        committed = {r["checkpoint_dir_name"]: r for r in _index(run)["checkpoint_results"]}
        assert set(committed) == {"checkpoint_000000", "checkpoint_000001", "checkpoint_000002"}
        assert result.metrics == {"epoch": 1, "writer": "later attempt"}
        _wait_for(lambda: os.path.exists(marker + ".late_write_done"), 60, "the frozen node's late write")
        digests = {name: tree_digest(str(run / name)) for name in committed}
        assert set(digests["checkpoint_000001"]) == {"epoch.txt"}  # the later attempt's epoch 0, alone
        parts = {open(run / "checkpoint_000002" / f).read() for f in digests["checkpoint_000002"]}
        assert parts == {f"later attempt part {n}" for n in range(6)}
        # The late write is over (its marker exists): the committed checkpoints never changed.
        assert {name: tree_digest(str(run / name)) for name in committed} == digests
    finally:
        if os.path.exists(marker):  # let the frozen agent go: it finds its lease gone and exits
            agent = int(open(marker).read())
            try:
                os.kill(agent, signal.SIGCONT)
                psutil.Process(agent).wait(timeout=30)
            except (ProcessLookupError, psutil.NoSuchProcess):
                pass


# ---------------------------------------------------------------------------------- ownership


def test_a_directory_holding_the_users_files_is_refused_and_left_untouched(tmp_path):
    # RunConfig(name="myproject") where parent/myproject already holds a project.
    project = tmp_path / "myproject"
    (project / ".git").mkdir(parents=True)
    (project / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (project / "images").mkdir()
    (project / "images" / "cat.png").write_bytes(b"\x89PNG")
    with pytest.raises(ConfigError, match="not a minitrain run") as info:
        _trainer(report_epochs, tmp_path, name="myproject", config={"epochs": 1}).fit()
    assert str(project) in str(info.value) and ".git" in str(info.value)
    assert sorted(os.listdir(project)) == [".git", "images"]
    assert (project / "images" / "cat.png").read_bytes() == b"\x89PNG"


def test_a_symlinked_run_directory_is_refused(tmp_path):
    victim = tmp_path / "someone_elses"
    (victim / "data").mkdir(parents=True)
    (tmp_path / "shared").mkdir()
    os.symlink(victim, tmp_path / "shared" / "run")
    with pytest.raises(ConfigError, match="symbolic link"):
        _trainer(report_epochs, tmp_path / "shared", config={"epochs": 1}).fit()
    assert os.listdir(victim) == ["data"]


def test_a_users_directory_inside_a_run_survives_failures_and_resumes(tmp_path):
    _trainer(report_epochs, tmp_path, config={"epochs": 1}).fit()
    notes = tmp_path / "run" / "my_notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("keep me")
    with pytest.raises(WorkerGroupError):
        _trainer(report_epochs, tmp_path, config={"epochs": 3, "fail_after": 1}).fit()
    result = _trainer(report_epochs, tmp_path, config={"epochs": 3}).fit()
    assert result.metrics["epoch"] == 2
    assert (notes / "todo.txt").read_text() == "keep me"


def test_a_symlinked_directory_inside_a_checkpoint_is_copied(tmp_path):
    # For SYNC and ASYNC uploads.
    for mode in ("SYNC", "ASYNC"):
        result = _trainer(checkpoint_with_linked_dir, tmp_path, name=f"linked_{mode}", config={"mode": mode}).fit()
        files = tree_digest(result.checkpoint.path)
        assert set(files) == {"model.txt", "shards/shard0.bin", "shards/deeper/shard1.bin"}, mode
        assert not os.path.islink(os.path.join(result.checkpoint.path, "shards"))


# ---------------------------------------------------------------------------------- crash consistency


def test_a_torn_metrics_line_is_repaired_on_resume(tmp_path, caplog):
    # The driver died in the middle of an append (the torn line has no newline).
    _trainer(report_epochs, tmp_path, config={"epochs": 2}).fit()
    metrics = tmp_path / "run" / METRICS_NAME
    with open(metrics, "a") as handle:
        handle.write('{"metrics": {"epoch": 2, "lo')
    assert minitrain.Result.from_path(str(tmp_path / "run")).metrics == {"epoch": 1, "loss": 0.5}
    result = _trainer(report_epochs, tmp_path, config={"epochs": 4}).fit()
    assert [entry["metrics"]["epoch"] for entry in _metrics_lines(tmp_path / "run")] == [0, 1, 2, 3]
    assert result.metrics == {"epoch": 3, "loss": 0.25}
    assert "torn line" in caplog.text


# ---------------------------------------------------------------------------------- one run at a time


_DRIVER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    from integrity_training import report_epochs
    from minitrain import RunConfig, ScalingConfig
    from minitrain.torch import TorchTrainer
    TorchTrainer(report_epochs, train_loop_config={{"epochs": 2, "wait_for": {gate!r}}},
                 scaling_config=ScalingConfig(num_workers=2),
                 run_config=RunConfig(name="run", storage_path={storage!r})).fit()
    print("FIRST RUN DONE")
""")


def test_a_second_fit_of_the_same_run_is_refused_and_a_dead_drivers_lock_is_taken_over(tmp_path):
    # Two fit() calls with the same (storage_path, name).
    gate = tmp_path / "gate"
    script = _DRIVER.format(tests=os.path.dirname(__file__), gate=str(gate), storage=str(tmp_path))
    first = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    try:
        _wait_for(lambda: os.path.exists(tmp_path / "run" / "checkpoint_000000"), 120, "the first run's commit")
        with pytest.raises(RunLockedError) as info:
            _trainer(report_epochs, tmp_path, config={"epochs": 1}).fit()
        assert f"pid {first.pid}" in str(info.value) and str(tmp_path / "run") in str(info.value)
        gate.write_text("go")
        output, _ = first.communicate(timeout=120)
        assert first.returncode == 0 and "FIRST RUN DONE" in output, output
    finally:
        first.kill()
        first.wait()
    assert [r["checkpoint_dir_name"] for r in _index(tmp_path / "run")["checkpoint_results"]] == [
        "checkpoint_000000", "checkpoint_000001"]

    gate.unlink()  # a driver SIGKILLed mid-run leaves its lock file: the next fit() takes it over
    second = subprocess.Popen([sys.executable, "-c", script.replace('"epochs": 2', '"epochs": 4')])
    try:
        _wait_for(lambda: os.path.exists(tmp_path / "run" / "checkpoint_000002"), 120, "the second run's commit")
    finally:
        second.kill()
        second.wait()
    result = _trainer(report_epochs, tmp_path, config={"epochs": 4}).fit()
    assert result.metrics["epoch"] == 3
