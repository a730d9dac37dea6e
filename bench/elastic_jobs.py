"""The measured processes of the `elastic` workload (see `bench.elastic`).

`python -m bench.elastic_jobs --role driver --spec SPEC` is a fresh driver on two local hosts
(`localhost:1,127.0.0.1:1`, one node agent and one rank each): one elastic `(1, 2)` DDP fit() with
`max_failures=0`, whose rank 1 SIGKILLs its node agent at step `kill_at` (once). It writes the
Result's resizes and metrics to the spec's result file. Only the standard library is imported at module level.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time

from bench.common import append_jsonl, role_main, write_json

HOSTS = "localhost:1,127.0.0.1:1"


def _kill_my_agent(out: str) -> None:
    """SIGKILL the node agent this worker runs under (its nearest `minitrain.agent` ancestor), after
    writing the time (kill.json); then wait to die with it."""
    import psutil

    agent = psutil.Process().parent()
    while agent is not None and "minitrain.agent" not in " ".join(agent.cmdline()):
        agent = agent.parent()
    if agent is None:
        raise RuntimeError("no minitrain.agent above this worker")
    write_json(os.path.join(out, "kill.json"), {"time": time.time(), "agent_pid": agent.pid})
    os.kill(agent.pid, signal.SIGKILL)
    time.sleep(600)  # the agent's death ends this process


def train_func(config: dict) -> None:
    """A small DDP model trained a step every `step_s` s, rank 0 checkpointing every step (so every
    step is a checkpoint boundary). Each rank appends its first step's time and world size to
    first_steps.jsonl, with when it entered this function (before its imports), had built the model and
    loaded the checkpoint, and had wrapped the model (DDP). Rank 1 kills its agent at `kill_at`, once
    (marker file). Returns `after_grow` steps after it grew back to 2 workers; fails at `max_steps` (it never grew back)."""
    entered = time.time()
    import json

    import torch

    import minitrain
    from minitrain.torch import prepare_model

    out = config["out"]
    context = minitrain.get_context()
    world, rank = context.get_world_size(), context.get_world_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    state = {"step": 0, "shrunk": False, "grown_at": None}
    checkpoint = minitrain.get_checkpoint()
    if checkpoint is not None:  # DDP: the full state rank 0 saved loads at any size (docs/elastic.md)
        with checkpoint.as_directory() as directory:
            saved = torch.load(os.path.join(directory, "state.pt"))
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        state = json.loads(saved["state"])
    loaded = time.time()
    model = prepare_model(model)
    prepared = time.time()
    if world == 1:
        state["shrunk"] = True
    if world == 2 and state["shrunk"] and state["grown_at"] is None:
        state["grown_at"] = state["step"]
    features, target = torch.randn(8, 16), torch.randn(8, 1)
    first = True
    while True:
        if world == 2 and rank == 1 and state["step"] == config["kill_at"] and \
                not os.path.exists(os.path.join(out, "killed")):
            open(os.path.join(out, "killed"), "w").close()
            _kill_my_agent(out)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(features), target).backward()  # DDP's all_reduce at world 2
        optimizer.step()
        state["step"] += 1
        if first:
            append_jsonl(os.path.join(out, "first_steps.jsonl"), {"time": time.time(), "world": world, "rank": rank,
                                                                  "step": state["step"], "pid": os.getpid(),
                                                                  "entered": entered, "loaded": loaded,
                                                                  "prepared": prepared})
            first = False
        with tempfile.TemporaryDirectory(dir=out) as tmp:  # in the bench's directory: a stopped rank leaves it
            if rank == 0:
                unwrapped = getattr(model, "module", model)
                torch.save({"model": unwrapped.state_dict(), "optimizer": optimizer.state_dict(),
                            "state": json.dumps(state)}, os.path.join(tmp, "state.pt"))
            minitrain.report({"step": state["step"], "world": world},
                             checkpoint=minitrain.Checkpoint.from_directory(tmp) if rank == 0 else None)
        time.sleep(config["step_s"])
        if state["grown_at"] is not None and state["step"] >= state["grown_at"] + config["after_grow"]:
            return
        if state["step"] >= config["max_steps"]:
            raise RuntimeError(f"never grew back to 2 workers in {config['max_steps']} steps: {state}")


def role_driver(spec: dict) -> None:
    """One elastic fit() on the two local hosts; its resizes and outcome to the result file."""
    import minitrain
    from minitrain import FailureConfig, RunConfig, ScalingConfig
    from minitrain.torch import TorchTrainer

    minitrain.init(hosts=HOSTS)
    config = spec["config"]
    trainer = TorchTrainer(train_func, train_loop_config=config,
                           scaling_config=ScalingConfig(num_workers=(1, 2),
                                                        elastic_resize_monitor_interval_s=spec["interval_s"]),
                           run_config=RunConfig(name="elastic", storage_path=spec["storage"],
                                                failure_config=FailureConfig(max_failures=0)))
    started = time.time()
    result = trainer.fit()  # max_failures=0: a charged failure would raise here
    write_json(spec["result"], {"started_at": started, "ended_at": time.time(), "path": result.path,
                                "metrics": result.metrics, "resizes": [vars(r) for r in result.resizes],
                                "error": repr(result.error) if result.error else None})


def main(argv=None) -> int:
    """`--role driver --spec PATH`."""
    return role_main(__doc__.splitlines()[0], {"driver": role_driver}, argv)


if __name__ == "__main__":
    sys.exit(main())
