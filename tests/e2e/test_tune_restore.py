"""Tuner.restore as Ray's: after SIGINT, with only the trainable passed again, the sweep
goes on with its stored param space (objects included: classes, `sample_from` functions, sealed with the
user's key), tune_config and run_config, creating the trials it had not created yet; a re-specified
param space holding objects works too; `resume_errored` and `restart_errored` (after
ray/python/ray/tune/tests/test_tuner_restore.py). The SIGKILL case: tests/e2e/test_tune.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from minitrain import tune
from minitrain.storage import sweep_state as tr
from minitrain.tune import RunConfig, TuneConfig, Tuner
from tune_restore_trainables import (Large, Small, dummy_train_fn_with_report, model_trainable,
                                     train_fn_sometimes_failing)

pytestmark = pytest.mark.e2e

DRIVER = """
import sys
sys.path.insert(0, {tests!r})
from minitrain import tune
from tune_restore_trainables import Large, Small, model_trainable
space = {{"model": tune.choice([Small, Large]), "x": tune.uniform(0, 1),
          "double": tune.sample_from(lambda spec: spec.config.x * 2)}}
tune.Tuner(model_trainable, param_space=space,
           tune_config=tune.TuneConfig(num_samples=4, max_concurrent_trials=1, metric="i", mode="max"),
           run_config=tune.RunConfig(name="objects", storage_path={out!r},
                                     stop=lambda trial_id, result: result["i"] >= 4)).fit()
"""


def _wait_for(condition, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


@pytest.mark.parametrize("param_space", ["stored", "re-specified"])
def test_restore_after_sigint_with_objects_in_the_space(tmp_path, param_space):
    out = str(tmp_path)
    script = tmp_path / "driver.py"
    script.write_text(DRIVER.format(tests=os.path.dirname(__file__), out=out))
    experiment = os.path.join(out, "objects")
    driver = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))

    def half_way():
        try:
            return any(t.checkpoint_iteration >= 2 for t in tr.read_state(experiment)[1])
        except (OSError, ValueError):
            return False

    _wait_for(half_way, 120, "the first trial half-way")
    driver.send_signal(signal.SIGINT)
    output = driver.communicate(timeout=120)[0].decode()
    assert driver.returncode != 0 and "KeyboardInterrupt" in output, output[-3000:]
    _, trials = tr.read_state(experiment)
    assert len(trials) < 4 and any(t.status == tr.TrialStatus.PENDING and not t.config_is_json for t in trials)

    kwargs = {}
    if param_space == "re-specified":  # Ray's restore(param_space=...): objects the caller holds
        kwargs["param_space"] = {"model": tune.choice([Small, Large]), "x": tune.uniform(0, 1),
                                 "double": tune.sample_from(lambda spec: spec.config.x * 2)}
    results = tune.Tuner.restore(experiment, model_trainable, **kwargs).fit()

    assert len(results) == 4 and results.num_terminated == 4, [str(r.error) for r in results]
    for result in results:
        history = result._metrics_history
        assert [m["i"] for m in history] == [0, 1, 2, 3, 4]  # the stored run_config's stop function
        assert all(m["double"] == 2 * m["x"] and m["size"] in (1, 3) for m in history)
    assert results.get_best_result().metrics["i"] == 4  # the stored tune_config's metric and mode
    # the interrupted trial resumed with its own config (sealed), the new ones drew theirs from the space
    assert all(r.config["model"] in (Small, Large) for r in results)


# ------------------------------------------------------------------ ported from Ray's test_tuner_restore.py
# (imports only: ray.air's RunConfig/TuneConfig/Tuner -> minitrain.tune's, session -> tune; tmpdir -> tmp_path)


def test_tuner_restore_num_trials(tmp_path):
    """Number of trials after restoring a finished run should be the same (Ray's reads `_metric`, the
    return value of `_dummy_train_fn`; here the file's `_dummy_train_fn_with_report` and its `score`)."""
    tuner = Tuner(dummy_train_fn_with_report, tune_config=TuneConfig(num_samples=4, metric="score", mode="max"),
                  run_config=RunConfig(name="test_tuner_restore_num_trials", storage_path=str(tmp_path)))
    results = tuner.fit()
    assert len(results) == 4
    assert results.get_best_result().metrics["score"] == 1
    del tuner
    tuner = Tuner.restore(str(tmp_path / "test_tuner_restore_num_trials"), trainable=dummy_train_fn_with_report)
    results = tuner.get_results()
    assert len(results) == 4
    assert results.get_best_result().metrics["score"] == 1
    results = tuner.fit()
    assert len(results) == 4
    assert results.get_best_result().metrics["score"] == 1


@pytest.mark.parametrize("how", ["resume_errored", "restart_errored"])
def test_tuner_restore_resume_or_restart_errored(tmp_path, how):
    """Resuming errored trials should pick up from previous state; restarting should start from scratch.
    The param space holds tuples of paths (not JSON): it and the trials' configs come back sealed."""
    fail_marker = tmp_path / "fail_marker"
    fail_marker.write_text("", encoding="utf-8")
    name = f"test_tuner_restore_{how}"
    tuner = Tuner(train_fn_sometimes_failing, tune_config=TuneConfig(num_samples=1),
                  run_config=RunConfig(name=name, storage_path=str(tmp_path)),
                  param_space={  # second and fourth trial fail
                      "failing_hanging": tune.grid_search(
                          [(None, None), (fail_marker, None), (None, None), (fail_marker, None)])})
    results = tuner.fit()
    assert len(results) == 4
    assert len(results.errors) == 2
    assert [r.metrics["it"] for r in results] == [2, 1, 2, 1]  # failed after the first report
    del tuner
    fail_marker.unlink()

    assert Tuner.restore(str(tmp_path / name), train_fn_sometimes_failing).fit().num_errors == 2  # not retried
    tuner = Tuner.restore(str(tmp_path / name), trainable=train_fn_sometimes_failing, **{how: True})
    results = tuner.get_results()  # the restored results, before anything runs
    assert len(results) == 4 and len(results.errors) == 2
    assert [r.metrics["it"] for r in results] == [2, 1, 2, 1]
    results = tuner.fit()
    assert len(results) == 4 and len(results.errors) == 0
    # resumed from the previous state they report twice more (3); restarted from scratch, 2
    assert [r.metrics["it"] for r in results] == ([2, 3, 2, 3] if how == "resume_errored" else [2, 2, 2, 2])
