"""Searchers: the basic generator's counts and seeding, ConcurrencyLimiter, OptunaSearch's space
conversion and ask/tell (in process; the sweeps themselves are in tests/e2e/test_tune.py)."""

from __future__ import annotations

import pytest

from minitrain.errors import ConfigError
from minitrain.tune import search_space as ss
from minitrain.tune.search import BasicVariantGenerator, ConcurrencyLimiter, Searcher
from minitrain.tune.search.optuna import OptunaSearch

SPACE = {"lr": ss.loguniform(1e-4, 1e-1), "opt": ss.grid_search(["sgd", "adam"]), "fixed": 3}


def drain(searcher, prefix="t"):
    configs = []
    while True:
        config = searcher.suggest(f"{prefix}{len(configs)}")
        if config == Searcher.FINISHED:
            return configs
        assert config is not None
        configs.append(config)


def test_basic_generator_counts_grid_times_samples_and_is_seeded():
    first = BasicVariantGenerator(random_state=5)
    first.set_search_properties("loss", "min", SPACE)
    assert first.total_trials(3) == 6
    configs = drain(first)
    again = BasicVariantGenerator(random_state=5)
    again.set_search_properties("loss", "min", SPACE)
    again.total_trials(3)
    assert drain(again) == configs and len(configs) == 6


def test_basic_generator_skip_continues_the_same_sequence():
    whole = BasicVariantGenerator(random_state=1)
    whole.set_search_properties(None, None, SPACE)
    whole.total_trials(4)
    configs = drain(whole)
    resumed = BasicVariantGenerator(random_state=1)
    resumed.set_search_properties(None, None, SPACE)
    resumed.total_trials(4)
    resumed.skip(3)
    assert drain(resumed) == configs[3:]


def test_points_to_evaluate_come_first_and_are_completed_from_the_space():
    gen = BasicVariantGenerator(points_to_evaluate=[{"lr": 0.5, "opt": "sgd"}], random_state=0)
    gen.set_search_properties(None, None, SPACE)
    assert gen.total_trials(2) == 3
    configs = drain(gen)
    assert configs[0] == {"lr": 0.5, "opt": "sgd", "fixed": 3} and len(configs) == 3


def test_max_concurrent_and_concurrency_limiter_wait_for_ends():
    gen = BasicVariantGenerator(max_concurrent=1)
    gen.set_search_properties(None, None, {"x": ss.uniform(0, 1)})
    gen.total_trials(3)
    assert isinstance(gen.suggest("a"), dict) and gen.suggest("b") is None
    gen.on_trial_complete("a", {"x": 1})
    assert isinstance(gen.suggest("b"), dict)
    limited = ConcurrencyLimiter(BasicVariantGenerator(), max_concurrent=2)
    limited.set_search_properties(None, None, {"x": ss.uniform(0, 1)})
    limited.total_trials(5)
    assert isinstance(limited.suggest("a"), dict) and isinstance(limited.suggest("b"), dict)
    assert limited.suggest("c") is None
    limited.on_trial_complete("a")
    assert isinstance(limited.suggest("c"), dict)
    with pytest.raises(ConfigError, match="max_concurrent"):
        ConcurrencyLimiter(BasicVariantGenerator(), max_concurrent=0)


def test_optuna_converts_the_space_as_ray_does():
    space = {"a": ss.uniform(-1, 1), "b": ss.loguniform(1e-3, 1), "c": ss.randint(0, 3), "d": ss.qrandint(0, 10, 5),
             "e": ss.choice(["x", "y"]), "f": ss.quniform(0, 1, 0.25), "nested": {"g": ss.lograndint(1, 100)},
             "const": 7}
    search = OptunaSearch(metric="loss", mode="min", seed=0)
    search.set_search_properties(None, None, space)
    for i in range(30):
        config = search.suggest(str(i))
        assert -1 <= config["a"] <= 1 and 1e-3 <= config["b"] <= 1 and config["c"] in (0, 1, 2)
        assert config["d"] in (0, 5, 10) and config["e"] in ("x", "y") and config["f"] in (0, 0.25, 0.5, 0.75, 1.0)
        assert 1 <= config["nested"]["g"] <= 99 and config["const"] == 7
        search.on_trial_complete(str(i), {"loss": config["a"] ** 2})


@pytest.mark.parametrize("domain, message", [(ss.grid_search([1, 2]), "grid_search"), (ss.randn(), "no Optuna"),
                                             (ss.qloguniform(1e-3, 1, 1e-3), "quantization")])
def test_optuna_refuses_what_it_cannot_sample(domain, message):
    with pytest.raises(ConfigError, match=message):
        OptunaSearch(space={"x": domain}, metric="loss", mode="min")


def test_optuna_learns_a_quadratic_better_than_chance():
    """TPE on a seeded synthetic objective, told results in order: its last ten guesses beat its first ten."""
    search = OptunaSearch(metric="loss", mode="min", seed=3)
    search.set_search_properties(None, None, {"x": ss.uniform(-10, 10), "y": ss.uniform(-10, 10)})
    losses = []
    for i in range(40):
        config = search.suggest(str(i))
        losses.append((config["x"] - 3) ** 2 + (config["y"] + 1) ** 2)
        search.on_trial_complete(str(i), {"loss": losses[-1]})
    assert sum(losses[-10:]) < sum(losses[:10]) / 3
    restored = OptunaSearch(metric="loss", mode="min", seed=3)
    restored.set_search_properties(None, None, {"x": ss.uniform(-10, 10), "y": ss.uniform(-10, 10)})
    restored.restore_finished("0", {"x": 3.0, "y": -1.0}, {"loss": 0.0}, error=False)
    assert restored._study.best_value == 0.0
