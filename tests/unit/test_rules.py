"""The run's one failure budget: `Rules` (coordinator/policy/loop.py), built from a FailureConfig (as Ray: retry while
failures <= max_failures; -1 is unlimited)."""

from __future__ import annotations

import pytest

from minitrain.config import FailureConfig
from minitrain.coordinator.policy.loop import Rules


def test_rules_are_built_from_the_failure_config():
    rules = Rules.from_config(FailureConfig(max_failures=3, worker_stop_grace_s=7.5), agent_start_timeout_s=12.0)
    assert (rules.max_failures, rules.stop_grace_s, rules.agent_start_timeout_s) == (3, 7.5, 12.0)
    assert Rules.from_config(FailureConfig()) == Rules(max_failures=0, stop_grace_s=5.0)


def test_max_failures_zero_never_retries():
    rules = Rules.from_config(FailureConfig(max_failures=0))
    assert not rules.allows_retry(1)
    assert rules.retries_left(0) == 0


def test_max_failures_one_retries_once():
    rules = Rules.from_config(FailureConfig(max_failures=1))
    assert rules.retries_left(0) == 1
    assert rules.allows_retry(1) and rules.retries_left(1) == 0
    assert not rules.allows_retry(2) and rules.retries_left(2) == 0


def test_max_failures_minus_one_is_unlimited():
    rules = Rules.from_config(FailureConfig(max_failures=-1))
    assert all(rules.allows_retry(n) for n in (1, 10, 10**9))
    assert rules.retries_left(10**9) is None


@pytest.mark.parametrize("max_failures", [0, 1, 2, 5])
def test_retries_left_counts_down_to_the_last_allowed_retry(max_failures):
    rules = Rules(max_failures=max_failures, stop_grace_s=1.0)
    for failures in range(max_failures + 3):
        left = rules.retries_left(failures)
        assert left == max(0, max_failures - failures)
        # one more failure is retried exactly when a retry is left
        assert rules.allows_retry(failures + 1) == (left > 0)


def test_the_preemption_budget_is_validated_but_not_a_second_budget():
    # A preemption ends the fit() (counted in the index for the next one): it never spends max_failures.
    assert FailureConfig(max_preemption_failures=3).max_preemption_failures == 3
    rules = Rules.from_config(FailureConfig(max_failures=0, max_preemption_failures=3))
    assert not rules.allows_retry(1)
