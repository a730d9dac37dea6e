"""Ray Tune parity of search spaces and what the results say about them (ported from Ray's
tune/tests/test_sample.py and test_var.py): choice over dicts, grids anywhere in nested dicts and lists,
chained sample_from, the quantised, log and normal samplers, and that a trial's config, `result.config`
and `ResultGrid.get_dataframe()`'s `config/...` columns agree, nested keys flattened as Ray flattens
them; a nested metric ranks trials by its "a/b" name, as Ray's `unflattened_lookup`."""

from __future__ import annotations

import math

import pytest

from minitrain import tune
from minitrain.storage import sweep_state as tr
from minitrain.storage.retention import flatten_metrics
from minitrain.tune.result_grid import ResultGrid, trial_result
from minitrain.tune.search_space import generate_variants, make_rng


def _configs(space, num_samples=1, seed=0):
    return list(generate_variants(space, num_samples, make_rng(seed)))


def test_choice_over_dicts_gives_the_chosen_dict_itself():
    options = [{"name": "sgd", "momentum": 0.9}, {"name": "adam", "betas": [0.9, 0.99]}]
    configs = _configs({"optimizer": tune.choice(options)}, num_samples=40)
    assert all(c["optimizer"] in options for c in configs)
    assert {c["optimizer"]["name"] for c in configs} == {"sgd", "adam"}
    configs[0]["optimizer"]["name"] = "changed"  # each trial holds its own copy
    assert options[0]["name"] == "sgd" and options[1]["name"] == "adam"


def test_a_domain_inside_a_chosen_dict_is_sampled_too():
    configs = _configs({"opt": tune.choice([{"lr": tune.uniform(0.5, 1.0)}])}, num_samples=5)
    assert all(0.5 <= c["opt"]["lr"] < 1.0 for c in configs)


def test_grid_search_is_expanded_wherever_it_sits():
    space = {"model": {"layers": [tune.grid_search([1, 2]), {"width": tune.grid_search([8, 16])}]},
             "deep": {"a": {"b": {"c": tune.grid_search(["x", "y", "z"])}}}, "const": 3}
    configs = _configs(space)
    assert len(configs) == 2 * 2 * 3
    combos = {(c["model"]["layers"][0], c["model"]["layers"][1]["width"], c["deep"]["a"]["b"]["c"]) for c in configs}
    assert combos == {(a, w, c) for a in (1, 2) for w in (8, 16) for c in "xyz"}
    assert all(c["const"] == 3 for c in configs)


def test_ray_dependent_lambda_over_a_grid():
    """Ray's testDependentLambda: `y` reads the grid value `x` of its own trial."""
    configs = _configs({"x": tune.grid_search([1, 2]), "y": tune.sample_from(lambda spec: spec.config.x * 100)})
    assert configs == [{"x": 1, "y": 100}, {"x": 2, "y": 200}]


def test_ray_nested_values():
    """Ray's testNestedValues: a function reads a nested value another function resolved."""
    space = {"x": {"y": {"z": tune.sample_from(lambda spec: 1)}}, "y": tune.sample_from(lambda spec: 12),
             "z": tune.sample_from(lambda spec: spec.config.x.y.z * 100)}
    assert _configs(space) == [{"x": {"y": {"z": 1}}, "y": 12, "z": 100}]


def test_a_chain_of_sample_from_resolves_in_dependency_order_whatever_the_dict_order():
    space = {"a": tune.sample_from(lambda spec: spec.config.b * 2),
             "b": tune.sample_from(lambda spec: spec.config.nested.c + 1),
             "nested": {"c": tune.sample_from(lambda config: config["d"] * 10)}, "d": tune.randint(1, 5)}
    for config in _configs(space, num_samples=10):
        assert config["nested"]["c"] == config["d"] * 10
        assert config["b"] == config["nested"]["c"] + 1 and config["a"] == config["b"] * 2


def test_a_circular_dependency_is_a_clear_error():
    with pytest.raises(ValueError, match="circular"):
        _configs({"foo": tune.sample_from(lambda spec: spec.config.foo)})


def test_ray_quantized_bounds_must_be_multiples_of_q():
    """Ray's testQuantized: a bound that is not a multiple of q is refused; samples stay in bounds."""
    with pytest.raises(ValueError, match="divisible"):
        tune.quniform(1e-4, 1e-1, 5e-4)
    with pytest.raises(ValueError, match="divisible"):
        tune.quniform(0, 32, 3)
    rng = make_rng(0)
    samples = [tune.qloguniform(1e-4, 1e-1, 5e-5).sample(rng) for _ in range(1000)]
    for sample in samples:
        assert 1e-4 <= sample <= 1e-1 and math.isclose(sample / 5e-5, round(sample / 5e-5), abs_tol=1e-6)
    assert all(0 <= tune.quniform(0, 33, 3).sample(rng) <= 33 for _ in range(1000))


@pytest.mark.parametrize("domain, check", [
    (tune.quniform(0, 1, 0.25), lambda v: isinstance(v, float) and v in (0, 0.25, 0.5, 0.75, 1.0)),
    (tune.loguniform(1e-4, 1e-1), lambda v: isinstance(v, float) and 1e-4 <= v < 1e-1),
    (tune.qloguniform(1e-3, 1, 1e-3), lambda v: isinstance(v, float) and 1e-3 <= v <= 1
     and math.isclose(v * 1000, round(v * 1000), abs_tol=1e-6)),
    (tune.randn(10, 0.5), lambda v: isinstance(v, float) and 5 < v < 15),
    (tune.qrandn(0, 1, 0.5), lambda v: isinstance(v, float) and v * 2 == round(v * 2)),
    (tune.randint(-3, 12), lambda v: type(v) is int and -3 <= v < 12),
    (tune.qrandint(0, 10, 5), lambda v: type(v) is int and v in (0, 5, 10)),
    (tune.lograndint(1, 100), lambda v: type(v) is int and 1 <= v < 100),
    (tune.qlograndint(2, 100, 2), lambda v: type(v) is int and 2 <= v <= 100 and v % 2 == 0),
])
def test_what_each_sampler_gives_a_trial(domain, check):
    values = [c["p"]["v"] for c in _configs({"p": {"v": domain}}, num_samples=200)]
    bad = [v for v in values if not check(v)]
    assert not bad, bad[:5]


def _grid_of(tmp_path, configs, metrics):
    """A ResultGrid read back the way fit() builds it: trials in a state file, results in their history."""
    path = str(tmp_path)
    tr.make_tune_dir(path)
    trials = []
    for index, (config, result) in enumerate(zip(configs, metrics)):
        trial = tr.new_trial(f"abcde_{index:05d}", f"t{index}", f"t{index}", config, index)
        trial.status, trial.last_result = tr.TrialStatus.TERMINATED, result
        tr.append_history(path, trial, result)
        trials.append(trial)
    return ResultGrid([trial_result(path, t) for t in trials], path)


def test_trial_config_result_config_and_dataframe_columns_agree(tmp_path):
    space = {"train_loop_config": {"lr": tune.qloguniform(1e-3, 1, 1e-3), "opt": tune.choice(
        [{"name": "sgd"}, {"name": "adam", "eps": 1e-8}]), "width": tune.grid_search([8, 16])},
        "seed": tune.randint(0, 100), "layers": [tune.lograndint(1, 10), 4]}
    configs = _configs(space, num_samples=2, seed=3)
    grid = _grid_of(tmp_path, configs, [{"loss": float(i), "eval": {"acc": i / 10}} for i in range(len(configs))])
    frame = grid.get_dataframe()
    for index, (config, result) in enumerate(zip(configs, grid)):
        assert result.config == config and result.metrics["loss"] == float(index)
        row = frame.iloc[index]
        for key, value in flatten_metrics(config).items():  # Ray's flatten_dict: dicts only, lists stay values
            assert row[f"config/{key}"] == value
        assert row["eval/acc"] == index / 10
    assert "config/train_loop_config/opt/name" in frame.columns and "config/layers" in frame.columns
    assert "config/train_loop_config" not in frame.columns


def test_a_nested_metric_ranks_trials_by_its_flattened_name(tmp_path):
    """Ray: get_best_result(metric="eval/acc") reads {"eval": {"acc": ...}}; so does filter_metric."""
    configs = _configs({"a": {"b": tune.grid_search([1, 2, 3])}})
    grid = _grid_of(tmp_path, configs, [{"eval": {"acc": acc}} for acc in (0.2, 0.9, 0.5)])
    assert grid.get_best_result(metric="eval/acc", mode="max").config == {"a": {"b": 2}}
    assert grid.get_best_result(metric="eval/acc", mode="min", scope="all").config == {"a": {"b": 1}}
    frame = grid.get_dataframe(filter_metric="eval/acc", filter_mode="max")
    assert list(frame["eval/acc"]) == [0.2, 0.9, 0.5] and list(frame["config/a/b"]) == [1, 2, 3]
