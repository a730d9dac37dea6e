"""The measured processes of the `restart` and `detect` workloads (see `bench.restart`).

`python -m bench.restart_jobs --role minitrain-job --spec SPEC` is a driver calling
`TorchTrainer.fit()` with unlimited restarts; `--role torchrun-worker --spec SPEC` is one torchrun
worker of `torchrun --max-restarts N`. Both train the same small DDP MLP (2 CPU workers, gloo) from
their latest checkpoint, append timestamped records (JSON lines) of each attempt's first step and of
each kill, and rank 1 ends each attempt but the last after `train_s` seconds:
  "worker":     SIGKILL itself;
  "agent":      SIGKILL its node agent (the parent of every worker; the workers die with it);
  "agent-stop": SIGSTOP its node agent (a silent host: its connections stay open, nothing answers),
                then SIGKILL it STOP_HOLD_S later, long after the coordinator gave up on it.
With "crash_at": "first_line" in the spec, rank 1 instead does so at the first line of the training
function, before it imports anything (a start-up crash: a bad config, a failing first batch), while the
agent's fork server may still be importing torch. Each attempt's "start" record (rank 0's first step)
carries the function's entry time, the process's creation time and whether it was forked.
Only the standard library is imported at module level.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from bench.common import NUM_WORKERS, TimedLog, append_jsonl, read_json, read_jsonl

REPORT_EVERY = 10
CHECKPOINT_EVERY = 50
FINAL_STEPS = 60
MLP_IN, MLP_HIDDEN, BATCH = 64, 256, 64
STOP_HOLD_S = 8.0  # a stopped agent stays stopped this long (the lease is 5 s), then it is killed


def _build(torch):
    """The same small MLP, optimizer and fixed batch on every rank and every attempt."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(MLP_IN, MLP_HIDDEN), torch.nn.ReLU(),
                                torch.nn.Linear(MLP_HIDDEN, MLP_HIDDEN), torch.nn.ReLU(),
                                torch.nn.Linear(MLP_HIDDEN, 1))
    x, y = torch.randn(BATCH, MLP_IN), torch.randn(BATCH, 1)
    return model, x, y


def _train(torch, ddp, opt, x, y, step: int, rank: int, loaded: float, kill, report, train_s: float) -> int:
    """Train from `step`: `report(step, loss)` every REPORT_EVERY steps. With `kill` (a callable), rank 1
    calls it after `train_s` seconds and rank 0 trains until the group breaks; without, FINAL_STEPS steps."""
    first = step
    while True:
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % REPORT_EVERY == 0:
            report(step, loss.item())
        step += 1
        if kill is None:
            if step - first >= FINAL_STEPS:
                return step
        elif rank == 1 and time.time() - loaded >= train_s:
            kill()


def _fork_servers_at_kill(exclude: set) -> list[dict]:
    """The agent's fork server (its `--fork-server` child; a list, empty when there is none), whether it
    is ready (blocked reading fork requests from its socket: it imported everything it preloads) and
    whether its quick server (a `--fork-server` child of its own) answers meanwhile."""
    import psutil

    fork_servers = []
    try:
        children = psutil.Process(os.getppid()).children()
        with open("/proc/uptime") as f:
            now = float(f.read().split()[0])  # since boot, as the start times in /proc/<pid>/stat
    except (psutil.Error, OSError):
        return fork_servers
    for child in children:
        try:
            if child.pid in exclude or "--fork-server" not in child.cmdline():
                continue
            with open(f"/proc/{child.pid}/wchan") as f:
                waiting_on = f.read()
            with open(f"/proc/{child.pid}/stat") as f:
                started = int(f.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
            quick = any("--fork-server" in c.cmdline() for c in child.children())
            fork_servers.append({"pid": child.pid, "age_s": round(now - started, 3),
                                 "cpu_s": round(sum(child.cpu_times()[:2]), 3),
                                 "ready": "wait_for_more_packets" in waiting_on, "quick_server": quick})
        except (psutil.Error, OSError):
            continue
    return fork_servers


def _process_origin() -> dict:
    """When this worker process came to be (its creation time: the fork or the spawn) and whether it was
    forked from the agent's fork server (a forked worker keeps the fork server's command line)."""
    # /proc/self/stat's start time counts clock ticks since boot; psutil adds a boot time rounded to
    # the second, so it is computed against CLOCK_BOOTTIME here (10 ms resolution).
    with open("/proc/self/stat") as f:
        started_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    age = time.clock_gettime(time.CLOCK_BOOTTIME) - started_ticks / os.sysconf("SC_CLK_TCK")
    with open("/proc/self/cmdline", "rb") as f:
        forked = b"--fork-server" in f.read().split(b"\0")
    return {"created": time.time() - age, "forked": forked}


def _kill_self(events: str, kind: str, rank: int) -> None:
    """Record the kill (with the state of the agent's fork server), then end this attempt as `kind` says."""
    workers = {r["pid"] for r in read_jsonl(events) if r["kind"] == "start"}  # every attempt's ranks
    fork_servers = _fork_servers_at_kill(workers | {os.getpid()})
    append_jsonl(events, {"kind": "kill", "what": kind, "rank": rank, "time": time.time(), "pid": os.getpid(),
                          "agent_pid": os.getppid(), "fork_servers": fork_servers})
    if kind == "worker":
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind == "agent":
        os.kill(os.getppid(), signal.SIGKILL)
    else:  # "agent-stop": silent until long after the lease ran out, then gone
        agent = os.getppid()
        os.kill(agent, signal.SIGSTOP)
        time.sleep(STOP_HOLD_S)
        os.kill(agent, signal.SIGKILL)
    time.sleep(60)  # the parent-death signal ends this process


def minitrain_train_func(config: dict) -> None:
    """One attempt of the minitrain job (see the module docstring)."""
    import os
    import signal
    import tempfile
    import time

    entered = time.time()
    import minitrain

    rank = minitrain.get_context().get_world_rank()
    events, kind = config["events"], config["kill_kind"]
    kills_so_far = sum(1 for r in read_jsonl(events) if r["kind"] == "kill")  # same on both ranks
    if config.get("crash_at") == "first_line" and kills_so_far < config["kills"] and rank == 1:
        _kill_self(events, kind, rank)  # a start-up crash: before the training function did anything
    import torch

    from minitrain.torch import prepare_model

    model, x, y = _build(torch)
    ddp = prepare_model(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    prepared = time.time()
    step = 0
    checkpoint = minitrain.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"))
        ddp.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = state["step"] + 1
    loaded = time.time()
    append_jsonl(events, {"kind": "start", "rank": rank, "time": loaded, "entered": entered, "prepared": prepared,
                          "step": step, "resumed": checkpoint is not None, "pid": os.getpid(),
                          **_process_origin()})

    def report(step: int, loss: float) -> None:
        metrics = {"step": step, "loss": loss}
        if step % CHECKPOINT_EVERY:
            minitrain.report(metrics)
            return
        with tempfile.TemporaryDirectory() as tmp:
            saved = None
            if rank == 0:
                torch.save({"model": ddp.module.state_dict(), "opt": opt.state_dict(), "step": step},
                           os.path.join(tmp, "state.pt"))
                saved = minitrain.Checkpoint.from_directory(tmp)
            minitrain.report(metrics, checkpoint=saved)

    def kill() -> None:
        _kill_self(events, kind, rank)

    crash_later = kills_so_far < config["kills"] and config.get("crash_at") != "first_line"
    last = _train(torch, ddp, opt, x, y, step, rank, loaded, kill if crash_later else None, report,
                  config["train_s"])
    minitrain.report({"step": last, "final": True})


def role_minitrain_job(spec: dict) -> None:
    """The driver: TorchTrainer.fit() with unlimited restarts; checks that it finished."""
    from minitrain import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from minitrain.torch import TorchTrainer

    TimedLog.install(spec["log_events"])
    config = {"events": spec["events"], "kill_kind": spec["kill_kind"], "kills": spec["kills"],
              "train_s": spec["train_s"], "crash_at": spec.get("crash_at", "train_s")}
    result = TorchTrainer(minitrain_train_func, train_loop_config=config,
                          scaling_config=ScalingConfig(num_workers=NUM_WORKERS),
                          run_config=RunConfig(name="bench", storage_path=spec["storage"],
                                               failure_config=FailureConfig(max_failures=-1),
                                               checkpoint_config=CheckpointConfig(num_to_keep=2))).fit()
    assert result.metrics.get("final") is True, result.metrics
    kills = sum(1 for r in read_jsonl(spec["events"]) if r["kind"] == "kill")
    assert kills == spec["kills"], (kills, spec["kills"])


_STACKS = None  # a torchrun worker's stack-dump file, open for the life of the process


def role_torchrun_worker(spec: dict) -> None:
    """One torchrun worker of one attempt (see the module docstring)."""
    entered = time.time()
    rank, attempt = int(os.environ["RANK"]), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    events = os.path.join(spec["out_dir"], "events.jsonl")
    append_jsonl(events, {"kind": "enter", "rank": rank, "attempt": attempt, "time": entered, "pid": os.getpid()})
    import faulthandler

    # On a hang the benchmark asks for every thread's stack (SIGUSR1); each process writes its own file.
    global _STACKS
    _STACKS = open(os.path.join(spec["out_dir"], f"stacks_attempt{attempt}_rank{rank}.txt"), "w")
    faulthandler.register(signal.SIGUSR1, file=_STACKS, all_threads=True)
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    imported = time.time()
    append_jsonl(events, {"kind": "init", "rank": rank, "attempt": attempt, "time": imported})
    dist.init_process_group("gloo")
    initialized = time.time()
    model, x, y = _build(torch)
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    prepared = time.time()
    path = os.path.join(spec["out_dir"], "state.pt")
    step = 0
    if os.path.exists(path):
        state = torch.load(path)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = state["step"] + 1
    loaded = time.time()
    append_jsonl(events, {"kind": "start", "rank": rank, "attempt": attempt, "time": loaded, "entered": entered,
                          "imported": imported, "initialized": initialized, "prepared": prepared, "step": step,
                          "resumed": step > 0, "pid": os.getpid()})

    def report(step: int, loss: float) -> None:
        if rank == 0 and step % CHECKPOINT_EVERY == 0:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, path + ".tmp")
            os.replace(path + ".tmp", path)

    def kill() -> None:
        append_jsonl(events, {"kind": "kill", "what": "worker", "rank": rank, "attempt": attempt, "time": time.time(),
                              "pid": os.getpid()})
        os.kill(os.getpid(), signal.SIGKILL)

    _train(torch, ddp, opt, x, y, step, rank, loaded, kill if attempt < spec["restarts"] else None, report,
           spec["train_s"])
    dist.destroy_process_group()


# ---------------------------------------------------------------------- the benchmark driver


def main(argv=None) -> int:
    """`--role minitrain-job|torchrun-worker --spec PATH`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=["minitrain-job", "torchrun-worker"], required=True)
    parser.add_argument("--spec", required=True)
    args = parser.parse_args(argv)
    spec = read_json(args.spec)
    (role_minitrain_job if args.role == "minitrain-job" else role_torchrun_worker)(spec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
