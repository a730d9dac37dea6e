"""Ray Tune's trainable helpers and import paths: `tune.with_parameters`,
`tune.get_context()` outside a trial, `ray.tune.search.<module>.<Class>` paths. The with_parameters cases
follow ray/python/ray/tune/tests/test_function_api.py (testWithParameters*)."""

from __future__ import annotations

import pytest

from minitrain import tune
from minitrain.config import ScalingConfig
from minitrain.errors import ConfigError
from minitrain.tune.tuner import Tuner, trial_resources


def train(config, data=None, model=None):
    return (config, data, model)


def test_with_parameters_passes_the_objects_to_each_call():
    wrapped = tune.with_parameters(train, data=[1, 2, 3], model="m")
    assert wrapped({"x": 1}) == ({"x": 1}, [1, 2, 3], "m") and wrapped.__name__ == "train"
    Tuner(wrapped)  # accepted as a one-argument trainable


def test_with_parameters_refuses_what_cannot_be_called():
    with pytest.raises(ConfigError, match="cannot be called"):
        tune.with_parameters(train, unknown=1)
    with pytest.raises(ConfigError, match="class trainables"):
        tune.with_parameters(type("T", (), {}), data=1)
    with pytest.raises(ConfigError, match="the other way round"):
        tune.with_parameters(tune.with_resources(lambda config: None, {"cpu": 1}), data=1)


def test_with_resources_both_forms_around_with_parameters():
    wrapped = tune.with_resources(tune.with_parameters(train, data=1), {"cpu": 2, "gpu": 0})
    assert trial_resources(wrapped) == {"CPU": 2.0, "GPU": 0.0} and wrapped({"x": 0}) == ({"x": 0}, 1, None)
    scaled = tune.with_resources(tune.with_parameters(train, data=1), ScalingConfig(num_workers=2))
    assert trial_resources(scaled)["CPU"] == 2.0
    Tuner(wrapped), Tuner(scaled)


def test_get_context_outside_a_trial_has_no_ids():
    context = tune.get_context()
    assert context.get_trial_id() is None and context.get_trial_name() is None
    assert context.get_trial_dir() is None and context.get_experiment_name() is None
    assert context.get_trial_resources() == {}


def test_rays_import_paths_of_the_search_classes():
    from minitrain.tune.search import BasicVariantGenerator, ConcurrencyLimiter, Searcher
    from minitrain.tune.search.basic_variant import BasicVariantGenerator as B
    from minitrain.tune.search.concurrency_limiter import ConcurrencyLimiter as C
    from minitrain.tune.search.sample import Domain, uniform
    from minitrain.tune.search.searcher import Searcher as S
    assert (B, C, S) == (BasicVariantGenerator, ConcurrencyLimiter, Searcher)
    assert isinstance(uniform(0, 1), Domain) and tune.uniform is uniform


def test_rays_import_paths_of_the_schedulers():
    """Ray's modules under ray.tune.schedulers resolve to the same classes (import-only port)."""
    from minitrain.tune import schedulers
    from minitrain.tune.schedulers.async_hyperband import ASHAScheduler, AsyncHyperBandScheduler
    from minitrain.tune.schedulers.median_stopping_rule import MedianStoppingRule
    from minitrain.tune.schedulers.trial_scheduler import FIFOScheduler, TrialScheduler
    assert (ASHAScheduler, AsyncHyperBandScheduler, MedianStoppingRule, FIFOScheduler, TrialScheduler) == (
        schedulers.ASHAScheduler, schedulers.AsyncHyperBandScheduler, schedulers.MedianStoppingRule,
        schedulers.FIFOScheduler, schedulers.TrialScheduler)
    assert TrialScheduler.CONTINUE == "CONTINUE" and TrialScheduler.STOP == "STOP"
