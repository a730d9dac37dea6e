"""`Tuner.restore(path, trainable, param_space=...)` re-specifying objects (Ray's documented semantics:
the param space passed again is used for its new objects, a data set or a function, and the trials that
run again get them; sampled values and finished trials stay what they were)."""

from __future__ import annotations

import pytest

from minitrain import tune
from minitrain.storage import sweep_state as tr
from minitrain.tune import restore_spec
from minitrain.tune.search_space import generate_variants, make_rng


@pytest.fixture
def key_dir(tmp_path, monkeypatch):
    path = tmp_path / "keys"
    monkeypatch.setenv("MINITRAIN_KEY_DIR", str(path))
    return path


class Data:
    """A data set stand-in: no __eq__, so copies unpickled from the sweep's files are not == to it."""

    def __init__(self, tag):
        self.tag = tag


def old_loss(x):
    return x


def new_loss(x):
    return -x


def _space(data, loss, grid, model):
    return {"data": data, "loss": loss, "lr": tune.uniform(0, 1), "which": tune.grid_search(grid),
            "nested": {"model": model, "fixed": 3}}


def _sweep(path, statuses):
    """A sweep interrupted with trials in `statuses`, its space holding objects (sealed, as fit() keeps them)."""
    space = _space(Data("old"), old_loss, [Data("a"), Data("b")], Data("m-old"))
    path.mkdir()
    tr.make_tune_dir(str(path))
    tr.write_spec(str(path), restore_spec.capture(space, tune.TuneConfig(), tune.RunConfig()))
    trials = []
    for index, (config, status) in enumerate(zip(generate_variants(space, 1, make_rng(0)), statuses)):
        trial = tr.new_trial(f"abcde_{index:05d}", f"t{index}", f"t{index}", config, index)
        trial.status, trial.config_sealed = status, restore_spec.seal_value(config)
        trials.append(trial)
    header = {"name": path.name, "trainable": "train", "metric": None, "mode": None, "id_prefix": "abcde",
              "num_samples": 1, "total_trials": len(trials)}
    tr.write_state(str(path), header, trials)
    return trials


def test_trials_that_run_again_get_the_re_specified_objects(tmp_path, key_dir):
    from minitrain.tune import Tuner

    path = tmp_path / "sweep"
    before = _sweep(path, [tr.TrialStatus.TERMINATED, tr.TrialStatus.RUNNING])
    new_space = _space(Data("new"), new_loss, [Data("a2"), Data("b2")], Data("m-new"))
    tuner = Tuner.restore(str(path), lambda config: None, param_space=new_space)
    finished, resumed = tuner._restored[1]
    assert finished.status == tr.TrialStatus.TERMINATED  # it does not run again: its copy is untouched
    assert restore_spec.unseal_value(finished.config_sealed)["data"].tag == "old"
    assert resumed.status == tr.TrialStatus.PENDING
    config = resumed.config
    assert config["data"] is new_space["data"] and config["loss"] is new_loss
    assert config["which"] is new_space["which"]["grid_search"][1]  # it took the grid's second entry
    assert config["nested"]["model"].tag == "m-new" and config["nested"]["fixed"] == 3
    assert config["lr"] == before[1].config["lr"]  # sampled values stay the trial's own
    # a later restore without param_space= goes on with the new objects
    assert restore_spec.unseal_value(resumed.config_sealed)["data"].tag == "new"


def test_without_param_space_the_stored_objects_come_back(tmp_path, key_dir):
    from minitrain.tune import Tuner

    path = tmp_path / "sweep"
    _sweep(path, [tr.TrialStatus.RUNNING, tr.TrialStatus.PENDING])
    tuner = Tuner.restore(str(path), lambda config: None)
    assert [t.config["data"].tag for t in tuner._restored[1]] == ["old", "old"]
    assert [t.config["which"].tag for t in tuner._restored[1]] == ["a", "b"]


def test_respecify_replaces_objects_only():
    config = {"x": 0.5, "name": "a", "obj": Data("old"), "list": [Data("l"), 2], "extra": 1}
    new = restore_spec.respecify(config, None, {"x": tune.uniform(0, 1), "name": "b", "obj": Data("new"),
                                                "list": [Data("l2"), 5]})
    assert new["x"] == 0.5 and new["name"] == "a" and new["extra"] == 1  # plain values are the trial's
    assert new["obj"].tag == "new" and new["list"][0].tag == "l2" and new["list"][1] == 2
