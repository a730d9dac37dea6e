"""The joining side of ``python -m minitrain.launch`` (L3): ``--join`` and the Kubernetes contract.

``python -m minitrain.launch --join HOST:PORT --node-id NAME --run-id ID [--token-file PATH]`` starts
an agent that joins the run whose coordinator listens at HOST:PORT (`minitrain.agent.join`).

Under a Kubernetes training job (`minitrain.hosts.kubernetes_env`: TrainJob's ``PET_*`` or
PyTorchJob's ``MASTER_ADDR``/``MASTER_PORT``/``WORLD_SIZE``/``RANK``) the same command runs on every
pod: ``python -m minitrain.launch script.py`` runs the script on pod 0, with a joined cluster whose
hosts are the job's pods (`kubernetes_cluster`), and on every other pod an agent that joins pod 0 as
``pod-RANK``. Pod 0's exit code is the run's; the other pods exit 0 when the run ends, 143 when it ended
preempted (retryable, as pod 0's: the resumed run needs them back).
"""

from __future__ import annotations

import sys
from typing import Optional

from minitrain import knobs
from minitrain.errors import ConfigError
from minitrain.hosts import kubernetes_env
from minitrain.hosts.cluster import ClusterConfig, HostSpec
from minitrain.hosts.joining import JoinConfig, read_token, split_address


def kubernetes_cluster(pod: kubernetes_env.KubernetesPod, token: str) -> ClusterConfig:
    """The joined cluster of pod 0: itself (local) and every other pod, which joins; the run id is the
    job's name, so a recreated job resumes and a joiner of another job is refused."""
    hosts = (HostSpec(kubernetes_env.node_id(0), pod.slots, local=True),
             *(HostSpec(kubernetes_env.node_id(rank), pod.slots, local=False) for rank in range(1, pod.pods)))
    join = JoinConfig(address=pod.address, run_id=pod.job_name, token=token,
                      timeout_s=knobs.JOIN_TIMEOUT_S.get())
    return ClusterConfig(hosts=hosts, launcher="join", join=join)


def run_joiner(address: str, node_id: Optional[str], run_id: Optional[str], token_file: Optional[str]) -> int:
    """``--join``: check the options, read the token, join; returns the exit code."""
    from minitrain.agent.join import join

    split_address(address, "--join")
    if not node_id:
        raise ConfigError("--join needs --node-id NAME: the host name this agent serves in the run (one of the "
                          "driver's hosts).")
    if not run_id:
        raise ConfigError("--join needs --run-id ID: the run id the driver's JoinConfig names.")
    token = _taken(read_token(token_file))
    return join(address, node_id, run_id, token, knobs.JOIN_TIMEOUT_S.get())


def _taken(token: str) -> str:
    """`token`, with MINITRAIN_JOIN_TOKEN removed from this process's environment: the agents and workers
    started from here inherit it, and minitrain hands a token only over stdin and pipes."""
    knobs.JOIN_TOKEN.unset()
    return token


def kubernetes_pod_main(pod: kubernetes_env.KubernetesPod, token_file: Optional[str]) -> Optional[int]:
    """On pod 0: make the joined cluster current and return None (the caller runs the target); on any
    other pod: join pod 0 and return the exit code."""
    from minitrain.hosts.cluster import use_cluster

    token = _taken(read_token(token_file))
    if pod.rank == 0:
        use_cluster(kubernetes_cluster(pod, token))
        print(f"minitrain.launch: {pod.flavor} pod 0 of {pod.pods}: driver and coordinator on port "
              f"{pod.master_port}, run {pod.job_name!r}", file=sys.stderr)
        return None
    from minitrain.agent.join import join

    print(f"minitrain.launch: {pod.flavor} pod {pod.rank} of {pod.pods}: joining {pod.address} as "
          f"{pod.node_id}", file=sys.stderr)
    return join(pod.address, pod.node_id, pod.job_name, token, knobs.JOIN_TIMEOUT_S.get())
