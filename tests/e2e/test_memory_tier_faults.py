"""The memory tier end to end: its promises under faults (2 gloo workers on CPU, real agents and workers).

A reported checkpoint goes to its node agent's memory tier first and reaches storage through the agent
(minitrain/storage/memory_tier.py, minitrain/agent/tier_keeper.py, minitrain/coordinator/facts/durability.py).
Each test tries to break one promise:
- a report that returned on every rank is committed, SYNC and ASYNC: a rank SIGKILLed 0 ms later costs
  nothing, the restart reads that round back from the tier, and the round becomes durable;
- a full tier falls back to uploads with one warning per worker, and fit() returns only once the last
  round committed in memory is durable;
- a storage outage during the agent's persistence fails the run naming the checkpoint and its round;
- an agent SIGKILLed while it persists loses its round by name, and the next agent sweeps its tier;
- a driver SIGKILLed before a round was durable: the next fit() resumes from the latest durable round.

Each test points MINITRAIN_MEMORY_TIER_DIR at its own directory (local agents and their workers inherit
the driver's environment): where a checkpoint was read from, what a dead agent left, and which processes
belong to the test can then be seen. The storage faults are fsspec filesystems of
tests/e2e/memory_tier_training.py, which the agents import when they unpickle the run's storage.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import re
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

import minitrain
from minitrain import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from minitrain.procs import wait_until_gone
from minitrain.storage.layout import INDEX_NAME, STAGING_DIR
from minitrain.torch import TorchTrainer

from memory_tier_training import (GatedFileSystem, die_during_the_copy_into_the_tier, OutageFileSystem, die_right_after_reports, hold_after_round,
                                  kill_the_persisting_agent, read_checkpoint, report_rounds, shard_text)

pytestmark = pytest.mark.e2e
ROOT = pathlib.Path(__file__).resolve().parents[2]
E2E = pathlib.Path(__file__).resolve().parent


def _processes_of(tiers: pathlib.Path) -> list[psutil.Process]:
    """The live processes (agents, fork servers, workers, a driver) started with this test's tier directory."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.pid != os.getpid() and process.status() != psutil.STATUS_ZOMBIE and \
                    process.environ().get("MINITRAIN_MEMORY_TIER_DIR") == str(tiers):
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


@pytest.fixture
def tiers(tmp_path, monkeypatch):
    """This test's memory-tier directory. Whatever a failed test left running is ended by pid afterwards."""
    path = tmp_path / "tiers"
    path.mkdir()
    monkeypatch.setenv("MINITRAIN_MEMORY_TIER_DIR", str(path))
    yield path
    for process in _processes_of(path):
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass


def _trainer(fn, storage_path, config, max_failures=0, **run_kwargs):
    return TorchTrainer(fn, train_loop_config=config, scaling_config=ScalingConfig(num_workers=2),
                        run_config=RunConfig(name="run", storage_path=str(storage_path),
                                             failure_config=FailureConfig(max_failures=max_failures),
                                             **run_kwargs))


def _named(run: pathlib.Path) -> list[str]:
    """The checkpoint directories the run's index names, oldest first."""
    index = json.loads((run / INDEX_NAME).read_text())
    return [entry["checkpoint_dir_name"] for entry in index["checkpoint_results"]]


def _both_ranks(round_: int) -> dict:
    return {f"rank{rank}.txt": shard_text(round_, rank) for rank in (0, 1)}


def _assert_consistent(run: pathlib.Path) -> None:
    """Every checkpoint the index names is on storage with both ranks' files of its round, no other
    checkpoint directory is, and nothing uncommitted is left in the run directory."""
    index = json.loads((run / INDEX_NAME).read_text())
    for entry in index["checkpoint_results"]:
        files = read_checkpoint(str(run / entry["checkpoint_dir_name"]))
        shards = {name: text for name, text in files.items() if name.startswith("rank")}
        assert shards == _both_ranks(entry["metrics"]["round"]), entry
    on_storage = sorted(path.name for path in run.glob("checkpoint_*") if path.is_dir())
    assert on_storage == sorted(entry["checkpoint_dir_name"] for entry in index["checkpoint_results"])
    assert not (run / STAGING_DIR).exists()


def _assert_round_named(message: str, dir_name: str, round_: int) -> None:
    assert re.search(rf"\b{dir_name}\b.*\bround {round_}\b", message), message


def _assert_nothing_left(tiers: pathlib.Path) -> None:
    assert wait_until_gone([p.pid for p in _processes_of(tiers)], timeout=15) == []
    assert os.listdir(tiers) == []  # the last agent removed its tier, and a dead agent's was swept


# ---------------------------------------------------------------------------------- committed in memory


def _kill_rank_0_right_after_reports(tmp_path, tiers, mode: str) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    result = _trainer(die_right_after_reports, tmp_path, {"notes": str(notes), "mode": mode}, max_failures=1).fit()
    run = tmp_path / "run"
    for rank in (0, 1):  # the restart resumed from round 1, the latest committed, read from the tier
        resumed = json.loads((notes / f"resumed_{rank}.json").read_text())
        assert resumed["files"] == _both_ranks(1), resumed
        assert resumed["path"].startswith(str(tiers) + os.sep), resumed
    assert _named(run) == ["checkpoint_000000", "checkpoint_000001"]  # durable when fit() returned
    assert result.checkpoint.path == str(run / "checkpoint_000001")
    [failed] = result.failed_attempts  # the run succeeded after one failure, which its Result names
    assert (failed.attempt, failed.rank) == (0, 0) and "SIGKILL" in failed.cause, failed
    _assert_consistent(run)
    _assert_nothing_left(tiers)


@pytest.mark.parametrize("mode", ["SYNC", "ASYNC"])
def test_a_rank_killed_0_ms_after_its_report_returned_everywhere_restarts_from_the_round_in_memory(
        tmp_path, tiers, mode):
    # Each rank notes at once that its round-1 report() returned; rank 0 SIGKILLs itself as soon as
    # both notes exist. ASYNC's report() returned once the files were in the tier and the report was
    # written to the agent's socket.
    _kill_rank_0_right_after_reports(tmp_path, tiers, mode)


def test_a_rank_killed_during_its_copy_into_the_tier_leaves_nothing_and_the_run_resumes(tmp_path, tiers):
    """A rank SIGKILLed while its files are being copied into the tier: its report never returned, so its
    round is not committed and the restart resumes from the round before; the half-written shard and its
    reservation are gone from the tier before the next attempt's workers run."""
    notes = tmp_path / "notes"
    notes.mkdir()
    result = _trainer(die_during_the_copy_into_the_tier, tmp_path, {"notes": str(notes), "tiers": str(tiers)},
                      max_failures=1).fit()
    assert (notes / "killed").exists()
    for rank in (0, 1):
        resumed = json.loads((notes / f"resumed_{rank}.json").read_text())
        assert resumed["files"] == _both_ranks(0), resumed  # round 1 never completed
        tier = json.loads((notes / f"tier_{rank}.json").read_text())
        assert tier["incoming"] == [] and not any(".incoming-" in key for key in tier["ledger"]), tier
    assert result.checkpoint.path == str(tmp_path / "run" / "checkpoint_000000")
    _assert_nothing_left(tiers)


@pytest.mark.soak
@pytest.mark.parametrize("repeat", range(5))
@pytest.mark.parametrize("mode", ["SYNC", "ASYNC"])
def test_a_rank_killed_0_ms_after_its_report_returned_everywhere_soak(tmp_path, tiers, mode, repeat):
    _kill_rank_0_right_after_reports(tmp_path, tiers, mode)


def test_a_round_committed_in_memory_becomes_durable_when_a_rank_dies_while_the_agent_persists_it(tmp_path, tiers):
    # The agent has written round 1's first shard to the staging area when rank 0 dies, and goes on
    # (and says it is done) only once the next attempt runs: storage slower than a restart. The next
    # attempt resumes from round 1 without waiting for it (the node holds all of it), and the round must
    # still become durable.
    notes = tmp_path / "notes"
    notes.mkdir()
    # wait_s bounds the gate if a fixed minitrain waits for durability before restarting.
    fs = GatedFileSystem(dir_name="checkpoint_000001", pid_file=str(tmp_path / "persisting"),
                         gate=str(notes / "restarted"), when="after", wait_s=10.0)
    result = _trainer(die_right_after_reports, tmp_path, {"notes": str(notes), "mode": "SYNC"}, max_failures=1,
                      storage_filesystem=fs).fit()
    run = tmp_path / "run"
    for rank in (0, 1):
        assert json.loads((notes / f"resumed_{rank}.json").read_text())["files"] == _both_ranks(1)
    assert _named(run) == ["checkpoint_000000", "checkpoint_000001"]
    assert result.checkpoint.path == str(run / "checkpoint_000001")
    _assert_consistent(run)
    _assert_nothing_left(tiers)


# ---------------------------------------------------------------------------------- a full tier


def test_a_full_tier_falls_back_to_uploads_with_one_warning_per_worker_and_fit_waits_for_the_last_round(
        tmp_path, tiers):
    # 4 KiB of tier, 64 KiB shards: round 0's small shards fit; in round 1 rank 0's small shard fits and
    # rank 1's big one is uploaded (the two are merged at the commit); in round 2 neither fits; round 3's
    # small shards fit again, and the agent writes them to storage only once the run's event log says it
    # finished (the controller's loop is over then: only its wait for durability takes the agent's
    # answer): fit() must not return before round 3 is durable.
    big = 64 << 10
    fs = GatedFileSystem(dir_name="checkpoint_000003", pid_file=str(tmp_path / "persisting"),
                         gate=str(tmp_path / "run" / "events.jsonl"), gate_text='"next": "FINISHED"')
    config = {"rounds": 4, "big": {"1": [0, big], "2": [big, big]}}
    result = _trainer(report_rounds, tmp_path, config, storage_filesystem=fs,
                      checkpoint_config=CheckpointConfig(memory_tier_bytes=4 << 10)).fit()
    run = tmp_path / "run"
    assert (tmp_path / "persisting").exists()  # round 3 went through the tier, held up as said
    assert _named(run) == [f"checkpoint_{i:06d}" for i in range(4)]
    _assert_consistent(run)
    for round_ in (1, 2):
        assert os.path.getsize(run / f"checkpoint_{round_:06d}" / "padding.bin") == big
    assert result.checkpoint.path == str(run / "checkpoint_000003")
    for rank in (0, 1):
        log = (run / "logs" / "attempt_0" / f"rank_{rank}.log").read_text()
        assert log.count("CheckpointConfig.memory_tier_bytes sets its size") == 1, log
    _assert_nothing_left(tiers)


# ---------------------------------------------------------------------------------- storage outage


def test_a_storage_outage_during_persistence_fails_the_run_naming_the_checkpoint_and_its_round(
        tmp_path, tiers, monkeypatch, caplog):
    # Every write to the staging area fails; the agent retries for MINITRAIN_PERSIST_RETRY_S (read from
    # the environment it inherits from the driver) and gives up.
    monkeypatch.setenv("MINITRAIN_PERSIST_RETRY_S", "1")
    with pytest.raises(minitrain.TrainingFailedError) as caught:
        _trainer(report_rounds, tmp_path, {"rounds": 1}, storage_filesystem=OutageFileSystem()).fit()
    message = str(caught.value)
    _assert_round_named(message, "checkpoint_000000", 0)
    assert "injected storage outage" in message, message
    assert "retrying" in caplog.text  # the agent retried before it gave up
    run = tmp_path / "run"
    assert not (run / INDEX_NAME).exists() or _named(run) == []
    assert not (run / "checkpoint_000000").exists()
    assert not (run / STAGING_DIR).exists()
    _assert_nothing_left(tiers)


# ---------------------------------------------------------------------------------- a lost agent


def test_an_agent_killed_while_it_persists_loses_its_round_by_name_and_its_tier_is_swept(tmp_path, tiers, caplog):
    # Round 0 is durable; the agent is SIGKILLed while it writes round 1 (committed in memory) to
    # storage. The round is lost by name (the documented limit of one host); the restart (a new agent)
    # resumes from round 0 and trains on past it, so the run's result misses nothing and fit() succeeds.
    notes = tmp_path / "notes"
    notes.mkdir()
    pid_file = tmp_path / "persisting"
    fs = GatedFileSystem(dir_name="checkpoint_000001", pid_file=str(pid_file), gate=str(tmp_path / "never"),
                         wait_s=30.0)
    config = {"notes": str(notes), "pid_file": str(pid_file), "tiers": str(tiers), "rounds": 3,
              "index": str(tmp_path / "run" / INDEX_NAME)}
    with caplog.at_level(logging.ERROR, logger="minitrain"):
        result = _trainer(kill_the_persisting_agent, tmp_path, config, max_failures=1, storage_filesystem=fs).fit()
    _assert_round_named(caplog.text, "checkpoint_000001", 1)
    run = tmp_path / "run"
    assert "checkpoint_000001" not in _named(run) and not (run / "checkpoint_000001").exists()
    assert _named(run)[0] == "checkpoint_000000"
    latest = os.path.basename(result.checkpoint.path)  # trained again past the lost round, durable
    assert latest > "checkpoint_000001" and latest in _named(run)
    _assert_consistent(run)
    for rank in (0, 1):  # read from storage: the tier that held round 1 died with its agent
        resumed = json.loads((notes / f"resumed_{rank}.json").read_text())
        assert resumed["files"] == _both_ranks(0) and not resumed["path"].startswith(str(tiers)), resumed
    dead = json.loads((notes / "tiers_before.json").read_text())
    assert len(dead) == 1 and dead[0] not in json.loads((notes / "tiers_after.json").read_text())
    _assert_nothing_left(tiers)


# ---------------------------------------------------------------------------------- a killed driver


DRIVER = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {e2e!r})
    from memory_tier_training import GatedFileSystem, hold_after_round
    from minitrain import RunConfig, ScalingConfig
    from minitrain.torch import TorchTrainer

    config = json.loads(sys.argv[1])
    fs = GatedFileSystem(dir_name="checkpoint_000001", pid_file=config["pid_file"], gate=config["gate"])
    TorchTrainer(hold_after_round, train_loop_config=config, scaling_config=ScalingConfig(num_workers=2),
                 run_config=RunConfig(name="run", storage_path=config["storage"], storage_filesystem=fs)).fit()
""")


def _wait_for(condition, driver: subprocess.Popen, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if driver.poll() is not None:
            raise AssertionError(f"the driver exited early:\n{driver.stdout.read()}")
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.02)


def test_a_driver_killed_before_a_round_was_durable_resumes_from_the_latest_durable_round(tmp_path, tiers):
    # Round 0 is durable and round 1 committed in memory (both ranks' reports returned) while the agent's
    # write of it to storage is held up; then the driver is SIGKILLed, and the agent's write goes through
    # late. The next fit() of the run resumes from round 0.
    notes = tmp_path / "notes"
    notes.mkdir()
    pid_file, gate = tmp_path / "persisting", tmp_path / "gate"
    config = {"notes": str(notes), "pid_file": str(pid_file), "gate": str(gate), "storage": str(tmp_path),
              "name": "first", "rounds": 3, "hold_after": 1}
    script = tmp_path / "driver.py"
    script.write_text(DRIVER.format(e2e=str(E2E)))
    driver = subprocess.Popen([sys.executable, str(script), json.dumps(config)], cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True)
    run = tmp_path / "run"
    try:
        _wait_for(lambda: all((notes / f"held_{rank}").exists() for rank in (0, 1)) and pid_file.exists()
                  and (run / INDEX_NAME).exists() and _named(run) == ["checkpoint_000000"], driver,
                  "round 0 durable and round 1 committed in memory")
        running = _processes_of(tiers)
        # the driver, its agent and 2 workers at least: the check that none is left afterwards sees them
        assert len(running) >= 4, [p.cmdline() for p in running]
        os.kill(driver.pid, signal.SIGKILL)  # the driver only: agents and workers are in sessions of their own
        driver.wait()
    finally:
        gate.touch()
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
    _assert_nothing_left(tiers)  # the agents saw their driver go, stopped their workers and removed their tiers
    assert _named(run) == ["checkpoint_000000"]

    result = _trainer(hold_after_round, tmp_path, {"notes": str(notes), "name": "second", "rounds": 3}).fit()
    for rank in (0, 1):
        resumed = json.loads((notes / f"second_{rank}.json").read_text())
        assert resumed["files"] == _both_ranks(0), resumed
    assert result.metrics == {"round": 2}
    assert _named(run)[0] == "checkpoint_000000"
    _assert_consistent(run)  # the late write of round 1 was never committed
    _assert_nothing_left(tiers)
