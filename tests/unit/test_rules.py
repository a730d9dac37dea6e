"""The run's two budgets, both `Rules`' (coordinator/policy/loop.py), built from a FailureConfig: the failure
budget (as Ray: retry while failures <= max_failures; -1 is unlimited) and the preemption budget (the next
fit() resumes while preemptions <= max_preemption_failures; -1 is unlimited)."""

from __future__ import annotations

import pytest

from minitrain.config import CheckpointConfig, FailureConfig
from minitrain.coordinator.policy.loop import Rules
from minitrain.driver.trainer import _preemption_error
from minitrain.records import PreemptionInfo, RunOutcome
from minitrain.run_state import RunState
from minitrain.storage.checkpoint_manager import CheckpointManager
from minitrain.storage.filesystem import Storage


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


@pytest.mark.parametrize("budget", [0, 1, 3])
def test_a_preempted_run_is_resumable_while_its_preemptions_stay_within_the_budget(budget):
    rules = Rules.from_config(FailureConfig(max_failures=5, max_preemption_failures=budget))
    assert rules.max_preemption_failures == budget
    assert [rules.allows_resume(n) for n in range(1, budget + 3)] == [n <= budget for n in range(1, budget + 3)]
    assert rules.allows_retry(5)  # the failure budget is untouched by the preemption budget


def test_an_unlimited_preemption_budget_always_resumes():
    rules = Rules.from_config(FailureConfig())  # max_preemption_failures=-1, as Ray's default
    assert rules.max_preemption_failures == -1 and all(rules.allows_resume(n) for n in (1, 10, 10**9))


def test_fit_s_preemption_error_counts_the_run_directory_s_preemptions_and_slurm_s_requeues(tmp_path):
    """The count fit() judges: the larger of the index's count (this preemption noted) and Slurm's requeues
    plus this one (each requeue was a preemption, also one the run directory never saw)."""
    storage = Storage.for_run(str(tmp_path), "run")
    storage.makedirs()
    checkpoints = CheckpointManager.load(storage, CheckpointConfig())
    checkpoints.note_preemption()  # the controller's teardown notes this fit()'s preemption
    outcome = RunOutcome(state=RunState.ABORTED, attempt=0, last_metrics=None, error_message="Training was preempted.",
                         preemption=PreemptionInfo(None, {"n0": [0]}, signal="SIGTERM"))
    within = _preemption_error(outcome, checkpoints, FailureConfig(max_preemption_failures=1))
    assert within.resumable and str(within) == ("Training was preempted. Run the same fit() again (same RunConfig "
                                                "name and storage_path) to resume from it.")
    requeued = _preemption_error(outcome, checkpoints, FailureConfig(max_preemption_failures=1), earlier_requeues=1)
    assert not requeued.resumable and str(requeued) == (
        "Training was preempted. The run was preempted 2 time(s), more than "
        "FailureConfig.max_preemption_failures=1: it is not to be resumed.")


def test_attempts_without_progress_stop_the_run_at_their_limit_whatever_the_failure_budget():
    rules = Rules.from_config(FailureConfig(max_failures=-1))
    assert rules.max_attempts_without_progress == 3  # NVIDIA's resiliency extension's default too
    assert [rules.stops_without_progress(n) for n in range(5)] == [False, False, False, True, True]
    assert rules.allows_retry(3)  # the failure budget alone would go on
    one = Rules.from_config(FailureConfig(max_failures=5, max_attempts_without_progress=1))
    assert not one.stops_without_progress(0) and one.stops_without_progress(1)
    never = Rules.from_config(FailureConfig(max_failures=-1, max_attempts_without_progress=-1))
    assert not any(never.stops_without_progress(n) for n in (1, 3, 10**9))


@pytest.mark.parametrize("value", [0, -2, 1.5, True, None, "3"])
def test_max_attempts_without_progress_is_minus_one_or_at_least_one(value):
    from minitrain.errors import ConfigError

    with pytest.raises(ConfigError, match=r"FailureConfig\.max_attempts_without_progress must be .*"
                                          r"Use N >= 1 .* or -1 to restart as long as max_failures allows"):
        FailureConfig(max_attempts_without_progress=value)
