"""Tuner.restore as Ray's (issue 26 item 2): after SIGINT, with only the trainable passed again, the sweep
goes on with its stored param space (objects included: classes, `sample_from` functions, sealed with the
user's key), tune_config and run_config, creating the trials it had not created yet; a re-specified
param space holding objects works too; `resume_errored` and `restart_errored` (after
ray/python/ray/tune/tests/test_tuner_restore.py). The SIGKILL case: tests/e2e/test_tune.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from minitrain import tune
from minitrain.storage import sweep_state as tr
from tune_restore_trainables import Large, Small, fails_until_fixed, model_trainable

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


@pytest.mark.parametrize("how", ["resume_errored", "restart_errored"])
def test_resume_and_restart_errored_trials(tmp_path, how):
    """After test_tuner_restore.py::test_tuner_resume_errored_only / _restart_errored."""
    out = str(tmp_path)
    experiment = os.path.join(out, "errored")
    results = tune.Tuner(fails_until_fixed, param_space={"out": out, "k": tune.grid_search([1, 2])},
                         run_config=tune.RunConfig(name="errored", storage_path=out)).fit()
    assert results.num_errors == 2 and all(isinstance(e, RuntimeError) for e in results.errors)
    open(os.path.join(out, "fixed"), "w").close()

    assert tune.Tuner.restore(experiment, fails_until_fixed).fit().num_errors == 2  # errored trials stay so
    results = tune.Tuner.restore(experiment, fails_until_fixed, **{how: True}).fit()
    assert results.num_errors == 0 and results.num_terminated == 2
    starts = [json.loads(line) for line in open(os.path.join(out, "starts.jsonl"))]
    assert [s["start"] for s in starts] == [0, 0] + ([2, 2] if how == "resume_errored" else [0, 0])
    for result in results:  # resumed: the reports after the checkpoint; restarted: all again; each once
        assert [m["i"] for m in result._metrics_history] == [0, 1, 2, 3]
        assert result.metrics["training_iteration"] == 4
