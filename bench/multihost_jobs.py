"""The measured processes of the `multihost` workload (see `bench.multihost`).

`python -m bench.multihost_jobs --role driver --spec SPEC` is a fresh driver: it inits the
fake cluster (or not: localhost), then either times pre-flight alone or runs one fit() and writes its
figures. Only the standard library is imported at module level.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from bench.common import TimedLog, role_main, write_json

NUM_HOSTS = 2
SLOTS = 2
NUM_WORKERS = NUM_HOSTS * SLOTS
READY_STEP = 3  # every rank made this many steps: training runs across both hosts
KILL_STEP = 8   # the step at which h1's local rank 0 kills its agent


def trivial_train_func(config: dict) -> None:
    """Start-up: one all_reduce across every rank and one report."""
    import torch
    import torch.distributed as dist

    import minitrain

    t = torch.ones(1)
    dist.all_reduce(t)
    minitrain.report({"x": t.item()})


def loss_train_func(config: dict) -> None:
    """Node loss: all_reduce + report every STEP_S s until the failure stops the group (or MAX_TRAIN_S).
    Every rank marks READY_STEP; with `kill_agent`, h1's local rank 0 records the time and kills its agent."""
    import torch
    import torch.distributed as dist

    import minitrain

    context = minitrain.get_context()
    rank, out = context.get_world_rank(), config["out"]
    killer = config["kill_agent"] and context.get_node_rank() == 1 and context.get_local_rank() == 0
    deadline = time.time() + config["max_s"]
    step = 0
    while time.time() < deadline:
        dist.all_reduce(torch.ones(1))
        minitrain.report({"step": step})
        step += 1
        if step == READY_STEP:
            open(os.path.join(out, f"ready_{rank}"), "w").close()
        if killer and step == KILL_STEP:
            write_json(os.path.join(out, "kill.json"), {"time": time.time(), "agent_pid": os.getppid()})
            os.kill(os.getppid(), signal.SIGKILL)  # this worker's node agent, on h1
            time.sleep(600)  # the parent-death signal ends this process
        time.sleep(config["step_s"])


def role_driver(spec: dict) -> None:
    """A fresh driver: init the cluster (or not: localhost), then pre-flight alone, or one fit()."""
    import minitrain

    if spec["init"] is not None:
        minitrain.init(**spec["init"])
    if spec["mode"] == "preflight":
        from minitrain.hosts.ssh import preflight

        start = time.perf_counter()
        preflight(minitrain.current_cluster(), expected_version=minitrain.__version__)
        write_json(spec["result"], {"preflight_s": time.perf_counter() - start})
        return
    from minitrain import FailureConfig, RunConfig, ScalingConfig, WorkerGroupError
    from minitrain.torch import TorchTrainer

    if spec.get("log_events"):
        TimedLog.install(spec["log_events"])
    loss = spec["mode"] != "start"
    trainer = TorchTrainer(loss_train_func if loss else trivial_train_func, train_loop_config=spec["config"],
                           scaling_config=ScalingConfig(num_workers=NUM_WORKERS),
                           run_config=RunConfig(name="bench", storage_path=spec["storage"],
                                                failure_config=FailureConfig(max_failures=0)))
    start = time.perf_counter()
    try:
        result = trainer.fit()
    except WorkerGroupError as exc:
        if not loss:
            raise
        write_json(spec["result"], {"fit_s": time.perf_counter() - start, "raised_at": time.time(),
                                    "error": f"{type(exc).__name__}: {str(exc)[:2000]}"})
        return
    fit_s = time.perf_counter() - start
    assert not loss, f"the {spec['mode']} job finished without seeing its failure: {result.metrics}"
    assert result.metrics == {"x": float(NUM_WORKERS)}, result.metrics  # every rank took part
    write_json(spec["result"], {"fit_s": fit_s})


def main(argv=None) -> int:
    """`--role driver --spec PATH`."""
    return role_main(__doc__.splitlines()[0], {"driver": role_driver}, argv)


if __name__ == "__main__":
    sys.exit(main())
