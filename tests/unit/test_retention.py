"""The pure retention core: manager order, top-K plus latest, best_checkpoints (minitrain.storage.retention).

The property tests compare `retain` with a reference written straight from the documented rules
(a pairwise "is better than" relation), for any sequence of rounds: missing scores, NaN, ties, both
orders, K in 1..5 or None.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minitrain.storage.retention import (CheckpointRecord, best_checkpoints, flatten_metrics, manager_order, retain,
                                 score_of)

MISSING = object()  # the round's metrics lack the attribute
NAN = float("nan")

scores = st.one_of(
    st.just(MISSING), st.none(), st.just(NAN),
    st.integers(-3, 3),  # small range: many ties
    st.floats(allow_nan=False, width=32),  # includes +-inf
)
rounds = st.lists(st.tuples(scores, st.integers(1, 3)), max_size=14)  # (score, gap to the previous round)
keeps = st.one_of(st.none(), st.integers(1, 5))
orders = st.sampled_from(["max", "min"])
attributes = st.sampled_from([None, "score", "val/acc"])


def _metrics(score, attribute):
    metrics = {"epoch": 1}
    if score is MISSING or attribute is None:
        return metrics
    if attribute == "val/acc":
        metrics["val"] = {"acc": score, "loss": 0.5}
    else:
        metrics[attribute] = score
    return metrics


def make_records(drawn, attribute):
    records, index = [], 0
    for score, gap in drawn:
        index += gap
        records.append(CheckpointRecord(f"checkpoint_{index:06d}", _metrics(score, attribute), index))
    return records


def _valid(score):
    return score is not None and not math.isnan(score)


def better(a, b, attribute, order):
    """Reference: is `a` a better checkpoint than `b`? (the documented order, written pairwise)"""
    if attribute is None:
        return a.report_index > b.report_index
    sa, sb = score_of(a, attribute), score_of(b, attribute)
    if _valid(sa) != _valid(sb):
        return _valid(sa)
    if not _valid(sa) or sa == sb:
        return a.report_index > b.report_index  # the more recent counts as better
    return sa > sb if order == "max" else sa < sb


def reference_top(records, num_to_keep, attribute, order):
    """The records fewer than `num_to_keep` others beat."""
    return {r.dir_name for r in records
            if sum(better(other, r, attribute, order) for other in records) < num_to_keep}


def reference_kept(records, num_to_keep, attribute, order):
    if not records:
        return set()
    if num_to_keep is None:
        return {r.dir_name for r in records}
    top = reference_top(records, num_to_keep, attribute, order)
    latest = max(records, key=lambda r: r.report_index)
    return top | {latest.dir_name}


def names(records):
    return [r.dir_name for r in records]


@settings(max_examples=300, deadline=None, database=None)  # no example files in the repo
@given(drawn=rounds, num_to_keep=keeps, attribute=attributes, order=orders)
def test_retain_keeps_exactly_the_top_k_plus_the_latest(drawn, num_to_keep, attribute, order):
    records = make_records(drawn, attribute)
    result = retain(records, num_to_keep, attribute, order)
    kept, evicted = names(result.kept), names(result.evicted)
    assert set(kept) == reference_kept(records, num_to_keep, attribute, order)
    assert not set(kept) & set(evicted)
    assert sorted(kept + evicted) == sorted(names(records))
    if num_to_keep is not None:
        assert len(kept) <= num_to_keep + 1
    if records:
        assert max(records, key=lambda r: r.report_index).dir_name in kept
    assert kept == names(manager_order(result.kept, attribute, order))
    expected_missing = [] if attribute is None else [
        r.dir_name for r in manager_order(records, attribute, order) if score_of(r, attribute) is None]
    assert list(result.missing_attribute) == expected_missing


@settings(max_examples=300, deadline=None, database=None)
@given(drawn=rounds, attribute=attributes, order=orders)
def test_manager_order_is_worst_first(drawn, attribute, order):
    ordered = manager_order(make_records(drawn, attribute), attribute, order)
    for i in range(len(ordered) - 1):
        assert better(ordered[i + 1], ordered[i], attribute, order)


@settings(max_examples=200, deadline=None, database=None)
@given(drawn=rounds, num_to_keep=keeps, attribute=attributes, order=orders)
def test_committing_round_by_round_equals_retaining_all_at_once(drawn, num_to_keep, attribute, order):
    """What the manager does (retain after every commit) never loses a checkpoint the batch keeps."""
    records = make_records(drawn, attribute)
    kept, evicted = [], []
    for record in records:
        result = retain(kept + [record], num_to_keep, attribute, order)
        kept, evicted = list(result.kept), evicted + list(result.evicted)
        assert record in result.kept  # the latest is always kept
    assert set(names(kept)) == reference_kept(records, num_to_keep, attribute, order)
    assert sorted(names(kept) + names(evicted)) == sorted(names(records))


@settings(max_examples=200, deadline=None, database=None)
@given(drawn=rounds, num_to_keep=keeps, attribute=attributes, order=orders)
def test_best_checkpoints_is_the_last_k_of_manager_order(drawn, num_to_keep, attribute, order):
    kept = retain(make_records(drawn, attribute), num_to_keep, attribute, order).kept
    best = best_checkpoints(kept, num_to_keep, attribute, order)
    ordered = manager_order(kept, attribute, order)
    assert best == (ordered if num_to_keep is None else ordered[-num_to_keep:])
    if num_to_keep is not None:  # the K best by the reference relation; the latest only if among them
        assert set(names(best)) == reference_top(list(kept), num_to_keep, attribute, order)


def test_rays_observed_example():
    """Ray 2.60, num_to_keep=2, "max", scores [5, None, 1, 7, None, 3]: disk keeps 5, 7 and the latest 3."""
    records = [CheckpointRecord(f"c{i}", {} if s is None else {"score": s}, i)
               for i, s in enumerate([5, None, 1, 7, None, 3], start=1)]
    result = retain(records, 2, "score", "max")
    assert names(result.kept) == ["c6", "c1", "c4"]  # manager order: 3, 5, 7
    assert names(result.evicted) == ["c2", "c5", "c3"]  # missing (oldest first), then 1
    assert result.missing_attribute == ("c2", "c5")
    assert names(best_checkpoints(result.kept, 2, "score", "max")) == ["c1", "c4"]  # excludes the latest


def test_missing_attribute_ranks_worst_under_min_too():
    """Deliberate fix of Ray's quirk: under "min" Ray ranks a missing metric best (+inf)."""
    records = [CheckpointRecord("a", {"loss": 0.1}, 1), CheckpointRecord("b", {}, 2),
               CheckpointRecord("c", {"loss": 0.5}, 3), CheckpointRecord("d", {"loss": NAN}, 4),
               CheckpointRecord("e", {"loss": 0.3}, 5)]
    assert names(manager_order(records, "loss", "min")) == ["b", "d", "c", "e", "a"]
    assert names(retain(records, 2, "loss", "min").kept) == ["e", "a"]


def test_ties_prefer_the_more_recent():
    records = [CheckpointRecord("old", {"s": 1}, 1), CheckpointRecord("new", {"s": 1}, 2),
               CheckpointRecord("last", {"s": 0}, 3)]
    assert names(retain(records, 1, "s", "max").kept) == ["last", "new"]


def test_without_attribute_recency_decides():
    records = [CheckpointRecord(f"c{i}", {"s": -i}, i) for i in (3, 1, 2, 5, 4)]
    assert names(manager_order(records, None, "max")) == ["c1", "c2", "c3", "c4", "c5"]
    assert names(retain(records, 2, None, "min").kept) == ["c4", "c5"]
    assert retain([], 2, "s", "max").kept == ()


@pytest.mark.parametrize("value", ["high", [1.0], True, {"x": 1}.keys()])
def test_non_numeric_score_raises_naming_attribute_value_and_dir(value):
    record = CheckpointRecord("checkpoint_000003", {"acc": value}, 3)
    with pytest.raises(ValueError) as info:
        retain([CheckpointRecord("checkpoint_000001", {"acc": 1.0}, 1), record], 1, "acc", "max")
    text = str(info.value)
    assert "'acc'" in text and repr(value) in text and "checkpoint_000003" in text and "not a number" in text


def test_score_of():
    record = CheckpointRecord("c", {"a": {"b": 2}, "n": NAN, "none": None, "big": 10**400, "neg": -10**400}, 1)
    assert score_of(record, "a/b") == 2.0 and isinstance(score_of(record, "a/b"), float)
    assert math.isnan(score_of(record, "n"))
    assert score_of(record, "none") is None and score_of(record, "absent") is None and score_of(record, "a") is None
    assert score_of(record, "big") == math.inf and score_of(record, "neg") == -math.inf


def test_flatten_metrics_like_rays_flatten_dict():
    assert flatten_metrics({"a": {"b": {"c": 1}, "d": 2}, "e": [1, {"f": 3}], "g": {}, 1: "x"}) == \
        {"a/b/c": 1, "a/d": 2, "e": [1, {"f": 3}], "1": "x"}


@pytest.mark.parametrize(("num_to_keep", "order"), [(0, "max"), (-1, "max"), (True, "max"), (2, "MAX")])
def test_bad_arguments_raise_value_error(num_to_keep, order):
    with pytest.raises(ValueError):
        retain([], num_to_keep, None, order)
