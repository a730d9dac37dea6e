"""Starting a node agent as a Slurm job step with ``srun`` (L1: stdlib + L0; pure, no I/O).

Inside an allocation, minitrain starts one agent per node as a step of the allocation's job, the way
Slurm expects work on its nodes to run: the step is tracked, accounted, confined to the job's share of
the node, signalled by ``scancel`` and ``--signal``, and cleaned up with the job. The agent's stdin
is srun's stdin (``--input=0``: task 0, the only one), so the run token and the run's certificate
travel there, exactly as over ssh; no function here takes a secret, so none can reach an argv.

The step's shape (`srun_argv`):

- ``--nodes=1 --ntasks=1 --ntasks-per-node=1 --nodelist=NODE``: one task, on that node;
- ``--overlap``: the step shares the node's resources with every other step, so it starts even while
  the batch script (or a driver run as a step), another agent, or a dying earlier agent holds them;
- no ``--exact``: the step gets all of the job's CPUs and memory on the node, and its GPUs (Slurm's
  default for steps), which the agent's workers inherit; ``--cpu-bind=none`` keeps the single task
  from being pinned to one CPU where the site binds tasks (task/affinity);
- ``--mpi=none`` (no PMI set-up for a Python process), ``--quiet`` (only
  srun's errors reach the driver's log), ``--job-name`` (what ``squeue --steps`` shows),
  ``--chdir`` (the agent's working directory).

Variables that shape the tasks of the user's own steps (``SLURM_GPUS_PER_TASK``...), which srun
would read from its environment and apply to the agent's single task, are left out of srun's
environment (`srun_environment`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

SRUN = "srun"
AGENT_STEP_NAME = "minitrain-agent"
PREFLIGHT_STEP_NAME = "minitrain-preflight"

# Inherited from sbatch/salloc options, srun would apply these to the agent's one task and give it only
# part of the node (one GPU of eight with --gpus-per-task=1).
TASK_SHAPE_VARIABLES = ("SLURM_GPUS_PER_TASK", "SLURM_NTASKS_PER_GPU", "SLURM_NTASKS_PER_SOCKET",
                        "SLURM_NTASKS_PER_CORE", "SLURM_NTASKS_PER_TRES", "SLURM_TRES_PER_TASK",
                        "SLURM_CPUS_PER_GPU", "SLURM_DISTRIBUTION", "SLURM_EXACT")


def srun_argv(node: str, command: Sequence[str], workdir: str, *, job_id: str,
              step_name: str = AGENT_STEP_NAME) -> list[str]:
    """The ``srun`` command line that runs `command` (a list: srun execs it without a shell) as a
    one-task step of the job `job_id` on `node`, in `workdir`. Pure: no I/O. The step's stdin is
    srun's stdin: write secrets there, never in `command`."""
    if not node or node.startswith("-") or "/" in node or "," in node:
        # srun takes a '/' as a file of names and a ',' as two nodes
        raise ValueError(f"{node!r} is not a Slurm node name")
    return [SRUN, f"--jobid={job_id}", "--nodes=1", "--ntasks=1", "--ntasks-per-node=1", f"--nodelist={node}",
            "--overlap", "--cpu-bind=none", "--mpi=none", "--input=0", "--quiet",
            f"--job-name={step_name}", f"--chdir={workdir}", "--", *command]


def srun_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """srun's environment (which the step inherits): `environ` without `TASK_SHAPE_VARIABLES`."""
    return {name: value for name, value in environ.items() if name not in TASK_SHAPE_VARIABLES}
