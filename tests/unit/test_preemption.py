"""Unit tests for minitrain.get_preemption_info(): None (no preemption notice received), anywhere."""

from __future__ import annotations

import minitrain
from minitrain import RunConfig, ScalingConfig, _session
from minitrain.context import TrainContext
from minitrain.torch import TorchTrainer


def test_exported_beside_get_context_and_get_checkpoint():
    assert "get_preemption_info" in minitrain.__all__
    assert minitrain._EXPORTS["get_preemption_info"] == minitrain._EXPORTS["get_context"] == "minitrain.train_api"
    assert minitrain.get_preemption_info.__doc__


def test_outside_a_training_function_returns_none_without_error():
    _session.set_current(None)
    assert minitrain.get_preemption_info() is None


class _WorkerLikeSession:
    context = TrainContext(experiment_name="x", world_rank=1, world_size=2)

    def report(self, metrics, checkpoint=None, checkpoint_dir_name=None, **options) -> None:
        pass

    def get_checkpoint(self):
        return None


def test_inside_a_worker_session_returns_none():
    _session.set_current(_WorkerLikeSession())
    try:
        assert minitrain.get_preemption_info() is None
    finally:
        _session.set_current(None)


def _train() -> dict:
    return {"preemption": minitrain.get_preemption_info(), "rank": minitrain.get_context().get_world_rank()}


def test_inside_a_local_mode_training_function_returns_none(tmp_path):
    result = TorchTrainer(_train, scaling_config=ScalingConfig(num_workers=0),
                          run_config=RunConfig(name="preempt", storage_path=str(tmp_path))).fit()
    assert result.return_value == {"preemption": None, "rank": 0}
