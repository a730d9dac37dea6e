"""The Slurm side of a launch without a process: the agent step's srun command line and environment
(minitrain.hosts.srun), and a preempted job's requeue where no scontrol exists
(minitrain.hosts.slurm_requeue). With a recording `srun` or `scontrol` first on PATH:
tests/process/test_srun_launcher.py and tests/process/test_slurm_requeue.py."""

from __future__ import annotations

import logging

import pytest

from minitrain.errors import NoProgressError, PreemptionError, WorkerGroupError
from minitrain.hosts.slurm_requeue import requeue_after_preemption, wants_requeue
from minitrain.hosts.srun import TASK_SHAPE_VARIABLES, srun_argv, srun_environment


def test_srun_argv_is_one_task_on_one_node_sharing_the_allocation():
    argv = srun_argv("gpu07", ["python", "-m", "minitrain.agent", "--node-id", "gpu07"], "/work", job_id="42")
    assert argv == ["srun", "--jobid=42", "--nodes=1", "--ntasks=1", "--ntasks-per-node=1", "--nodelist=gpu07",
                    "--overlap", "--cpu-bind=none", "--mpi=none", "--input=0", "--quiet",
                    "--job-name=minitrain-agent", "--chdir=/work", "--",
                    "python", "-m", "minitrain.agent", "--node-id", "gpu07"]
    assert not any(arg.startswith("--exact") for arg in argv)  # the step gets the node's whole allocation


@pytest.mark.parametrize("node", ["", "-n1", "a/b", "n[1-2],n3", "a,b"])
def test_srun_argv_refuses_what_srun_would_read_as_something_else(node):
    with pytest.raises(ValueError, match="not a Slurm node name"):
        srun_argv(node, ["true"], "/", job_id="1")


def test_srun_environment_drops_the_users_task_shape():
    env = {"SLURM_GPUS_PER_TASK": "1", "SLURM_JOB_ID": "42", "PATH": "/bin", "SLURM_NTASKS_PER_GPU": "1"}
    assert srun_environment(env) == {"SLURM_JOB_ID": "42", "PATH": "/bin"}
    assert "SLURM_JOB_ID" not in TASK_SHAPE_VARIABLES


def test_without_scontrol_nothing_is_requeued_and_the_route_without_it_is_named(tmp_path, caplog, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no scontrol anywhere
    with caplog.at_level(logging.WARNING, logger="minitrain"):
        assert requeue_after_preemption("77") is False
    assert "no scontrol" in caplog.text and "--dependency=afternotok:77" in caplog.text


def test_only_a_resumable_preemption_is_requeued_never_a_run_that_made_no_progress():
    assert wants_requeue(PreemptionError(None, resumable=True))
    assert not wants_requeue(PreemptionError(None, resumable=False))
    # Attempts in a row failed without progress: a requeued job would fail the same way (exit 93).
    assert not wants_requeue(NoProgressError("no progress in the last 3 attempts", {}, attempts=3))
    assert not wants_requeue(WorkerGroupError("failure budget spent", {}))
