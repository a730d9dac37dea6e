"""End to end on one machine: real coordinator, agent and 2 gloo workers per test (seconds each).

Each training function writes what it saw (ranks, env, pids of itself, its agent and its DataLoader
children) to files under tmp_path, so the tests can check every rank and then prove that no process
of the run survives `fit()`.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

import minitrain
from minitrain import RunConfig, ScalingConfig
from minitrain.procs import wait_until_gone
from minitrain.torch import TorchTrainer

pytestmark = pytest.mark.e2e


class InjectedError(Exception):
    """Raised on purpose by a training function."""


def _record(config: dict, **extra) -> None:
    """Write this rank's view of the run to <out>/rank_<r>.json."""
    context = minitrain.get_context()
    info = {
        "rank": context.get_world_rank(), "world_size": context.get_world_size(),
        "local_rank": context.get_local_rank(), "local_world_size": context.get_local_world_size(),
        "node_rank": context.get_node_rank(), "experiment": context.get_experiment_name(),
        "env": {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                               "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")},
        "pid": os.getpid(), "agent_pid": os.getppid(), **extra,
    }
    path = os.path.join(config["out"], f"rank_{info['rank']}.json")
    with open(path + ".tmp", "w") as handle:
        json.dump(info, handle)
    os.replace(path + ".tmp", path)


def _note_pid(out: str, name: str) -> None:
    with open(os.path.join(out, f"pid_{name}_{os.getpid()}"), "w"):
        pass


class _PidNotingDataset:
    """A map-style dataset whose DataLoader worker processes leave their pids behind."""

    def __init__(self, out: str, rows):
        self.out, self.rows = out, rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, index):
        return self.rows[index]


def _loader_worker_init(out: str):
    def init(_worker_id):
        _note_pid(out, "loader")
    return init


def train_regression(config: dict):
    """A small DDP regression with a DataLoader child process per rank; reports loss every epoch."""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader

    from minitrain.torch import prepare_data_loader, prepare_model

    torch.manual_seed(0)
    x = torch.randn(512, 8)
    y = x @ torch.randn(8, 1)
    rows = [(x[i], y[i]) for i in range(len(x))]
    loader = DataLoader(_PidNotingDataset(config["out"], rows), batch_size=32, shuffle=True,
                        num_workers=1, worker_init_fn=_loader_worker_init(config["out"]))
    loader = prepare_data_loader(loader)
    model = prepare_model(nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    first = None
    for epoch in range(config["epochs"]):
        loader.sampler.set_epoch(epoch)
        total = 0.0
        for xb, yb in loader:
            loss = nn.functional.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item()
        first = total if first is None else first
        minitrain.report({"epoch": epoch, "loss": total, "first_loss": first,
                          "rank": minitrain.get_context().get_world_rank()})
    print(f"rank {minitrain.get_context().get_world_rank()} finished training")
    _record(config, samples_per_epoch=len(loader.sampler))


def train_failing(config: dict):
    """Rank `config['rank']` fails by `config['how']` after both ranks recorded their pids."""
    import torch
    import torch.distributed as dist

    _record(config)
    dist.barrier()
    if minitrain.get_context().get_world_rank() == config["rank"]:
        how = config["how"]
        if how == "raise":
            raise InjectedError("injected failure")
        if how == "exit":
            os._exit(3)
        if how == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
    # The healthy rank blocks in a collective until it is stopped: it must not hang the driver.
    dist.all_reduce(torch.ones(1))
    time.sleep(600)


class _DiesWhenLoaded:
    """Unpickling this in a worker ends the process (a start-up death) or raises ImportError."""

    def __init__(self, how: str):
        self.how = how

    def __reduce__(self):
        if self.how == "exit":
            return (os._exit, (7,))
        return (_raise_import_error, ("no_such_module_on_workers",))


def _raise_import_error(name: str):
    raise ModuleNotFoundError(f"No module named {name!r}")


def train_nothing(config: dict):
    """A function that never runs: its config kills the worker while loading."""


def _trainer(fn, tmp_path, config: dict, num_workers: int = 2, **run_kwargs) -> TorchTrainer:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    return TorchTrainer(fn, train_loop_config={"out": str(out), **config},
                        scaling_config=ScalingConfig(num_workers=num_workers),
                        run_config=RunConfig(name="e2e", storage_path=str(tmp_path / "results"), **run_kwargs))


def _records(tmp_path) -> dict[int, dict]:
    out = tmp_path / "out"
    return {json.load(open(p))["rank"]: json.load(open(p)) for p in out.glob("rank_*.json")}


def _run_pids(tmp_path) -> list[int]:
    """Every pid the run's processes left a note of: workers, their agent, DataLoader children."""
    pids = set()
    for info in _records(tmp_path).values():
        pids.update({info["pid"], info["agent_pid"]})
    for note in (tmp_path / "out").glob("pid_*"):
        pids.add(int(note.name.rsplit("_", 1)[1]))
    return sorted(pids)


def _assert_nothing_survives(tmp_path) -> None:
    pids = _run_pids(tmp_path)
    assert pids, "the run left no pid notes: the test would prove nothing"
    assert wait_until_gone(pids, timeout=10.0) == [], "processes of the run survived fit()"


def test_ddp_training_converges_on_two_workers(tmp_path, capfd):
    result = _trainer(train_regression, tmp_path, {"epochs": 4}).fit()

    assert result.metrics["rank"] == 0 and result.metrics["epoch"] == 3
    assert result.metrics["loss"] < result.metrics["first_loss"] / 4
    records = _records(tmp_path)
    assert sorted(records) == [0, 1]
    for rank, info in records.items():
        assert info["world_size"] == 2 and info["local_world_size"] == 2 and info["node_rank"] == 0
        assert info["local_rank"] == rank and info["experiment"] == "e2e"
        assert info["env"]["RANK"] == str(rank) and info["env"]["WORLD_SIZE"] == "2"
        assert info["samples_per_epoch"] == 256  # DistributedSampler: half of 512 rows each
    assert records[0]["env"]["MASTER_PORT"] == records[1]["env"]["MASTER_PORT"]
    assert records[0]["agent_pid"] == records[1]["agent_pid"]
    assert list((tmp_path / "out").glob("pid_loader_*")), "DataLoader children did not start"

    console = capfd.readouterr().out
    assert "(rank 1, " in console and "rank 1 finished training" in console
    logs = tmp_path / "results" / "e2e" / "logs" / "attempt_0"
    assert "rank 0 finished training" in (logs / "rank_0.log").read_text()
    assert "rank 1 finished training" in (logs / "rank_1.log").read_text()
    assert (tmp_path / "results" / "e2e" / ".validate_storage_marker").exists()
    _assert_nothing_survives(tmp_path)


def test_exception_on_rank_1_surfaces_with_its_type(tmp_path):
    with pytest.raises(minitrain.WorkerGroupError) as caught:
        _trainer(train_failing, tmp_path, {"rank": 1, "how": "raise"}).fit()

    error = caught.value
    assert isinstance(error.worker_failures[1], InjectedError)
    assert 0 not in error.worker_failures  # rank 0 was stopped by minitrain, it did not fail
    pid = _records(tmp_path)[1]["pid"]
    text = str(error)
    assert "Root cause: rank 1 on " in text and f"(pid {pid}) during training" in text
    assert "InjectedError: injected failure" in text and "train_failing" in text  # traceback tail
    _assert_nothing_survives(tmp_path)


@pytest.mark.parametrize("how, expected", [("exit", "exited with code 3"),
                                           ("sigkill", "killed by signal SIGKILL (9)")])
def test_worker_death_is_reported_with_exit_code_or_signal(tmp_path, how, expected):
    with pytest.raises(minitrain.WorkerGroupError) as caught:
        _trainer(train_failing, tmp_path, {"rank": 1, "how": how}).fit()

    failure = caught.value.worker_failures[1]
    assert isinstance(failure, minitrain.WorkerProcessError)
    assert expected in str(caught.value) and "during training" in str(caught.value)
    if how == "exit":
        assert failure.exit_code == 3 and failure.signal is None
    else:
        assert failure.signal == signal.SIGKILL
    _assert_nothing_survives(tmp_path)


@pytest.mark.parametrize("how, expected", [("exit", "during start-up: exited with code 7"),
                                           ("import", "during start-up: ModuleNotFoundError")])
def test_start_up_failure_never_hangs_the_driver(tmp_path, how, expected):
    trainer = _trainer(train_nothing, tmp_path, {"payload": _DiesWhenLoaded(how)})
    with pytest.raises(minitrain.WorkerGroupError) as caught:
        trainer.fit()
    assert expected in str(caught.value)
    failures = caught.value.worker_failures
    # The first rank to load the payload fails; the other may be stopped before it gets that far.
    assert failures and set(failures) <= {0, 1}
    if how == "import":
        assert all(isinstance(f, ModuleNotFoundError) for f in failures.values())


def test_process_group_init_failure_names_the_phase(tmp_path):
    from minitrain.config import TorchConfig

    trainer = _trainer(train_nothing, tmp_path, {})
    trainer.torch_config = TorchConfig(backend="nccl")  # no CUDA here: NCCL cannot initialise
    with pytest.raises(minitrain.WorkerGroupError) as caught:
        trainer.fit()
    assert "during process-group init" in str(caught.value)


def _local_train(config):
    context = minitrain.get_context()
    for step in range(3):
        minitrain.report({"step": step, "world": context.get_world_size()})
    return "done"


def test_local_mode_runs_in_the_driver(tmp_path):
    result = TorchTrainer(_local_train, scaling_config=ScalingConfig(num_workers=0),
                          run_config=RunConfig(name="local", storage_path=str(tmp_path))).fit()
    assert result.metrics == {"step": 2, "world": 1}
    assert result.return_value == "done" and result.path is None
    assert not (tmp_path / "local").exists()


def _make_closure(scale: float):
    offset = {"value": 10.0}  # captured state, not a global: cloudpickle ships it by value

    def train(config):
        minitrain.report({"value": scale * minitrain.get_context().get_world_size() + offset["value"]})

    return train


def test_closure_runs_on_workers(tmp_path):
    result = TorchTrainer(_make_closure(3.0), scaling_config=ScalingConfig(num_workers=2),
                          run_config=RunConfig(name="closure", storage_path=str(tmp_path))).fit()
    assert result.metrics == {"value": 16.0}
