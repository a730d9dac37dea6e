"""`TuneConfig(num_samples=-1, time_budget_s=datetime.timedelta(...))` end to end: the sweep samples
trial after trial until the budget is spent, then starts none and stops the running one (Ray: the
time budget stops every trial, which ends TERMINATED). One short real sweep, trials as real processes."""

from __future__ import annotations

import datetime
import threading

import pytest

from minitrain import tune
from minitrain.tune.search import BasicVariantGenerator

pytestmark = pytest.mark.e2e

SEED = 2  # its first draws of x: 0.26, 0.30, then 0.81 (a trial that runs until it is stopped)


def short_or_endless(config):
    """x < 0.7: one result and done; else one result, then it blocks and reports nothing more, so only
    the tuner stopping its process ends it (a STOP answered to a next result never comes)."""
    tune.report({"x": config["x"]})
    if config["x"] >= 0.7:
        threading.Event().wait()


@pytest.mark.timeout(90)  # without the budget's stop the blocked trial never ends
def test_num_samples_minus_one_samples_until_the_budget_then_stops_the_running_trial(tmp_path):
    tuner = tune.Tuner(short_or_endless, param_space={"x": tune.uniform(0, 1)},
                       tune_config=tune.TuneConfig(num_samples=-1, time_budget_s=datetime.timedelta(seconds=4),
                                                   max_concurrent_trials=1,
                                                   search_alg=BasicVariantGenerator(random_state=SEED)),
                       run_config=tune.RunConfig(name="budget", storage_path=str(tmp_path), verbose=0))
    results = tuner.fit()
    assert results.num_errors == 0 and results.num_terminated == len(results)
    # one trial at a time and the third never ends by itself: the budget ends the sweep there
    assert 1 <= len(results) <= 3
    for result in results:
        x = result.config["x"]
        if result.metrics is not None:  # None only if the budget ran out before its first result
            assert result.metrics["training_iteration"] == 1 and result.metrics["done"] is True
        if x >= 0.7:  # it ran until the budget was spent, and was stopped then
            assert "time_budget_s=4.0" in result.stop_reason
        else:  # it ended by itself (or, on a slow machine, was running when the budget ran out)
            assert result.stop_reason in (None, "time_budget_s=4.0 reached")
    assert [r.config["x"] >= 0.7 for r in results][:2] == [False, False][:len(results)]
