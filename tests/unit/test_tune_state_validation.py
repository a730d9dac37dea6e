"""Tuner.restore trusts nothing in tuner_state.json: a missing or extra field, a wrong type and a
trial directory name that leaves the sweep directory are clear errors naming the field; the sweep's own
writes follow no planted link."""

from __future__ import annotations

import json
import os

import pytest

from minitrain.errors import ConfigError
from minitrain.storage import sweep_state as tr
from minitrain.storage.filesystem import StorageError
from minitrain.tune import Tuner


def train(config):
    pass


def _sweep(tmp_path, **changes):
    trial = tr.new_trial("abcde_00000", "train_abcde_00000", "train_abcde_00000", {"x": 1}, 0)
    header = {"name": "sweep", "trainable": "train", "metric": "loss", "mode": "min", "id_prefix": "abcde",
              "num_samples": 1, "total_trials": 1}
    path = tmp_path / "sweep"
    path.mkdir()
    tr.write_state(str(path), header, [trial])
    data = json.loads((path / tr.STATE_FILE).read_text())
    for key, value in changes.pop("trial", {}).items():
        if value is None:
            del data["trials"][0][key]
        else:
            data["trials"][0][key] = value
    for key, value in changes.items():
        if value is None:
            del data[key]
        else:
            data[key] = value
    (path / tr.STATE_FILE).write_text(json.dumps(data))
    return path


def test_an_intact_state_file_is_restored(tmp_path):
    tuner = Tuner.restore(str(_sweep(tmp_path)), train)
    assert tuner._restored[1][0].dirname == "train_abcde_00000"


@pytest.mark.parametrize("changes, named", [
    ({"trial": {"dirname": None}}, "'dirname'"),
    ({"trial": {"surprise": 1}}, "unknown field(s) ['surprise']"),
    ({"trial": {"index": "0"}}, "trials[0].index"),
    ({"trial": {"status": "PAUSED"}}, "trials[0].status"),
    ({"trial": {"dirname": "../../outside"}}, "trials[0].dirname"),
    ({"trial": {"dirname": "/etc/cron.d/x"}}, "trials[0].dirname"),
    ({"trial": {"dirname": "a/b"}}, "trials[0].dirname"),
    ({"trial": {"dirname": ".."}}, "trials[0].dirname"),
    ({"trials": {"not": "a list"}}, "\"trials\""),
    ({"total_trials": None}, "'total_trials'"),
    ({"num_samples": "many"}, "num_samples"),
])
def test_a_damaged_state_file_is_a_config_error_naming_the_field(tmp_path, changes, named):
    path = _sweep(tmp_path, **changes)
    with pytest.raises(ConfigError) as info:
        Tuner.restore(str(path), train)
    assert named in str(info.value) and tr.STATE_FILE in str(info.value)
    assert sorted(os.listdir(tmp_path)) == ["sweep"]  # nothing written outside the sweep directory


def test_the_sweeps_history_and_log_follow_no_planted_link(tmp_path):
    path = tmp_path / "sweep"
    (path / tr.TUNE_DIR).mkdir(parents=True)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep\n")
    trial = tr.new_trial("t_0", "t0", "t0", {"x": 1}, 0)
    os.symlink(victim, path / tr.TUNE_DIR / "t0.jsonl")
    os.symlink(victim, path / tr.TUNE_DIR / "t0.log")
    with pytest.raises(StorageError, match="symbolic link"):
        tr.append_history(str(path), trial, {"loss": 1.0})
    with pytest.raises(StorageError, match="symbolic link"):
        tr.cut_history(str(path), trial, 0)
    with pytest.raises(StorageError, match="symbolic link"):
        os.close(tr.open_log(str(path), trial))
    assert victim.read_text() == "keep\n"
