"""What a user reads on the console of a real run: worker tracebacks that name the user's file and line, one
line for a resumed run with nothing left to do, for Ctrl-C on a terminal and for a mistake found before any
process starts; no notice of leftovers on a clean run; and the README's commands, each independent of the
other."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from terminal_support import run_on_a_terminal

ROOT = pathlib.Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "MINITRAIN_DASHBOARD": "0"}

FAILING_SCRIPT = textwrap.dedent('''\
    import traceback
    import minitrain


    def helper(rank):
        raise ValueError(f"bad value {rank}")


    def train_func():
        rank = minitrain.get_context().get_world_rank()
        try:
            helper(rank)
        except ValueError:
            traceback.print_exc()  # every rank formats its traceback with the source lines
        minitrain.collective.barrier()
        if rank == 1:
            helper(rank)
''')


@pytest.mark.e2e
def test_worker_tracebacks_name_the_users_file_and_line_on_every_rank(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(FAILING_SCRIPT)
    done = subprocess.run([sys.executable, "-m", "minitrain.launch", "--num-workers", "2", f"{script}:train_func",
                           "--name", "tb", "--storage-path", str(tmp_path / "runs")],
                          capture_output=True, text=True, timeout=180, cwd=tmp_path, env=ENV)
    assert done.returncode == 1, done.stderr
    assert "<dynamic-code>" not in done.stderr
    for rank in (0, 1):
        assert f'(rank {rank}, ' in done.stderr
        log = (tmp_path / "runs" / "tb" / "logs" / "attempt_0" / f"rank_{rank}.log").read_text()
        assert f'File "{script}", line 12, in train_func' in log and "    helper(rank)" in log, log
        assert f'File "{script}", line 6, in helper' in log and 'raise ValueError(f"bad value {rank}")' in log
    # The failing rank's final traceback is one block on the driver's stderr: from its header to its
    # exception line no line of the driver's own comes in between.
    lines = done.stderr.splitlines()
    last_header = max(i for i, line in enumerate(lines) if line.startswith("(rank 1, ")
                      and line.endswith("Traceback (most recent call last):"))
    end = next(i for i in range(last_header, len(lines)) if lines[i].endswith("ValueError: bad value 1"))
    assert all(line.startswith("(rank 1, ") for line in lines[last_header:end + 1]), lines[last_header:end + 1]
    assert f'File "{script}", line 17, in train_func' in "\n".join(lines[last_header:end + 1])


# ---------------------------------------------------------------- a resumed run with nothing left

def report_once_with_a_checkpoint():
    if minitrain_module().get_checkpoint() is not None:
        return  # resumed: the loop has already reached its end
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        pathlib.Path(tmp, "state").write_text("done")
        minitrain_module().report({"epoch": 0}, checkpoint=minitrain_module().Checkpoint.from_directory(tmp))


def minitrain_module():
    import minitrain

    return minitrain


@pytest.mark.e2e
def test_a_resumed_run_with_nothing_left_to_do_says_so_in_one_line(tmp_path, caplog, monkeypatch):
    import logging

    from minitrain import RunConfig, ScalingConfig
    from minitrain.torch import TorchTrainer

    monkeypatch.setenv("MINITRAIN_DASHBOARD", "0")
    trainer = TorchTrainer(report_once_with_a_checkpoint, scaling_config=ScalingConfig(num_workers=1),
                           run_config=RunConfig(name="done", storage_path=str(tmp_path)))
    trainer.fit()
    with caplog.at_level(logging.INFO, logger="minitrain"):
        result = trainer.fit()
    lines = [r.getMessage() for r in caplog.records if "nothing left to do" in r.getMessage()]
    assert lines == [f"resumed run 'done' from checkpoint_000000, and the training function returned without "
                     f"reporting: it had nothing left to do. To train further, raise its loop's bound (e.g. the "
                     f"number of epochs); to start a new run, pass another RunConfig(name=...) or delete "
                     f"{tmp_path / 'done'}"]
    assert result.metrics == {"epoch": 0}


@pytest.mark.e2e
def test_the_readme_commands_are_independent(tmp_path):
    """quickstart.sh's run does not make the README's CLI line resume a finished run (and train nothing);
    the example itself says it has nothing to do without starting workers."""
    script = (ROOT / "scripts" / "quickstart.sh").read_text()
    assert '--name "quickstart-$(date' in script  # the main job trains under a name of its own
    example = str(ROOT / "examples" / "quickstart.py")
    cli = [sys.executable, "-m", "minitrain.launch", example, "--epochs", "1", "--storage-path", str(tmp_path)]
    first = subprocess.run(cli, capture_output=True, text=True, timeout=180, cwd=tmp_path, env=ENV)
    assert first.returncode == 0 and "epoch 0: loss" in first.stdout, first.stderr
    again = subprocess.run(cli, capture_output=True, text=True, timeout=60, cwd=tmp_path, env=ENV)
    assert again.returncode == 0, again.stderr
    assert (f"run 'quickstart' in {tmp_path} has already trained 1 epoch(s), and --epochs is 1: nothing to do"
            in again.stdout)
    assert "starting" not in again.stderr  # no worker was started for nothing


# ---------------------------------------------------------------- noise and silence

@pytest.mark.e2e
def test_ctrl_c_on_a_terminal_ends_in_one_line_that_says_how_to_resume(tmp_path):
    argv = [sys.executable, "-m", "minitrain.launch", str(ROOT / "examples" / "quickstart.py"),
            "--epochs", "500", "--storage-path", str(tmp_path)]
    code, screen = run_on_a_terminal(argv, ENV, 180.0, ctrl_c_after="epoch 0: loss")
    assert code == 130, screen[-3000:]
    assert "Traceback" not in screen and "KeyboardInterrupt" not in screen
    assert "interrupted: stopped every worker of run 'quickstart'; run the same command again to resume from " \
           "checkpoint_0000" in screen


@pytest.mark.e2e
def test_a_clean_run_does_not_say_it_removed_leftovers(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "quickstart.py"), "--epochs", "1",
                           "--storage-path", str(tmp_path)], capture_output=True, text=True, timeout=180, env=ENV)
    assert done.returncode == 0, done.stderr
    assert "removed what earlier attempts left" not in done.stderr


LOCAL_SCRIPT = textwrap.dedent('''\
    import minitrain
    from minitrain import ScalingConfig
    from minitrain.torch import TorchTrainer

    def train_func():
        minitrain.report({"loss": 0.5})

    TorchTrainer(train_func, scaling_config=ScalingConfig(num_workers=0)).fit()
''')


def test_local_mode_says_what_it_runs(tmp_path):
    script = tmp_path / "local.py"
    script.write_text(LOCAL_SCRIPT)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=ENV)
    assert done.returncode == 0, done.stderr
    assert "local mode (ScalingConfig(num_workers=0)): running train_func in this process" in done.stderr
    assert "local mode: train_func returned; last report: {'loss': 0.5}" in done.stderr


def test_a_run_that_never_started_leaves_nothing_behind(tmp_path, monkeypatch):
    import threading

    from minitrain import RunConfig, ScalingConfig
    from minitrain.errors import ConfigError
    from minitrain.torch import TorchTrainer

    trainer = TorchTrainer(lambda config: None, train_loop_config={"lock": threading.Lock()},
                           scaling_config=ScalingConfig(num_workers=1),
                           run_config=RunConfig(name="never", storage_path=str(tmp_path)))
    with pytest.raises(ConfigError, match="train_loop_config cannot be pickled"):
        trainer.fit()
    assert not (tmp_path / "never").exists()


# ---------------------------------------------------------------- mistakes get the help they deserve

TYPO_SCRIPT = textwrap.dedent('''\
    from minitrain import RunConfig, ScalingConfig
    from minitrain.torch import TorchTrainer

    TorchTrainer(lambda: None, scaling_config=ScalingConfig(num_worker=2)).fit()
''')


@pytest.mark.parametrize("debug", [False, True])
def test_the_cli_shows_a_mistake_found_before_any_process_starts_as_one_line(tmp_path, debug):
    script = tmp_path / "typo.py"
    script.write_text(TYPO_SCRIPT)
    done = subprocess.run([sys.executable, "-m", "minitrain.launch", *(["--debug"] if debug else []), str(script)],
                          capture_output=True, text=True, timeout=60, env=ENV)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "minitrain.launch: ScalingConfig(num_worker=2): ScalingConfig has no field 'num_worker'; did you mean "
        "'num_workers'? (Python: ScalingConfig.__init__() got an unexpected keyword argument 'num_worker')")
    assert ("Traceback" in done.stderr) is debug


def test_a_storage_path_that_is_a_file_says_what_to_do(tmp_path):
    from minitrain import RunConfig, ScalingConfig
    from minitrain.errors import ConfigError
    from minitrain.torch import TorchTrainer

    (tmp_path / "results").write_text("")
    trainer = TorchTrainer(lambda: None, scaling_config=ScalingConfig(num_workers=1),
                           run_config=RunConfig(name="x", storage_path=str(tmp_path / "results")))
    with pytest.raises(ConfigError) as info:
        trainer.fit()
    assert str(info.value) == (
        f"RunConfig.storage_path={str(tmp_path / 'results')!r} cannot be used: {tmp_path / 'results'} is a file, "
        f"and runs are kept in directories (<storage_path>/<name>). Pass the directory that should hold your "
        f"runs, e.g. storage_path={str(tmp_path)!r}, or move the file away.")


def test_setup_env_never_imports_torch_before_numpy_is_installed():
    """Importing torch before numpy is installed prints torch's "Failed to initialize NumPy" warning: the
    set-up script reads torch's version from its metadata instead."""
    script = (ROOT / "scripts" / "setup_env.sh").read_text()
    assert "import torch" not in script and 'm.version("torch")' in script
