"""Ray Tune's own tests of BasicVariantGenerator, ported by imports only (python/ray/tune/tests/
test_searchers.py: testPointsToEvaluateBasicVariant*, testConstantGridSearchBasicVariant), plus the
docstring example of points_to_evaluate with num_samples. Ray's `searcher.total_samples` is our
`total_trials(num_samples)`, and its `next_trial()` loop our `suggest()` until FINISHED."""

from __future__ import annotations

from minitrain import tune
from minitrain.tune.search import Searcher
from minitrain.tune.search.basic_variant import BasicVariantGenerator


def _configs(searcher, config, num_samples):
    searcher.set_search_properties(None, None, config)
    total = searcher.total_trials(num_samples)
    configs = []
    while True:
        suggested = searcher.suggest(f"t{len(configs)}")
        if suggested == Searcher.FINISHED:
            break
        configs.append(suggested)
    assert len(configs) == total
    return configs


def test_points_to_evaluate_basic_variant_advanced():
    config = {
        "grid_1": tune.grid_search(["a", "b", "c", "d"]),
        "grid_2": tune.grid_search(["x", "y", "z"]),
        "nested": {
            "random": tune.uniform(2.0, 10.0),
            "dependent": tune.sample_from(lambda spec: -1.0 * spec.config.nested.random),
        },
    }
    points = [{"grid_1": "b"}, {"grid_2": "z"}, {"grid_1": "a", "grid_2": "y"}, {"nested": {"random": 8.0}}]

    def total(points_):
        searcher = BasicVariantGenerator(points_to_evaluate=points_)
        searcher.set_search_properties(None, None, config)
        return searcher.total_trials(6)

    # a point that sets a grid variable is grid-searched over the others only
    assert total([points[0]]) == 1 * 3 + 5 * 12
    assert total([points[1]]) == 1 * 4 + 5 * 12
    assert total([points[2]]) == 1 + 5 * 12
    assert total(points) == 1 * 3 + 1 * 4 + 1 + 3 * 12

    configs = _configs(BasicVariantGenerator(points_to_evaluate=points), config, 6)
    assert len(configs) == 1 * 3 + 1 * 4 + 1 + 3 * 12
    assert all(c["grid_1"] == "b" for c in configs[0:3])
    assert all(c["grid_2"] == "z" for c in configs[3:7])
    assert configs[7]["grid_1"] == "a" and configs[7]["grid_2"] == "y"
    assert configs[8]["nested"]["random"] == 8.0 and configs[8]["nested"]["dependent"] == -8.0


def test_points_to_evaluate_basic_variant_fixed_param():
    configs = _configs(BasicVariantGenerator(points_to_evaluate=[{"a": 1, "b": 2}]),
                       {"a": 1, "b": tune.randint(0, 3)}, 2)
    assert [c["a"] for c in configs] == [1, 1] and configs[0]["b"] == 2


def test_points_to_evaluate_basic_variant():
    config = {"metric": tune.choice([1, 2, 3, 4]), "a": tune.choice(["t1", "t2", "t3", "t4"]),
              "b": tune.randint(0, 5), "c": tune.loguniform(1e-4, 1e-1)}
    points = [{"metric": 1, "a": "t1", "b": 0, "c": 0.01}, {"metric": 2, "a": "t2"}]
    configs = _configs(BasicVariantGenerator(points_to_evaluate=points), config, 5)
    assert len(configs) == 5  # the points are the first 2 of the 5 samples
    assert configs[0] == points[0]
    assert configs[1]["metric"] == 2 and configs[1]["a"] == "t2" and 0 <= configs[1]["b"] < 5


def test_more_points_than_num_samples_are_all_evaluated():
    configs = _configs(BasicVariantGenerator(points_to_evaluate=[{"x": 1}, {"x": 2}, {"x": 3}]),
                       {"x": tune.uniform(0, 1)}, 2)
    assert [c["x"] for c in configs] == [1, 2, 3]


def test_rays_docstring_example_six_trials_from_four_samples():
    """BasicVariantGenerator's docstring: 3 points and num_samples=4 over a 2-value grid give 6 trials."""
    points = [{"a": 2, "b": 2}, {"a": 1}, {"b": 2}]
    configs = _configs(BasicVariantGenerator(points_to_evaluate=points, random_state=0),
                       {"a": tune.grid_search([1, 2]), "b": tune.randint(0, 3)}, 4)
    assert len(configs) == 6
    assert configs[0] == {"a": 2, "b": 2}
    assert configs[1]["a"] == 1
    assert [c["a"] for c in configs[2:4]] == [1, 2] and all(c["b"] == 2 for c in configs[2:4])
    assert [c["a"] for c in configs[4:6]] == [1, 2]


def test_constant_grid_search_basic_variant():
    config = {
        "grid": tune.grid_search([1, 2, 3]),
        "rand": tune.uniform(0, 1000),
        "dependent_rand": tune.sample_from(lambda spec: spec.config.rand / 10),
        "dependent_grid": tune.sample_from(lambda spec: spec.config.grid / 10),
    }
    num_samples = 6
    configs = _configs(BasicVariantGenerator(constant_grid_search=False), config, num_samples)
    for i in range(num_samples):
        sub = configs[i * 3:i * 3 + 3]  # a fresh random value for each grid value
        assert sub[0]["rand"] != sub[1]["rand"] and sub[0]["rand"] != sub[2]["rand"]
    configs = _configs(BasicVariantGenerator(constant_grid_search=True), config, num_samples)
    for i in range(num_samples):
        sub = configs[i * 3:i * 3 + 3]  # sampled once, kept across the grid
        assert sub[0]["rand"] == sub[1]["rand"] == sub[2]["rand"]
        assert [c["dependent_grid"] for c in sub] == [0.1, 0.2, 0.3]
        assert all(c["dependent_rand"] == c["rand"] / 10 for c in sub)
    assert configs[0]["grid"] == configs[3]["grid"] and configs[0]["rand"] != configs[3]["rand"]


def test_grid_times_num_samples():
    """BasicVariantGenerator's first docstring example: a 2-value grid x num_samples=4 is 8 trials."""
    configs = _configs(BasicVariantGenerator(), {"a": tune.grid_search([1, 2]), "b": tune.randint(0, 3)}, 4)
    assert [c["a"] for c in configs] == [1, 2] * 4
