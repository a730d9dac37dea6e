"""When a silent rank counts as hung: the fixed deadline, the adaptive "auto" one, uploads, and the pace
kept across restarts (coordinator/policy/hangs.py, pure)."""

from __future__ import annotations

import pytest

from minitrain.config import FailureConfig
from minitrain.coordinator.policy.hangs import PACE_WINDOW, START_ALLOWANCE_S, HangRule, Pace
from minitrain.errors import ConfigError


def _deadline(rule, slowest, starting=False, uploading=False):
    return rule.deadline_s(slowest, starting=starting, uploading=uploading)


def test_auto_is_the_default_judges_nothing_before_a_pace_and_gives_a_restart_its_allowance():
    rule = HangRule()
    assert FailureConfig().worker_hang_timeout_s == "auto"
    # Start-up and the first steps of a run: an hour-long first epoch looks like a hang, so no judgement.
    assert _deadline(rule, None, starting=True) is None
    assert _deadline(rule, None) is None
    assert _deadline(rule, None, uploading=True) is None
    assert _deadline(rule, 3.0) == 600.0  # the floor, once a pace is known
    # The first step of a later attempt (a restore, a recompilation) gets the allowance.
    assert _deadline(rule, 3.0, starting=True) == START_ALLOWANCE_S == 1800.0
    assert _deadline(rule, 300.0, starting=True) == 3000.0


def test_auto_deadline_is_ten_times_the_slowest_recent_interval_above_the_floor():
    rule = HangRule(floor_s=5.0)
    assert _deadline(rule, 0.3) == 5.0
    assert _deadline(rule, 2.0) == 20.0


def test_pace_keeps_the_slowest_of_the_last_window_once_two_intervals_are_known():
    pace = Pace()
    pace.reported(0, 0.0)
    pace.reported(0, 100.0)  # one slow interval is not a pace yet
    assert pace.slowest(0) is None
    for i in range(1, PACE_WINDOW + 1):
        pace.reported(0, 100.0 + i)
    # Only the last PACE_WINDOW intervals count: the old slow one stops widening the deadline.
    assert pace.slowest(0) == 1.0


def test_a_rank_without_a_pace_of_its_own_is_judged_by_the_group_s():
    """The rank that froze first has the least history: it must not escape with the first-step allowance
    while a peer that merely waits for it is named (seen on a SIGSTOPped rank after two reports)."""
    pace = Pace()
    assert pace.slowest(1) is None and pace.group_slowest() is None
    for now in (0.0, 0.5, 1.0, 3.0):
        pace.reported(0, now)
    pace.reported(1, 0.0)
    pace.reported(1, 0.5)
    assert pace.slowest(1) == pace.group_slowest() == 2.0
    assert pace.slowest(0) == 2.0


def test_an_upload_gets_its_allowance_whatever_the_rule():
    assert _deadline(HangRule(floor_s=5.0), 1.0, uploading=True) == 1800.0
    assert _deadline(HangRule(timeout_s=30.0), None, uploading=True) == 1800.0
    assert _deadline(HangRule(timeout_s=5000.0), None, uploading=True) == 5000.0


def test_a_fixed_timeout_applies_from_the_start_and_none_disables_the_check():
    assert _deadline(HangRule(timeout_s=30.0), None, starting=True) == 30.0
    assert _deadline(HangRule(timeout_s=None), 1.0) is None
    assert _deadline(HangRule(timeout_s=None), 1.0, uploading=True) is None


def test_the_explanation_names_the_rule_and_the_numbers():
    auto = HangRule(floor_s=5.0).explain(0.4, starting=False, uploading=False)
    assert "'auto'" in auto and "0.4 s" in auto and "worker_hang_floor_s=5" in auto
    first = HangRule().explain(2.0, starting=True, uploading=False)
    assert "(2 s)" in first and "at least 1800 s for its first step" in first
    assert HangRule(timeout_s=30.0).explain(None, starting=True, uploading=True) == (
        "FailureConfig.worker_hang_timeout_s=30; at least 1800 s while it uploads a checkpoint")


def test_pace_skips_the_interval_that_spans_a_start_and_survives_a_restart():
    pace = Pace()
    pace.started(0)
    pace.reported(0, 100.0)  # first report after start-up: opens the chain, no interval
    pace.reported(0, 101.0)
    pace.reported(0, 103.0)
    assert pace.intervals(0) == (1.0, 2.0) and pace.slowest(0) == 2.0
    pace.started(0)  # a restart: restore and warm-up do not count
    pace.reported(0, 500.0)
    pace.reported(0, 501.5)
    assert pace.intervals(0) == (1.0, 2.0, 1.5) and pace.slowest(0) == 2.0
    assert pace.intervals(1) == () and pace.slowest(1) == 2.0  # the group's


@pytest.mark.parametrize("kwargs, field", [
    ({"worker_hang_timeout_s": "Auto"}, "worker_hang_timeout_s"),
    ({"worker_hang_timeout_s": 0}, "worker_hang_timeout_s"),
    ({"worker_hang_floor_s": -1}, "worker_hang_floor_s"),
    ({"worker_hang_floor_s": 5, "worker_hang_timeout_s": 30}, "worker_hang_floor_s"),
    ({"worker_hang_floor_s": 5, "worker_hang_timeout_s": None}, "worker_hang_floor_s"),
])
def test_bad_hang_settings_name_the_field_and_the_fix(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        FailureConfig(**kwargs)
