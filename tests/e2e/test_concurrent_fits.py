"""Several fit()s at once in one driver process: two TorchTrainer.fit() calls on two
threads, each with 2 real workers, and two local-mode fit()s (num_workers=0) on two threads.

Each run's workers wait until the other run's workers have started, so the two runs provably overlap
(no sleep-and-hope: a file each, waited for with a deadline).
"""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

import minitrain
from minitrain import RunConfig, ScalingConfig
from minitrain.procs import wait_until_gone
from minitrain.torch import TorchTrainer

pytestmark = pytest.mark.e2e

EPOCHS = 3


def _wait_for_file(path: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout_s} s: the other run never started")
        time.sleep(0.05)


def train_tagged(config: dict):
    """Report this run's tag each epoch, checkpoint from rank 0; first wait for the other run's workers."""
    ctx = minitrain.get_context()
    rank = ctx.get_world_rank()
    out = config["out"]
    with open(os.path.join(out, f"pid_{config['tag']}_{rank}_{os.getpid()}_{os.getppid()}"), "w"):
        pass
    with open(os.path.join(out, f"started_{config['tag']}_{rank}"), "w"):
        pass
    _wait_for_file(os.path.join(out, f"started_{config['other']}_{rank}"), 120.0)
    print(f"worker line of run {config['tag']} rank {rank}", flush=True)
    for epoch in range(EPOCHS):
        checkpoint = minitrain.Checkpoint.from_dict({"tag": config["tag"], "epoch": epoch}) if rank == 0 else None
        minitrain.report({"tag": config["tag"], "epoch": epoch, "experiment": ctx.get_experiment_name()},
                         checkpoint=checkpoint)


def _in_threads(targets: dict) -> dict:
    """Run each callable on a thread of its own at once; {name: (result, exception)}."""
    outcomes: dict = {}

    def call(name, fn):
        try:
            outcomes[name] = (fn(), None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test's assertions
            outcomes[name] = (None, exc)

    threads = [threading.Thread(target=call, args=item, name=f"fit-{item[0]}") for item in targets.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert not any(t.is_alive() for t in threads), "a fit() thread did not end"
    return outcomes


def test_two_fits_on_two_threads_keep_their_own_runs(tmp_path, capfd):
    out = tmp_path / "out"
    out.mkdir()
    storage = tmp_path / "storage"

    def trainer(tag: str, other: str) -> TorchTrainer:
        return TorchTrainer(train_tagged, train_loop_config={"tag": tag, "other": other, "out": str(out)},
                            scaling_config=ScalingConfig(num_workers=2),
                            run_config=RunConfig(name=f"run-{tag}", storage_path=str(storage)))

    outcomes = _in_threads({"a": trainer("a", "b").fit, "b": trainer("b", "a").fit})

    for tag, other in (("a", "b"), ("b", "a")):
        result, error = outcomes[tag]
        assert error is None, f"fit() of run {tag} raised {error!r}"
        assert result.error is None
        run_dir = str(storage / f"run-{tag}")
        assert os.path.realpath(result.path) == os.path.realpath(run_dir)
        assert result.metrics["tag"] == tag and result.metrics["experiment"] == f"run-{tag}"
        assert result.metrics["epoch"] == EPOCHS - 1
        assert result.checkpoint.to_dict() == {"tag": tag, "epoch": EPOCHS - 1}
        assert os.path.realpath(result.checkpoint.path).startswith(os.path.realpath(run_dir) + os.sep)
        # Its own worker logs: its own lines, none of the other run's.
        logs = "".join(p.read_text() for p in (storage / f"run-{tag}" / "logs").rglob("*") if p.is_file())
        assert f"worker line of run {tag} rank 0" in logs and f"worker line of run {tag} rank 1" in logs
        assert f"worker line of run {other}" not in logs
        # Its own reports in its own metrics log.
        lines = (storage / f"run-{tag}" / "metrics.jsonl").read_text().splitlines()
        assert [json.loads(line)["metrics"]["tag"] for line in lines] == [tag] * EPOCHS
    pids = {int(part) for note in out.glob("pid_*") for part in note.name.split("_")[3:5]}
    assert len(pids) == 6, "expected 4 workers and 2 agents"  # proves both runs overlapped and ran
    assert wait_until_gone(pids, timeout=10.0) == [], "processes of the runs survived fit()"
    assert sorted(p.name for p in storage.iterdir()) == ["run-a", "run-b"]


def test_two_local_mode_fits_on_two_threads_see_their_own_session(tmp_path):
    both_in = threading.Barrier(2, timeout=60)

    def local(config: dict):
        ctx = minitrain.get_context()
        both_in.wait()  # both sessions are current at once from here on
        for step in range(20):
            minitrain.report({"tag": config["tag"], "step": step, "experiment": ctx.get_experiment_name(),
                              "seen": minitrain.get_context().get_experiment_name()})
        both_in.wait()
        return config["tag"]

    def trainer(tag: str) -> TorchTrainer:
        return TorchTrainer(local, train_loop_config={"tag": tag}, scaling_config=ScalingConfig(num_workers=0),
                            run_config=RunConfig(name=f"local-{tag}", storage_path=str(tmp_path)))

    outcomes = _in_threads({"a": trainer("a").fit, "b": trainer("b").fit})
    for tag in ("a", "b"):
        result, error = outcomes[tag]
        assert error is None, f"local fit() {tag} raised {error!r}"
        assert result.return_value == tag
        assert result.metrics == {"tag": tag, "step": 19, "experiment": f"local-{tag}", "seen": f"local-{tag}"}
    with pytest.raises(RuntimeError, match="outside of a minitrain training function"):
        minitrain.report({"after": 1})  # nothing left current on this thread either
