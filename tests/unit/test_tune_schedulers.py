"""ASHA and the median stopping rule decide as Ray's do (cases ported from
ray/tune/tests/test_trial_scheduler.py: AsyncHyperBandSuite, EarlyStoppingSuite)."""

from __future__ import annotations

import pytest

from minitrain.errors import ConfigError
from minitrain.tune.schedulers import (
    CONTINUE, STOP, ASHAScheduler, AsyncHyperBandScheduler, FIFOScheduler, MedianStoppingRule,
)


def result(t, reward):
    return {"time_total_s": t, "training_iteration": t, "episode_reward_mean": reward}


def basic_setup(scheduler):
    """t1: rewards 0, 100, ..., 900 over t=0..9; t2: 450 over t=0..4 (Ray's basicSetup)."""
    for trial in ("t1", "t2"):
        scheduler.on_trial_add(trial)
    for i in range(10):
        assert scheduler.on_trial_result("t1", result(i, i * 100)) == CONTINUE
        if i < 5:
            assert scheduler.on_trial_result("t2", result(i, 450)) == CONTINUE
    return "t1", "t2"


def asha(**kwargs):
    return AsyncHyperBandScheduler(metric="episode_reward_mean", mode="max", **kwargs)


def test_asha_rungs_are_rays():
    assert [m for m, _ in AsyncHyperBandScheduler(max_t=10, grace_period=1, reduction_factor=2).rungs()[0]] \
        == [8, 4, 2, 1]
    brackets = AsyncHyperBandScheduler(max_t=100, grace_period=1, reduction_factor=4, brackets=3).rungs()
    assert [[m for m, _ in b] for b in brackets] == [[64, 16, 4, 1], [64, 16, 4], [64, 16]]


def test_asha_stops_below_the_rung_percentile():
    scheduler = asha(grace_period=1, max_t=10, reduction_factor=2)
    basic_setup(scheduler)
    scheduler.on_trial_complete("t2", result(5, 450))
    scheduler.on_trial_add("t3")
    assert scheduler.on_trial_result("t3", result(1, 260)) == STOP  # median of {100, 450} is 275
    assert scheduler.on_trial_result("t3", result(2, 260)) == STOP  # median of {200, 450} is 325
    scheduler.on_trial_add("t4")
    assert scheduler.on_trial_result("t4", result(1, 300)) == CONTINUE  # median of {100, 450, 260}


def test_asha_grace_period_and_min_mode():
    scheduler = asha(grace_period=2.5, reduction_factor=3)
    basic_setup(scheduler)
    scheduler.on_trial_complete("t1", result(10, 1000))
    scheduler.on_trial_complete("t2", result(10, 1000))
    scheduler.on_trial_add("t3")
    assert scheduler.on_trial_result("t3", result(1, 10)) == CONTINUE
    assert scheduler.on_trial_result("t3", result(2, 10)) == CONTINUE
    assert scheduler.on_trial_result("t3", result(3, 10)) == STOP
    minimize = AsyncHyperBandScheduler(metric="loss", mode="min", grace_period=1, max_t=10, reduction_factor=2)
    for trial, loss in (("a", 1.0), ("b", 2.0), ("c", 3.0)):
        minimize.on_trial_add(trial)
    assert minimize.on_trial_result("a", {"training_iteration": 1, "loss": 1.0}) == CONTINUE
    assert minimize.on_trial_result("b", {"training_iteration": 1, "loss": 2.0}) == STOP
    assert minimize.on_trial_result("c", {"training_iteration": 1, "loss": 0.5}) == CONTINUE


def test_asha_stops_every_trial_at_max_t_and_ignores_results_without_the_metric():
    scheduler = asha(max_t=10, brackets=10)
    for i in range(10):
        scheduler.on_trial_add(f"t{i}")
    assert all(scheduler.on_trial_result(f"t{i}", result(10, -2)) == STOP for i in range(10))
    assert scheduler.on_trial_result("t0", {"training_iteration": 3}) == CONTINUE


@pytest.mark.parametrize("kwargs, field", [({"max_t": 0}, "max_t"), ({"grace_period": -1}, "grace_period"),
                                           ({"reduction_factor": 1}, "reduction_factor"), ({"brackets": 0}, "brackets"),
                                           ({"grace_period": 20, "max_t": 10}, "grace_period"),
                                           ({"mode": "best"}, "mode")])
def test_asha_refuses_bad_arguments(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        ASHAScheduler(**kwargs)


def test_median_stopping_constant_performance():
    rule = MedianStoppingRule(metric="episode_reward_mean", mode="max", grace_period=0, min_samples_required=1)
    basic_setup(rule)
    rule.on_trial_complete("t1", result(10, 1000))
    assert rule.on_trial_result("t2", result(5, 450)) == CONTINUE
    assert rule.on_trial_result("t2", result(6, 0)) == CONTINUE
    assert rule.on_trial_result("t2", result(10, 450)) == STOP  # t1's running mean at 10 is 500


def test_median_stopping_grace_period_and_min_samples():
    rule = MedianStoppingRule(metric="episode_reward_mean", mode="max", grace_period=2.5, min_samples_required=1)
    basic_setup(rule)
    rule.on_trial_complete("t1", result(10, 1000))
    rule.on_trial_complete("t2", result(10, 1000))
    rule.on_trial_add("t3")
    assert rule.on_trial_result("t3", result(1, 10)) == CONTINUE  # inside the grace period
    assert rule.on_trial_result("t3", result(2, 10)) == CONTINUE
    assert rule.on_trial_result("t3", result(3, 10)) == STOP
    lonely = MedianStoppingRule(metric="episode_reward_mean", mode="max", grace_period=0, min_samples_required=3)
    basic_setup(lonely)
    assert lonely.on_trial_result("t2", result(5, 0)) == CONTINUE  # one other trial < 3 required


def test_median_stopping_refuses_what_it_cannot_do():
    with pytest.raises(ConfigError, match="hard_stop"):
        MedianStoppingRule(hard_stop=False)
    with pytest.raises(ConfigError, match="min_time_slice"):
        MedianStoppingRule(min_time_slice=5)


def test_fifo_never_stops_and_metric_mode_come_from_tune_config():
    fifo = FIFOScheduler()
    assert fifo.on_trial_result("a", {"x": 1}) == CONTINUE
    scheduler = ASHAScheduler(metric="loss")
    assert scheduler.set_search_properties(None, "min") and scheduler.mode == "min"
    assert not scheduler.set_search_properties("acc", "min")
