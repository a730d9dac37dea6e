"""A full disk during a sweep: the sweep stops its trials and raises a StorageError that says
what happened and how to go on; the state file and every committed checkpoint are kept, and once there is
room again Tuner.restore finishes every trial. Needs root (a small tmpfs is mounted); skipped otherwise."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

import minitrain
from minitrain import tune
from minitrain.storage import sweep_state as tr
from minitrain.storage.filesystem import StorageError

from full_disk_trainables import heavy

pytestmark = pytest.mark.e2e


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)],
                                           capture_output=True).returncode != 0:
        pytest.skip("needs root to mount a small tmpfs")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_stops_the_sweep_clearly_and_restore_finishes_it(small_disk):
    def sweep():
        return tune.Tuner(heavy, param_space={"i": tune.grid_search([0, 1, 2])},
                          tune_config=tune.TuneConfig(metric="loss", mode="min", max_concurrent_trials=2),
                          run_config=minitrain.RunConfig(name="sweep", storage_path=str(small_disk)))

    with pytest.raises(StorageError) as info:
        sweep().fit()
    message = str(info.value)
    assert "No space left on device" in message and "Tuner.restore(" in message and "stopped its trials" in message
    path = small_disk / "sweep"
    header, trials = tr.read_state(str(path))  # the state file is intact (replaced atomically)
    for trial in trials:
        if trial.checkpoint:  # every checkpoint the state names was committed whole
            assert (open(os.path.join(trial.checkpoint, "step")).read()).isdigit()
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
    grid = tune.Tuner.restore(str(path), heavy, resume_errored=True,
                              param_space={"i": tune.grid_search([0, 1, 2])}).fit()
    assert sorted(r.metrics["step"] for r in grid) == [19, 19, 19], [r.error for r in grid]
    assert json.loads((path / tr.STATE_FILE).read_text())["trials"]
