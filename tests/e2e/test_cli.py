"""The launch CLI: argument splitting (unit) and one real run of the quickstart through it."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from minitrain.launch.cli import split_target

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_split_target_keeps_script_arguments_apart():
    assert split_target(["--num-workers", "2", "a.py:f", "--config", "{}"]) == (
        ["--num-workers", "2"], "a.py:f", ["--config", "{}"])
    assert split_target(["a.py", "--epochs", "3", "--name", "x"]) == ([], "a.py", ["--epochs", "3", "--name", "x"])
    assert split_target(["--use-gpu"]) == (["--use-gpu"], None, [])


@pytest.mark.e2e
def test_cli_trains_the_quickstart_function(tmp_path):
    command = [sys.executable, "-m", "minitrain.launch", "--num-workers", "2",
               str(ROOT / "examples" / "quickstart.py") + ":train_func", "--config", '{"epochs": 2}',
               "--name", "cli", "--storage-path", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert "minitrain.launch: finished" in done.stdout and '"epoch": 1' in done.stdout
    assert (tmp_path / "cli" / "logs" / "attempt_0" / "rank_1.log").exists()


@pytest.mark.e2e
def test_cli_runs_a_script_whose_train_function_lives_in_main(tmp_path):
    # In script mode quickstart's train_func is defined in __main__: it reaches workers by value.
    command = [sys.executable, "-m", "minitrain.launch", str(ROOT / "examples" / "quickstart.py"),
               "--epochs", "2", "--storage-path", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert "loss dropped" in done.stdout and "(rank 0, " in done.stdout


def test_cli_rejects_a_config_that_is_not_an_object(tmp_path):
    done = subprocess.run([sys.executable, "-m", "minitrain.launch", "x.py:f", "--config", "[1]"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode != 0 and "--config must be a JSON object" in done.stderr


@pytest.mark.e2e
def test_ported_ray_checkpoint_example_resumes(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "ray_port_checkpointing.py"),
                           "--storage-path", str(tmp_path)], capture_output=True, text=True, timeout=180,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "'start_epoch': 3" in done.stdout and "checkpoint_000004" in done.stdout
