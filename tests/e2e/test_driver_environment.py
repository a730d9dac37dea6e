"""The driver survives its own environment: a console nobody reads any more (`python train.py | head
-1`, EPIPE on the driver's stdout and stderr) is never a lost node, and the run ends as it would have."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.e2e

_DRIVER = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {tests!r})
    from integrity_training import chatty_epochs
    from minitrain import FailureConfig, RunConfig, ScalingConfig
    from minitrain.torch import TorchTrainer
    print("started", flush=True)
    result = TorchTrainer(chatty_epochs, train_loop_config={{"epochs": 3, "lines": 200}},
                          scaling_config=ScalingConfig(num_workers=2),
                          run_config=RunConfig(name="run", storage_path={storage!r},
                                               failure_config=FailureConfig(max_failures=0))).fit()
    with open({out!r}, "w") as handle:
        json.dump(result.metrics, handle)
""")


def test_a_closed_console_is_not_a_lost_node(tmp_path):
    out = tmp_path / "metrics.json"
    script = _DRIVER.format(tests=os.path.dirname(__file__), storage=str(tmp_path), out=str(out))
    driver = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert driver.stdout.readline() == b"started\n"
        driver.stdout.close()  # `| head -1`: every later write of the driver gets EPIPE
        assert driver.wait(timeout=180) == 0
    finally:
        driver.kill()
        driver.wait()
    assert json.loads(out.read_text()) == {"epoch": 2}
    log = (tmp_path / "run" / "logs" / "attempt_0" / "rank_1.log").read_text()
    assert log.count("line 199") == 3 and log.count("warning 199") == 3  # the files kept everything
