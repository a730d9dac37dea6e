"""The driver program of the preemption tests (tests/e2e/test_preemption_signals.py) and of the fault
suite's "preemption signal" kind: a TorchTrainer fit() whose training function asks
get_preemption_info() at every step (unless told not to) and checkpoints when it is non-None.

    python preemption_training.py OUT '{"steps": 200, "step_s": 0.02, ...}'

Files under OUT: pid_<pid> per worker; progress once rank 0 made `signal_after` reports; uploading when
rank 0 starts a periodic checkpoint upload; returned when rank 0's function returns; seen_rank<r>.json
({"step", "reports", "round", ...}) when rank r first sees the preemption; committing_<dir> when the
driver starts committing a checkpoint (`signal_in_commit`: the driver signals itself right there).
Exit: 0 finished, 143 PreemptionError (its attributes printed as one JSON line after "DRIVER: preempted").
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time

import minitrain
from minitrain import CheckpointConfig, FailureConfig, PreemptionError, RunConfig, ScalingConfig
from minitrain.torch import TorchTrainer


def _mark(out: str, name: str) -> None:
    open(os.path.join(out, name), "w").close()


def train(config):
    out = config["out"]
    rank = minitrain.get_context().get_world_rank()
    _mark(out, f"pid_{os.getpid()}")
    start = 0
    checkpoint = minitrain.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            start = json.load(open(os.path.join(directory, f"rank{rank}.json")))["step"] + 1
    reports, seen = 0, False
    for step in range(start, config["steps"]):
        slow = config.get("slow", 1) if rank == config.get("slow_rank", -1) else 1
        time.sleep(config["step_s"] * slow)
        info = minitrain.get_preemption_info() if config.get("ask", True) else None
        if info is not None and not seen:
            seen = True
            with open(os.path.join(out, f"seen_rank{rank}.json"), "w") as handle:
                json.dump({"step": step, "reports": reports, "round": info.round, "signal": info.signal,
                           "ranks": info.preempted_ranks, "nodes": info.preempted_node_ids,
                           "deadline_ms": info.deadline_ms, "time": time.time()}, handle)
        periodic = config.get("every") and step % config["every"] == 0 and step > start
        if info is not None or periodic:
            with tempfile.TemporaryDirectory() as tmp:
                with open(os.path.join(tmp, f"rank{rank}.json"), "w") as handle:
                    json.dump({"step": step}, handle)
                if config.get("ckpt_bytes"):
                    with open(os.path.join(tmp, f"weights{rank}.bin"), "wb") as handle:
                        handle.write(os.urandom(config["ckpt_bytes"]))
                if rank == 0 and periodic:
                    _mark(out, "uploading")
                minitrain.report({"step": step, "preempted": info is not None},
                                 checkpoint=minitrain.Checkpoint.from_directory(tmp))
        else:
            minitrain.report({"step": step})
        reports += 1
        if rank == 0 and reports == config.get("signal_after", 3):
            _mark(out, "progress")
    if rank == 0:
        _mark(out, "returned")
    return start


def _signal_in_commit(out: str) -> None:
    """The driver signals itself as it starts committing a checkpoint (the handler runs mid-commit)."""
    from minitrain.storage.checkpoint_manager import CheckpointManager

    commit = CheckpointManager.commit

    def commit_with_a_signal(self, record, staged=()):
        _mark(out, f"committing_{record.dir_name}")
        if not os.path.exists(os.path.join(out, "signalled_in_commit")):
            _mark(out, "signalled_in_commit")
            os.kill(os.getpid(), signal.SIGUSR2)
        return commit(self, record, staged)

    CheckpointManager.commit = commit_with_a_signal


def main() -> int:
    out, config = sys.argv[1], json.loads(sys.argv[2])
    config["out"] = out
    failure = {key: config[key] for key in ("preemption_signals", "preemption_timeout_s", "max_preemption_failures",
                                            "worker_stop_grace_s") if key in config}
    if "preemption_signals" in failure:
        failure["preemption_signals"] = tuple(failure["preemption_signals"])
    filesystem = None
    if config.get("slow_upload_s"):
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from tests_support_slowfs import SlowLocalFileSystem

        filesystem = SlowLocalFileSystem(delay_s=config["slow_upload_s"])
    if config.get("signal_in_commit"):
        _signal_in_commit(out)
    if config.get("hosts"):  # e.g. "localhost:1,127.0.0.1:1": two local node agents, one rank each
        minitrain.init(hosts=config["hosts"])
    trainer = TorchTrainer(train, train_loop_config=config,
                           scaling_config=ScalingConfig(num_workers=config.get("workers", 2)),
                           run_config=RunConfig(name="p", storage_path=os.path.join(out, "results"),
                                                storage_filesystem=filesystem,
                                                failure_config=FailureConfig(**failure),
                                                checkpoint_config=CheckpointConfig(
                                                    memory_tier_bytes=config.get("memory_tier_bytes"))))
    try:
        result = trainer.fit()
    except PreemptionError as exc:
        info = exc.preemption_info
        print("DRIVER: preempted " + json.dumps({
            "round": info.round, "drain_timed_out": exc.drain_timed_out, "resumable": exc.resumable,
            "checkpoint_dir": exc.checkpoint_dir, "nodes": info.preempted_node_to_ranks, "signal": info.signal}),
            flush=True)
        print(f"DRIVER: message {exc}", flush=True)
        return 143
    print("DRIVER: finished " + json.dumps({"metrics": result.metrics, "start": result.return_value}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
