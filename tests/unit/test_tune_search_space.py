"""minitrain.tune search spaces resolve as Ray's BasicVariantGenerator does (behaviour ported from
ray/tune/tests/test_sample.py and test_var.py: bounds, quantization, grid order and counts, sample_from)."""

from __future__ import annotations

import numpy as np
import pytest

from minitrain.tune import search_space as ss
from minitrain.tune.search_space import count_variants, generate_variants


def _draw(domain, n=1000, seed=0):
    rng = np.random.default_rng(seed)
    return [domain.sample(rng) for _ in range(n)]


def test_samplers_respect_bounds_types_and_quantization():
    assert all(1 <= v < 10 and isinstance(v, float) for v in _draw(ss.uniform(1, 10)))
    q = _draw(ss.quniform(2, 10, 0.5))
    assert all(2 <= v <= 10 and abs(v / 0.5 - round(v / 0.5)) < 1e-9 for v in q)
    log = _draw(ss.loguniform(1e-4, 1e-1))
    assert all(1e-4 <= v < 1e-1 for v in log) and min(log) < 1e-3 < max(log)
    qlog = _draw(ss.qloguniform(1e-4, 1e-1, 5e-5))
    assert all(1e-4 <= v <= 1e-1 + 1e-12 and abs(v / 5e-5 - round(v / 5e-5)) < 1e-6 for v in qlog)
    ints = _draw(ss.randint(-9, 15))
    assert all(isinstance(v, int) and -9 <= v < 15 for v in ints) and set(ints) == set(range(-9, 15))
    qints = _draw(ss.qrandint(-21, 12, 3))
    assert all(v % 3 == 0 and -21 <= v <= 12 for v in qints) and 12 in qints  # upper inclusive with q
    assert set(_draw(ss.qrandint(0, 3))) == {0, 1, 2}  # q=1: Ray's randint, upper exclusive
    lints = _draw(ss.lograndint(1, 1000))
    assert all(1 <= v < 1000 for v in lints) and sum(v < 32 for v in lints) > 400  # log-uniform mass
    normal = _draw(ss.randn(10, 2), n=4000)
    assert abs(np.mean(normal) - 10) < 0.2 and abs(np.std(normal) - 2) < 0.2
    assert all(abs(v / 0.2 - round(v / 0.2)) < 1e-9 for v in _draw(ss.qrandn(10, 2, 0.2)))
    cats = _draw(ss.choice(["a", 2, None]))
    assert set(map(repr, cats)) == {"'a'", "2", "None"}  # types are kept (no numpy coercion)


@pytest.mark.parametrize("make, message", [
    (lambda: ss.loguniform(0, 1), "lower bound greater than 0"),
    (lambda: ss.uniform(2, 1), "lower must be smaller"),
    (lambda: ss.quniform(0, 1.05, 0.1), "not divisible by quantization factor"),
    (lambda: ss.randint(0, 1.5), "must be an int"),
    (lambda: ss.randn(0, 0), "SD has to be strictly greater than 0"),
    (lambda: ss.choice([]), "non-empty list"),
    (lambda: ss.sample_from(lambda a, b: a), "0 or 1 parameters"),
    (lambda: ss.grid_search("abc"), "list of values"),
])
def test_bad_domains_are_refused_with_the_reason(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_grid_product_first_sorted_variable_varies_fastest():
    space = {"b": ss.grid_search([1, 2]), "a": ss.grid_search(["x", "y", "z"]), "c": 5}
    configs = list(generate_variants(space))
    assert [(c["a"], c["b"]) for c in configs] == [("x", 1), ("y", 1), ("z", 1), ("x", 2), ("y", 2), ("z", 2)]
    assert all(c["c"] == 5 for c in configs)


def test_num_samples_repeats_the_whole_grid_with_fresh_samples():
    space = {"lr": ss.uniform(0, 1), "opt": ss.grid_search(["sgd", "adam"]), "nested": {"k": ss.randint(0, 100)}}
    configs = list(generate_variants(space, num_samples=3, rng=ss.make_rng(7)))
    assert count_variants(space, 3) == len(configs) == 6
    assert [c["opt"] for c in configs] == ["sgd", "adam"] * 3
    assert len({c["lr"] for c in configs}) == 6  # each trial its own sample
    assert all(isinstance(c["nested"]["k"], int) for c in configs)
    assert space["lr"].kind == "uniform"  # the param space itself is left alone


def test_constant_grid_search_keeps_the_random_values_across_the_grid():
    space = {"lr": ss.uniform(0, 1), "opt": ss.grid_search(["sgd", "adam"])}
    configs = list(generate_variants(space, num_samples=2, rng=ss.make_rng(1), constant_grid_search=True))
    assert configs[0]["lr"] == configs[1]["lr"] != configs[2]["lr"] == configs[3]["lr"]


def test_the_same_seed_gives_the_same_configs():
    space = {"a": ss.loguniform(1e-5, 1e-1), "b": {"c": ss.choice([1, 2, 3]), "d": [ss.randn(), 4]},
             "g": ss.grid_search([0, 1])}
    first = list(generate_variants(space, 4, ss.make_rng(123)))
    again = list(generate_variants(space, 4, ss.make_rng(123)))
    other = list(generate_variants(space, 4, ss.make_rng(124)))
    assert first == again and first != other
    assert first[0]["b"]["d"][1] == 4 and isinstance(first[0]["b"]["d"][0], float)  # lists resolve too


def test_sample_from_sees_the_config_and_waits_for_its_inputs():
    space = {
        "double": ss.sample_from(lambda spec: spec.config.base * 2),  # listed before its input
        "base": ss.randint(1, 10),
        "plain": ss.sample_from(lambda config: config["base"] + 1),
        "const": ss.sample_from(lambda: "k"),
        "grid_dep": ss.sample_from(lambda spec: spec.config.g * 10),
        "g": ss.grid_search([1, 2]),
    }
    for config in generate_variants(space, num_samples=3, rng=ss.make_rng(0)):
        assert config["double"] == 2 * config["base"] and config["plain"] == config["base"] + 1
        assert config["const"] == "k" and config["grid_dep"] == 10 * config["g"]


def test_sample_from_on_a_value_never_sampled_is_a_clear_error():
    space = {"a": ss.sample_from(lambda spec: spec.config.b), "b": ss.sample_from(lambda spec: spec.config.a)}
    with pytest.raises(ValueError, match="could not resolve a, b"):
        list(generate_variants(space))


def test_grid_of_domains_is_resolved_after_the_grid():
    space = {"x": ss.grid_search([ss.choice([5]), 7])}
    assert [c["x"] for c in generate_variants(space)] == [5, 7]
