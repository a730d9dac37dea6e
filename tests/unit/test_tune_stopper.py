"""minitrain.tune.stopper: Ray's stoppers and what `RunConfig(stop=...)` accepts.

The TimeoutStopper tests are ported from ray/python/ray/tune/tests/test_stopper.py (freezegun's clock
replaced by a patched time.time); the rest follow the documented semantics of ray.tune.stopper.*."""

from __future__ import annotations

import datetime
import pickle

import pytest

from minitrain import tune
from minitrain.errors import ConfigError
from minitrain.tune import stopper as stoppers
from minitrain.tune.stopper import (CombinedStopper, DictStopper, ExperimentPlateauStopper, FunctionStopper,
                                    MaximumIterationStopper, MissingStopKey, NoopStopper, Stopper,
                                    TimeoutStopper, TrialPlateauStopper, as_stopper)


class _Clock:
    def __init__(self):
        self.now = 1000.0

    def tick(self, seconds):
        self.now += seconds


@pytest.fixture
def frozen(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(stoppers.time, "time", lambda: clock.now)
    return clock


def test_timeout_stopper_timeout(frozen):
    stopper = TimeoutStopper(timeout=60)
    assert not stopper.stop_all()
    frozen.tick(40)
    assert not stopper.stop_all()
    frozen.tick(22)
    assert stopper.stop_all()


def test_timeout_stopper_recover_before_timeout(frozen):
    stopper = TimeoutStopper(timeout=60)
    assert not stopper.stop_all()
    frozen.tick(40)
    assert not stopper.stop_all()
    checkpoint = pickle.dumps(stopper)
    frozen.tick(200)  # after start + timeout, but a restored stopper goes on from its budget
    stopper = pickle.loads(checkpoint)
    assert not stopper.stop_all()
    frozen.tick(10)
    assert not stopper.stop_all()
    frozen.tick(12)
    assert stopper.stop_all()


def test_timeout_stopper_recover_after_timeout(frozen):
    stopper = TimeoutStopper(timeout=datetime.timedelta(seconds=60))
    assert not stopper.stop_all()
    frozen.tick(62)
    assert stopper.stop_all()
    checkpoint = pickle.dumps(stopper)
    frozen.tick(200)
    stopper = pickle.loads(checkpoint)
    assert stopper.stop_all()
    with pytest.raises(ValueError, match="timedelta"):
        TimeoutStopper("60s")


def test_maximum_iteration_stopper_counts_each_trial():
    stopper = MaximumIterationStopper(max_iter=3)
    assert [stopper("a", {}) for _ in range(3)] == [False, False, True]
    assert not stopper("b", {}) and not stopper.stop_all()


def test_trial_plateau_stopper_stops_a_flat_trial_after_the_grace_period():
    stopper = TrialPlateauStopper(metric="m", std=0.01, num_results=4, grace_period=4)
    assert [stopper("t", {"m": 1.0}) for _ in range(4)] == [False, False, False, True]
    noisy = TrialPlateauStopper(metric="m")
    assert not any(noisy("t", {"m": float(i)}) for i in range(10))
    assert not noisy("u", {"other": 1})  # a missing metric never counts as a plateau


def test_trial_plateau_stopper_threshold_needs_a_mode_and_is_respected():
    with pytest.raises(ValueError, match="metric_threshold"):
        TrialPlateauStopper(metric="m", metric_threshold=1.0)
    stopper = TrialPlateauStopper(metric="m", num_results=2, grace_period=2, metric_threshold=0.5, mode="min")
    assert [stopper("t", {"m": 1.0}) for _ in range(3)] == [False, False, False]  # flat but above 0.5
    assert [stopper("u", {"m": 0.1}) for _ in range(2)] == [False, True]


def test_experiment_plateau_stopper_stops_everything_when_the_top_values_agree():
    with pytest.raises(ValueError):
        ExperimentPlateauStopper(metric="m", top=1)
    with pytest.raises(ValueError):
        ExperimentPlateauStopper(metric="m", std=1)  # an int: Ray wants a float
    with pytest.raises(ValueError):
        ExperimentPlateauStopper(metric="m", mode="best")
    stopper = ExperimentPlateauStopper(metric="m", top=3, patience=2)
    assert not stopper("a", {"m": 1.0}) and not stopper("b", {"m": 1.0})
    assert not stopper("c", {"m": 1.0})  # plateaued once; patience=2 wants two in a row
    assert stopper("d", {"m": 1.0}) and stopper.stop_all()


def test_combined_and_function_stoppers():
    calls = []
    combined = CombinedStopper(MaximumIterationStopper(2), FunctionStopper(lambda t, r: calls.append(t) or r["x"] > 5))
    assert not combined("t", {"x": 0})
    assert combined("t", {"x": 0})  # the max-iteration one
    assert combined("u", {"x": 9}) and calls == ["t", "t", "u"]
    assert not combined.stop_all()


def test_dict_stopper_is_rays_stopping_criteria():
    stopper = DictStopper({"training_iteration": 3, "nested/acc": 0.9})
    assert not stopper("t", {"training_iteration": 1, "nested": {"acc": 0.5}})
    assert stopper("t", {"training_iteration": 3, "nested": {"acc": 0.5}})
    assert stopper("t", {"training_iteration": 1, "nested": {"acc": 0.95}})
    with pytest.raises(MissingStopKey, match="Stopping criteria training_iteration not provided"):
        stopper("t", {"nested": {"acc": 0.1}})
    with pytest.raises(ConfigError, match="flattened"):
        DictStopper({"a": {"b": 1}})


def test_as_stopper_takes_what_ray_takes():
    assert isinstance(as_stopper(None), NoopStopper)
    assert isinstance(as_stopper({"x": 1}), DictStopper)
    assert isinstance(as_stopper(lambda trial_id, result: False), FunctionStopper)
    mine = MaximumIterationStopper(1)
    assert as_stopper(mine) is mine
    fake = type("Fake", (), {"__call__": lambda self, t, r: False, "stop_all": lambda self: False})()
    with pytest.raises(ConfigError, match="Stopper subclass"):
        as_stopper(fake)
    with pytest.raises(ConfigError, match="must be None, a dict"):
        as_stopper(5)


def test_rays_import_paths():
    assert tune.Stopper is Stopper
    assert tune.stopper.CombinedStopper is CombinedStopper
    from minitrain.tune.stopper import TimeoutStopper as Imported
    assert Imported is TimeoutStopper
