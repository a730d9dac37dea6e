"""DeepSpeed in the loop, for real, on CPU workers.

DeepSpeed's CPU accelerator over the gloo group minitrain set up, 2 workers, run as a user runs the
examples (`python examples/deepspeed_train.py ...`, `python examples/lightning_train.py --strategy
deepspeed`): ZeRO stages 1, 2 and 3, a checkpoint holding every rank's shard, and a second run of the
same name that resumes from it. Stage 2 runs the seeds' configuration: fp16 with the optimizer
offloaded to the host (DeepSpeed's CPU Adam), in bf16 where the CPU has no fp16 arithmetic
(DeepSpeed's CPU accelerator answers `is_fp16_supported()` from oneDNN: AVX512-FP16 or AMX).
DeepSpeed is installed by the session fixture when missing (`tests/deepspeed_support.py`).
"""

from __future__ import annotations

import glob
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from deepspeed_support import BUILD_TIMEOUT_S, INSTALL_TIMEOUT_S, Unavailable, deepspeed_environment

ROOT = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 400  # a 2-core CI machine may run other tests beside these; the ops are built already
# The first test here also waits for the session fixture (DeepSpeed installed, its ops compiled), and
# each test runs its example twice (a run, then a resume).
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(INSTALL_TIMEOUT_S + BUILD_TIMEOUT_S + 2 * RUN_TIMEOUT_S + 60)]


@pytest.fixture(scope="session")
def deepspeed_cpu():
    """(environment, half precision) for running DeepSpeed on CPU; skips with the reason when it cannot."""
    try:
        return deepspeed_environment()
    except Unavailable as exc:
        pytest.skip(str(exc))
    except subprocess.TimeoutExpired as exc:
        pytest.skip(f"installing or building DeepSpeed took too long: {exc}")


def _run(example: str, env: dict, tmp_path, *args: str) -> str:
    done = subprocess.run([sys.executable, str(ROOT / "examples" / example), "--smoke-test",
                           "--storage-path", str(tmp_path), *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    return done.stdout


def _shards(checkpoint: Path, kind: str) -> list[str]:
    """The ranks' ZeRO shard files of `kind` ("optim" or "model") in a reported checkpoint."""
    return sorted(os.path.basename(p) for p in glob.glob(str(checkpoint / "**" / f"*zero_pp_rank_*_{kind}_states.pt"),
                                                         recursive=True))


# Stage 2 (the seeds' configuration: fp16 or bf16, the optimizer offloaded to DeepSpeed's CPU Adam) in the
# default run; stages 1 and 3 (every rank's parameters sharded too) are the soak tier's: minitrain's part,
# every rank's files in one checkpoint and a resume from it, is the same in each.
@pytest.mark.parametrize("stage", [pytest.param(1, marks=pytest.mark.soak), 2, pytest.param(3, marks=pytest.mark.soak)])
def test_zero_stage_checkpoints_every_rank_and_resumes(deepspeed_cpu, tmp_path, stage):
    env, half = deepspeed_cpu
    options = {1: ["--precision", "fp32"],
               2: ["--precision", half, "--offload-optimizer"],  # the seeds' ZeRO-2 + fp16 + CPU offload
               3: ["--precision", "bf16"]}[stage]
    args = ["--zero-stage", str(stage), *options]
    first = _run("deepspeed_train.py", env, tmp_path, *args)
    assert "'epoch': 1, 'start_epoch': 0" in first
    run = tmp_path / "deepspeed_example"
    prefix = "bf16_" if "bf16" in options else ""  # DeepSpeed's own file names
    for name in ("checkpoint_000000", "checkpoint_000001"):
        # Every rank's optimizer shard is in the one checkpoint directory, beside the rank-0 files.
        assert _shards(run / name, "optim") == [f"{prefix}zero_pp_rank_{r}_mp_rank_00_optim_states.pt"
                                                for r in range(2)]
        if stage == 3:  # the parameters are sharded too
            assert _shards(run / name, "model") == [f"zero_pp_rank_{r}_mp_rank_00_model_states.pt" for r in range(2)]
        else:
            assert (run / name / "state" / "mp_rank_00_model_states.pt").is_file()

    resumed = _run("deepspeed_train.py", env, tmp_path, *args, "--epochs", "3")

    # engine.load_checkpoint found every shard and the client state: training goes on at epoch 2.
    assert "'epoch': 2, 'start_epoch': 2" in resumed
    assert _shards(run / "checkpoint_000002", "optim")[-1].endswith("rank_1_mp_rank_00_optim_states.pt")


@pytest.mark.skipif(importlib.util.find_spec("lightning") is None,
                    reason="the lightning extra is not installed (pip install 'minitrain[lightning]')")
def test_lightning_deepspeed_strategy_on_cpu_checkpoints_every_rank_and_resumes(deepspeed_cpu, tmp_path):
    env, _ = deepspeed_cpu
    first = _run("lightning_train.py", env, tmp_path, "--strategy", "deepspeed")
    assert "'epoch': 1, 'step': 8" in first
    saved = tmp_path / "lightning_example" / "checkpoint_000001" / "checkpoint.ckpt"
    # Lightning's DeepSpeed layout: a directory per checkpoint, each rank's ZeRO-2 shard inside.
    assert (saved / "latest").read_text() == "checkpoint"
    assert _shards(saved, "optim") == [f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(2)]

    resumed = _run("lightning_train.py", env, tmp_path, "--strategy", "deepspeed", "--epochs", "3")

    assert "'epoch': 2, 'step': 12" in resumed  # trainer.fit(ckpt_path=...) restored step and epoch
