"""SIGTERM to the driver and a callback that hangs: with SIGTERM not among
FailureConfig.preemption_signals (by default it is one: tests/e2e/test_preemption_signals.py), the run
stops as with Ctrl-C (workers stopped with their grace, the index and the event log written, no
process of the run left), then the driver dies by SIGTERM, the status a scheduler that sent it expects.
A user's own SIGTERM handler is left alone."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap

import pytest

from minitrain.procs import wait_until_gone
from test_fault_tolerance import _kill_tree, _run_pids, _start_driver, _wait_for

pytestmark = pytest.mark.e2e
ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_sigterm_stops_the_run_like_ctrl_c_then_the_driver_dies_by_sigterm(tmp_path):
    driver = _start_driver(tmp_path, preemption_signals=["SIGUSR2"])
    try:
        _wait_for(tmp_path / "progress.json", driver)
        driver.send_signal(signal.SIGTERM)
        output, _ = driver.communicate(timeout=60)
    finally:
        _kill_tree(driver)
    assert driver.returncode == -signal.SIGTERM, output
    assert "stopping the workers" in output and "got SIGTERM" in output, output
    assert wait_until_gone(_run_pids(tmp_path), timeout=10) == []
    run = tmp_path / "results" / "ft"
    index = json.loads((run / "checkpoint_manager_snapshot.json").read_text())
    assert index["latest_checkpoint_result"]["checkpoint_dir_name"] == "checkpoint_000000"
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    assert any("ABORTED" in json.dumps(event) for event in events)  # the run's end is recorded
    assert not (run / ".staging").exists()


def test_a_users_own_sigterm_handler_is_left_alone():
    script = textwrap.dedent("""
        import signal
        from minitrain.driver.environment import sigterm_stops_like_ctrl_c as _sigterm_stops_like_ctrl_c
        mine = lambda signum, frame: None
        signal.signal(signal.SIGTERM, mine)
        with _sigterm_stops_like_ctrl_c():
            assert signal.getsignal(signal.SIGTERM) is mine
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        with _sigterm_stops_like_ctrl_c():
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "ok", done.stderr


HANGING_CALLBACK = textwrap.dedent("""
    import sys, threading, time
    import minitrain
    from minitrain import RunConfig, ScalingConfig
    from minitrain.callbacks import UserCallback
    from minitrain.callbacks.runner import CallbackRunner
    from minitrain.torch import TorchTrainer
    CallbackRunner.__init__.__defaults__ = (3.0,)  # the drain timeout (120 s by default)

    class Hang(UserCallback):
        def after_report(self, run_context, metrics, checkpoint):
            threading.Event().wait()

    def train(config):
        for i in range(3):
            minitrain.report({"i": i})

    result = TorchTrainer(train, scaling_config=ScalingConfig(num_workers=1),
                          run_config=RunConfig(name="h", storage_path=sys.argv[1], callbacks=[Hang()])).fit()
    print("FIT RETURNED", result.metrics, flush=True)
""")


def test_a_callback_that_hangs_never_hangs_the_run(tmp_path):
    script = tmp_path / "hang.py"
    script.write_text(HANGING_CALLBACK)
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "results")], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "FIT RETURNED {'i': 2}" in output and "still busy 3 s after the run ended (in Hang.after_report)" in output
