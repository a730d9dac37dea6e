"""Requeue the Slurm job of a preempted run, so the job runs again and resumes (L1: stdlib + L0).

`fit()` calls `requeue_after_preemption` when a run in Slurm mode (`ClusterConfig.launcher == "srun"`)
ended with an error `wants_requeue` accepts, a resumable `PreemptionError`: the run agreed a round,
committed its checkpoint and stopped, and the job (submitted with ``--requeue``) should run its batch
script again with the same job id, whose run name then resumes from that checkpoint. Only then: a
finished, failed or interrupted run is never requeued, nor one that stopped because attempts in a row
failed without progress (`NoProgressError`, exit 93: a requeued job would fail the same way), and a run
past `FailureConfig.max_preemption_failures` (Slurm's own requeues counted, ``SLURM_RESTART_COUNT``) is
not resumable, so it is not requeued either.

The requeue is `scontrol requeue <job>`. Where there is no `scontrol` (a container image without Slurm's
client commands), nothing is requeued and the log says so and names the route without it: a follow-up
job submitted up front with ``--dependency=afternotok:<job>`` (docs/slurm.md).
"""

from __future__ import annotations

import logging
import shutil
import subprocess

from minitrain.errors import PreemptionError

logger = logging.getLogger("minitrain")

SCONTROL_TIMEOUT_S = 30.0


def wants_requeue(error: BaseException) -> bool:
    """Whether a Slurm job whose run ended with `error` is to be requeued: only for a resumable
    `PreemptionError`. Never for a `NoProgressError` (the run stopped because attempts in a row failed
    without progress), nor for any other failure."""
    return isinstance(error, PreemptionError) and error.resumable


def requeue_after_preemption(job_id: str) -> bool:
    """Ask Slurm to requeue job `job_id`; True when `scontrol requeue` accepted it. Never raises: the
    run's own outcome (the PreemptionError) is what the caller reports; this logs what happened."""
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        logger.warning("preempted: Slurm job %s is not requeued: there is no scontrol on this host. Submit a "
                       "follow-up job up front instead (sbatch --dependency=afternotok:%s ...; see the Slurm "
                       "page of the docs), or run the same script again: it resumes from the agreed checkpoint.",
                       job_id, job_id)
        return False
    # Said before the call: once Slurm accepts the requeue it ends the job's processes, this one with them,
    # and the line after the call can be lost (an e2e run on a loaded machine lost it).
    logger.warning("preempted: Slurm job %s is to be requeued now (scontrol requeue)", job_id)
    try:
        done = subprocess.run([scontrol, "requeue", job_id], capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=SCONTROL_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.error("preempted: `scontrol requeue %s` failed (%s): the job ends here; run it again to resume "
                     "from the agreed checkpoint.", job_id, exc)
        return False
    if done.returncode != 0:
        logger.error("preempted: `scontrol requeue %s` failed (exit %s: %s): the job ends here; was it submitted "
                     "with --requeue? Run it again to resume from the agreed checkpoint.", job_id, done.returncode,
                     (done.stderr or done.stdout).strip()[-300:])
        return False
    logger.warning("preempted: Slurm job %s requeued; it resumes from the agreed checkpoint when it runs again",
                   job_id)
    return True
