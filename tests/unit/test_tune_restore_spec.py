"""What a sweep stores for Tuner.restore (minitrain.tune.restore_spec) and the user's key that seals what is
not JSON (minitrain.storage.user_key): the param space as JSON, sealed pickles unpickled only when their
seal verifies, and a forged or foreign pickle never unpickled."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import pickle

import pytest

from minitrain import tune
from minitrain.storage import sweep_state as tr
from minitrain.storage import user_key
from minitrain.tune import restore_spec
from minitrain.tune.schedulers import ASHAScheduler
from minitrain.tune.search import BasicVariantGenerator
from minitrain.tune.search_space import generate_variants, make_rng


@pytest.fixture
def key_dir(tmp_path, monkeypatch):
    path = tmp_path / "keys"
    monkeypatch.setenv("MINITRAIN_KEY_DIR", str(path))
    return path


SPACE = {"lr": tune.loguniform(1e-4, 1e-1), "q": tune.quniform(0, 1, 0.25), "n": tune.qrandint(2, 20, 2),
         "z": tune.randn(1.0, 2.0), "act": tune.choice(["relu", {"kind": "gelu"}]),
         "grid": tune.grid_search([1, 2.5, None]), "nested": {"w": tune.lograndint(1, 100), "fixed": [1, "a"]},
         "flag": True}


def test_a_space_of_domains_and_grids_is_json_and_samples_the_same_after_the_round_trip():
    encoded = restore_spec.encode_space(SPACE)
    decoded = restore_spec.decode_space(json.loads(json.dumps(encoded)))
    first = list(generate_variants(SPACE, 3, make_rng(7)))
    assert list(generate_variants(decoded, 3, make_rng(7))) == first and len(first) == 9


@pytest.mark.parametrize("space", [{"f": tune.sample_from(lambda spec: 1)}, {"cls": tune.choice([ValueError])},
                                   {"t": (1, 2)}, {1: "int key"}, {"x": float("nan")},
                                   {"x": {"__minitrain_domain__": 1}}])
def test_what_json_cannot_carry_back_is_not_json(space):
    with pytest.raises(restore_spec._NotJson):
        restore_spec.encode_space(space)


@pytest.mark.parametrize("record, field", [
    ({"__minitrain_domain__": {"kind": "eval"}}, "x"),
    ({"__minitrain_domain__": {"kind": "uniform", "lower": "0", "upper": 1, "categories": [], "mean": 0,
                               "sd": 1, "q": None}}, "x.lower"),
    ({"__minitrain_domain__": {}, "other": 1}, "x"),
])
def test_a_malformed_domain_is_refused_naming_it(record, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        restore_spec.decode_space({"x": record})


def test_the_key_is_private_and_seals(key_dir):
    sealed = user_key.seal(b"data")
    assert (os.stat(key_dir).st_mode & 0o777, os.stat(key_dir / "restore.key").st_mode & 0o777) == (0o700, 0o600)
    assert user_key.unseal(sealed) == b"data"
    tampered = sealed[:-1] + b"x"
    with pytest.raises(ValueError, match="does not verify"):
        user_key.unseal(tampered)
    (key_dir / "restore.key").unlink()  # another user's (or machine's) key
    user_key.seal(b"other")
    with pytest.raises(ValueError, match="does not verify"):
        user_key.unseal(sealed)


def test_a_key_that_is_a_link_or_not_private_is_refused(key_dir, tmp_path):
    user_key.seal(b"x")
    key = key_dir / "restore.key"
    key.chmod(0o644)
    with pytest.raises(user_key.KeyUnavailable, match="readable or writable by others"):
        user_key.seal(b"x")
    key.unlink()
    planted = tmp_path / "planted"
    planted.write_bytes(b"k" * 32)
    planted.chmod(0o600)
    key.symlink_to(planted)  # a link planted under the key's name
    with pytest.raises(user_key.KeyUnavailable, match="symbolic link"):
        user_key.unseal(b"x" * 40)
    key.unlink()
    key_dir.chmod(0o755)
    with pytest.raises(user_key.KeyUnavailable, match="chmod 700"):
        user_key.seal(b"x")
    key_dir.chmod(0o700)
    with pytest.raises(user_key.KeyUnavailable, match="does not exist"):
        user_key.unseal(b"x" * 40)


def _write(path, param_space, tune_config, run_config):
    tr.make_tune_dir(str(path))
    tr.write_spec(str(path), restore_spec.capture(param_space, tune_config, run_config))


def test_a_json_space_and_default_tune_config_restore_without_any_key(tmp_path, key_dir):
    config = tune.TuneConfig(metric="loss", mode="min", num_samples=3, max_concurrent_trials=2,
                             search_alg=BasicVariantGenerator(points_to_evaluate=[{"lr": 0.01}], random_state=3,
                                                              constant_grid_search=True))
    run_config = tune.RunConfig(name="n", stop={"training_iteration": 2}, verbose=0,
                                failure_config=tune.FailureConfig(max_failures=3),
                                checkpoint_config=tune.CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="a"))
    _write(tmp_path, SPACE, config, run_config)
    os.unlink(key_dir / "restore.key")  # another machine: the sealed copies cannot be used
    stored = restore_spec.load(str(tmp_path))
    assert restore_spec.encode_space(stored.param_space) == restore_spec.encode_space(SPACE)
    restored = stored.tune_config
    assert (restored.metric, restored.mode, restored.num_samples, restored.max_concurrent_trials) == ("loss", "min", 3, 2)
    gen = restored.search_alg
    assert (gen._points, gen.seed, gen.constant_grid_search) == ([{"lr": 0.01}], 3, True)
    assert "does not exist" in stored.why["run_config"]  # its sealed copy; the JSON one serves
    assert dataclasses.replace(stored.run_config, name="n") == run_config


def test_objects_come_back_from_their_sealed_copy(tmp_path, key_dir):
    space = {"f": tune.sample_from(lambda spec: spec.config.x * 2), "x": tune.choice([ValueError, KeyError])}
    config = tune.TuneConfig(scheduler=ASHAScheduler(metric="loss", mode="min", max_t=7))
    _write(tmp_path, space, config, tune.RunConfig(stop=lambda trial_id, result: result["i"] > 3))
    stored = restore_spec.load(str(tmp_path))
    assert stored.param_space["x"].categories == [ValueError, KeyError]
    assert stored.param_space["f"].func(type("S", (), {"config": type("C", (), {"x": 4})})) == 8
    assert stored.tune_config.scheduler.max_t == 7 and stored.tune_config.search_alg is None
    assert stored.run_config.stop("t", {"i": 4}) is True


def test_a_forged_pickle_is_never_unpickled(tmp_path, key_dir):
    """Another user who can write the shared storage path replaces the sealed copies: nothing runs."""
    marker = tmp_path / "pwned"
    _write(tmp_path, {"f": tune.sample_from(lambda: 1)}, tune.TuneConfig(), tune.RunConfig())

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    spec_path = tmp_path / tr.SPEC_FILE
    record = json.loads(spec_path.read_text())
    forged = pickle.dumps(Payload())
    for blob in (b"\0" * 32 + forged, user_key.seal(b"")[:32] + forged):  # any MAC, or one of other data
        record["sealed"] = {name: base64.b64encode(blob).decode() for name in record["sealed"]}
        spec_path.write_text(json.dumps(record))
        stored = restore_spec.load(str(tmp_path))
        assert stored.param_space is None and stored.run_config == tune.RunConfig()  # from its JSON
        assert "does not verify" in stored.why["param_space"] and "does not verify" in stored.why["tune_config"]
        assert type(stored.tune_config.search_alg) is BasicVariantGenerator  # from its JSON, not the forgery
    assert not marker.exists()


def test_a_spec_file_not_written_by_minitrain_is_a_clear_error(tmp_path, key_dir):
    tr.make_tune_dir(str(tmp_path))
    (tmp_path / tr.SPEC_FILE).write_text(json.dumps({"version": 1, "sealed": {"trainable": "x"}, "not_kept": {}}))
    with pytest.raises(ValueError, match="not a sweep spec"):
        restore_spec.load(str(tmp_path))
    (tmp_path / tr.SPEC_FILE).write_text("[1]")
    with pytest.raises(ValueError, match="not a JSON object"):
        restore_spec.load(str(tmp_path))


def _planted_payload(marker):
    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))
    return pickle.dumps(Payload())


def test_tuner_restore_never_unpickles_a_forged_trial_config(tmp_path, key_dir):
    """A trial whose config is not JSON runs again from its sealed copy only: a planted one is refused,
    naming the trial, and nothing of it runs; a genuine one comes back as the object it was."""
    from minitrain.tune import Tuner

    marker = tmp_path / "pwned"
    path = tmp_path / "sweep"
    path.mkdir()
    trial = tr.new_trial("abcde_00000", "train_abcde_00000", "train_abcde_00000", {"cls": ValueError}, 0)
    trial.status = tr.TrialStatus.PENDING
    header = {"name": "sweep", "trainable": "train", "metric": None, "mode": None, "id_prefix": "abcde",
              "num_samples": 1, "total_trials": 1}
    for sealed, ok in ((base64.b64encode(b"\0" * 32 + _planted_payload(marker)).decode(), False),
                       (restore_spec.seal_value({"cls": ValueError}), True)):
        trial.config_sealed = sealed
        tr.write_state(str(path), header, [trial])
        if ok:
            tuner = Tuner.restore(str(path), lambda config: None, param_space={}, tune_config=tune.TuneConfig(),
                                  run_config=tune.RunConfig())
            assert tuner._restored[1][0].config == {"cls": ValueError}
        else:
            with pytest.raises(Exception, match="train_abcde_00000.*seal does not verify"):
                Tuner.restore(str(path), lambda config: None, param_space={}, tune_config=tune.TuneConfig(),
                              run_config=tune.RunConfig())
    assert not marker.exists()
