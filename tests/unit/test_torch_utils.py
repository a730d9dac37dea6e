"""`minitrain.torch` utilities against a named fake session, plus one real 2-process DDP run on gloo."""

from __future__ import annotations

import logging
import os

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, Sampler, TensorDataset

from minitrain import _session
from minitrain.context import TrainContext
from minitrain.torch import train_loop_utils as utils
from minitrain.torch.checkpoint_dirs import link_or_copy_tree, owns_directory
from minitrain.torch.train_loop_utils import (
    accelerate,
    backward,
    enable_reproducibility,
    get_device,
    get_devices,
    prepare_data_loader,
    prepare_model,
    prepare_optimizer,
)


class FakeSession:
    """The smallest thing `_session` accepts: a context, and report/get_checkpoint that do nothing."""

    def __init__(self, **context_fields) -> None:
        self.context = TrainContext(experiment_name="test", **context_fields)

    def report(self, metrics, checkpoint=None, checkpoint_dir_name=None, **options) -> None:
        pass

    def get_checkpoint(self):
        return None


@pytest.fixture
def session():
    """Call with TrainContext fields to register a fake session; cleared afterwards."""
    _session.set_current(None)

    def register(**context_fields) -> FakeSession:
        fake = FakeSession(**context_fields)
        _session.set_current(fake)
        return fake

    yield register
    _session.set_current(None)


def _dataset(n: int = 20) -> TensorDataset:
    return TensorDataset(torch.arange(n, dtype=torch.float32).unsqueeze(1), torch.arange(n))


# --- devices ---------------------------------------------------------------------------------------


def test_cpu_worker_gets_cpu(session):
    session(world_size=2, world_rank=1)
    assert get_devices() == [torch.device("cpu")]
    assert get_device() == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback")
def test_gpu_indices_without_cuda_and_local_mode_fall_back_to_cpu(session):
    session(device_indices=(0, 1))
    assert get_devices() == [torch.device("cpu")]
    session(local_mode=True)
    assert get_device() == torch.device("cpu")


@pytest.mark.parametrize(
    "call, name",
    [
        (get_device, "get_device"),
        (get_devices, "get_devices"),
        (lambda: prepare_model(nn.Linear(1, 1)), "prepare_model"),
        (lambda: prepare_data_loader(DataLoader(_dataset())), "prepare_data_loader"),
    ],
)
def test_outside_a_training_function_raises(session, call, name):
    with pytest.raises(RuntimeError, match=rf"{name}\(\) cannot be used outside"):
        call()


# --- prepare_model ---------------------------------------------------------------------------------


def test_prepare_model_single_worker_returns_plain_model_on_cpu(session):
    session(world_size=1)
    model = nn.Linear(3, 2)
    prepared = prepare_model(model)
    assert prepared is model
    assert type(prepared) is nn.Linear
    assert next(prepared.parameters()).device == torch.device("cpu")


def test_prepare_model_explicit_device_and_no_strategy(session):
    session(world_size=2)
    model = nn.Linear(3, 2)
    assert prepare_model(model, move_to_device=torch.device("cpu"), parallel_strategy=None) is model


def test_prepare_model_fsdp_on_one_worker_returns_the_plain_model(session):
    session(world_size=1)
    model = nn.Linear(3, 2)
    assert prepare_model(model, parallel_strategy="fsdp") is model


@pytest.mark.parametrize("world_size", [1, 2])
def test_prepare_model_rejects_unknown_strategy(session, world_size):
    session(world_size=world_size)
    with pytest.raises(ValueError, match=r"parallel_strategy='deepspeed'.*'ddp', 'fsdp' or None"):
        prepare_model(nn.Linear(1, 1), parallel_strategy="deepspeed")


# --- prepare_data_loader ---------------------------------------------------------------------------


@pytest.mark.parametrize("shuffle", [True, False])
def test_prepare_data_loader_shards_across_ranks(session, shuffle):
    session(world_size=2, world_rank=1)
    loader = prepare_data_loader(DataLoader(_dataset(20), batch_size=4, shuffle=shuffle, drop_last=True))
    sampler = loader.sampler
    assert isinstance(sampler, DistributedSampler)
    assert (sampler.num_replicas, sampler.rank, sampler.shuffle) == (2, 1, shuffle)
    assert len(sampler) == 10
    assert loader.batch_size == 4 and loader.drop_last is True
    seen = torch.cat([x for x, _ in loader]).flatten().tolist()
    assert len(seen) == 8  # 10 samples, batches of 4, drop_last
    sampler.set_epoch(1)  # the documented per-epoch call works on the returned loader
    if not shuffle:
        assert list(iter(sampler)) == list(range(1, 20, 2))


def test_prepare_data_loader_ranks_cover_the_dataset_once(session):
    seen = []
    for rank in range(2):
        session(world_size=2, world_rank=rank)
        loader = prepare_data_loader(DataLoader(_dataset(20), batch_size=3, shuffle=True))
        seen += [int(i) for _, idx in loader for i in idx]
    assert sorted(seen) == list(range(20))


def test_prepare_data_loader_single_worker_and_opt_out_keep_the_loader(session):
    session(world_size=1)
    loader = DataLoader(_dataset(), batch_size=4)
    assert prepare_data_loader(loader) is loader
    session(world_size=2)
    assert prepare_data_loader(loader, add_dist_sampler=False) is loader


def test_prepare_data_loader_keeps_worker_options(session):
    session(world_size=2)
    original = DataLoader(_dataset(), batch_size=4, num_workers=1, persistent_workers=True, prefetch_factor=3)
    loader = prepare_data_loader(original)
    assert loader is not original
    assert (loader.num_workers, loader.persistent_workers, loader.prefetch_factor) == (1, True, 3)


def test_prepare_data_loader_warns_when_replacing_a_custom_sampler(session, caplog):
    class EvenIndices(Sampler):
        def __init__(self, n):
            self.n = n

        def __iter__(self):
            return iter(range(0, self.n, 2))

        def __len__(self):
            return (self.n + 1) // 2

    session(world_size=2, world_rank=0)
    with caplog.at_level(logging.WARNING, logger=utils.__name__):
        loader = prepare_data_loader(DataLoader(_dataset(), sampler=EvenIndices(20)))
    assert isinstance(loader.sampler, DistributedSampler) and loader.sampler.shuffle is True
    assert "EvenIndices" in caplog.text


def test_prepare_data_loader_refuses_custom_batch_sampler(session):
    session(world_size=2)
    with pytest.raises(ValueError, match="add_dist_sampler=False"):
        prepare_data_loader(DataLoader(_dataset(), batch_sampler=[[0, 1], [2, 3]]))


def test_device_loader_moves_nested_batches_and_keeps_loader_surface():
    # "meta" stands in for a GPU: tensors really change device, no CUDA needed.
    base = DataLoader(_dataset(6), batch_size=4, collate_fn=lambda items: {"x": [items[0][0]], "y": (items[0][1],)})
    wrapped = utils._DeviceDataLoader(base, torch.device("meta"), auto_transfer=True)
    assert isinstance(wrapped, DataLoader)
    assert len(wrapped) == 2 and wrapped.batch_size == 4
    assert wrapped.sampler is base.sampler and wrapped.dataset is base.dataset
    for _ in range(2):  # iterable more than once
        batches = list(wrapped)
        assert len(batches) == 2
        assert batches[0]["x"][0].device.type == "meta" and batches[0]["y"][0].device.type == "meta"


# --- checkpoint directories shared by ranks -------------------------------------------------------


def test_owns_directory_on_one_worker_and_without_a_path(session, tmp_path):
    session(world_size=1)
    assert owns_directory(str(tmp_path)) is True
    assert owns_directory(None) is False


def test_owns_directory_needs_the_process_group_with_several_workers(session, tmp_path):
    session(world_size=2)
    with pytest.raises(RuntimeError, match="needs the default process group"):
        owns_directory(str(tmp_path))


def test_link_or_copy_tree_links_every_file_of_the_tree(tmp_path):
    source = tmp_path / "source"
    (source / "shards").mkdir(parents=True)
    (source / "model.pt").write_bytes(b"model")
    (source / "shards" / "__1_0.distcp").write_bytes(b"shard")
    link_or_copy_tree(str(source), str(tmp_path / "staged" / "checkpoint"))
    staged = tmp_path / "staged" / "checkpoint"
    assert (staged / "shards" / "__1_0.distcp").read_bytes() == b"shard"
    assert (staged / "model.pt").stat().st_ino == (source / "model.pt").stat().st_ino  # a link, not a copy
    (source / "model.pt").unlink()  # the framework rotating its checkpoints away
    assert (staged / "model.pt").read_bytes() == b"model"


# --- reproducibility and removed names -------------------------------------------------------------


def test_enable_reproducibility_seeds_and_configures(session, monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    try:
        enable_reproducibility(7)
        first = torch.rand(3)
        assert torch.are_deterministic_algorithms_enabled()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        enable_reproducibility(7)
        assert torch.equal(first, torch.rand(3))
        session(world_size=2)
        orders = [list(prepare_data_loader(DataLoader(_dataset(), shuffle=True)).sampler) for _ in range(2)]
        assert orders[0] == orders[1]
    finally:
        torch.use_deterministic_algorithms(False)
        monkeypatch.setattr(utils, "_reproducibility_seed", None)


@pytest.mark.parametrize(
    "call, hint",
    [
        (lambda: accelerate(amp=True), "torch.autocast"),
        (lambda: backward(torch.ones(1)), "loss.backward()"),
        (lambda: prepare_optimizer(torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=0.1)), "optimizer directly"),
    ],
)
def test_removed_names_raise_deprecation_warning(call, hint):
    with pytest.raises(DeprecationWarning, match=hint.replace("(", r"\(").replace(")", r"\)")):
        call()


# --- package surface -------------------------------------------------------------------------------


def test_lazy_names_resolve():
    import minitrain.torch as package

    assert package.prepare_model is prepare_model
    assert set(package.__all__) >= {"get_device", "prepare_data_loader", "TorchTrainer", "TorchConfig"}
    with pytest.raises(AttributeError):
        package.no_such_name  # noqa: B018


# --- real DDP --------------------------------------------------------------------------------------


