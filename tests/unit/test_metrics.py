"""minitrain.metrics.encode_metrics: JSON-safe metrics, and errors that name the offending key."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minitrain.metrics import encode_metrics

np = pytest.importorskip("numpy")


def _same(a, b) -> bool:
    """Equality that treats NaN as equal to NaN."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b and type(a) is type(b)


def test_json_safe_dict_round_trips():
    metrics = {"loss": 0.25, "step": 10, "ok": True, "note": "hi", "none": None,
               "nested": {"acc": [0.5, 0.75], "deep": {"x": -1}}, "empty": {}, "list": []}
    assert _same(json.loads(encode_metrics(metrics)), metrics)


def test_nan_and_infinities_are_allowed():
    text = encode_metrics({"loss": float("nan"), "hi": float("inf"), "lo": float("-inf")})
    back = json.loads(text)
    assert math.isnan(back["loss"]) and back["hi"] == math.inf and back["lo"] == -math.inf


def test_tuples_become_lists():
    assert json.loads(encode_metrics({"t": (1, 2)})) == {"t": [1, 2]}


json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-2**53, 2**53), st.floats(allow_nan=True),
                      st.text(max_size=10))
json_value = st.recursive(json_leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=5), inner, max_size=4)), max_leaves=20)


@settings(max_examples=100, deadline=None, database=None)  # no example files in the repo
@given(st.dictionaries(st.text(max_size=8), json_value, max_size=6))
def test_property_json_safe_values_round_trip(metrics):
    assert _same(json.loads(encode_metrics(metrics)), metrics)


@pytest.mark.parametrize(("value", "expected"), [
    (np.float32(1.5), 1.5), (np.float64(0.125), 0.125), (np.int64(7), 7), (np.int8(-3), -3),
    (np.uint16(9), 9), (np.bool_(True), True), (np.array(2.5), 2.5),
])
def test_numpy_scalars_are_accepted(value, expected):
    back = json.loads(encode_metrics({"v": value, "nested": {"in": [value]}}))
    assert back == {"v": expected, "nested": {"in": [expected]}}
    assert type(back["v"]) is type(expected)


def test_numpy_array_is_refused_naming_the_path():
    with pytest.raises(ValueError) as info:
        encode_metrics({"a": {"b": [1, np.arange(3)]}})
    assert "'a/b[1]'" in str(info.value) and "numpy.ndarray" in str(info.value)


def test_torch_tensor_is_refused_naming_the_nested_key():
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError) as info:
        encode_metrics({"ok": 1.0, "a": {"b": torch.tensor(0.5)}})
    text = str(info.value)
    assert "metrics['a/b']" in text
    assert "torch.Tensor" in text and ".item()" in text


def test_top_level_tensor_names_its_key():
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match=r"metrics\['loss'\]"):
        encode_metrics({"loss": torch.ones(2)})


def test_arbitrary_object_is_refused_naming_the_key():
    class Thing:
        pass

    with pytest.raises(ValueError) as info:
        encode_metrics({"x": [{"y": Thing()}]})
    assert "'x[0]/y'" in str(info.value) and "Thing" in str(info.value)


@pytest.mark.parametrize("value", [None, [1, 2], 3.0, "loss", (("a", 1),)])
def test_non_dict_is_refused(value):
    with pytest.raises(ValueError, match="expects a dict"):
        encode_metrics(value)


def test_non_string_key_that_json_cannot_take_is_a_value_error():
    with pytest.raises(ValueError, match="not a string"):
        encode_metrics({(1, 2): 3.0})


def test_circular_reference_is_a_value_error():
    metrics: dict = {"loss": 1.0}
    metrics["self"] = metrics
    with pytest.raises(ValueError):
        encode_metrics(metrics)


def test_numpy_complex_scalar_names_its_key():
    with pytest.raises(ValueError, match=r"metrics\['z'\]"):
        encode_metrics({"z": np.complex128(1 + 2j)})
