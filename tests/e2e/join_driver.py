"""The driver of tests/e2e/test_kubernetes_pods.py's `--join` test, outside Kubernetes mode: a fit() whose
cluster is this machine ("head") and a host that joins ("gpu-a"), built with the public ClusterConfig/JoinConfig.

    python join_driver.py OUT STORAGE ADDRESS RUN_ID     # the token from MINITRAIN_JOIN_TOKEN_FILE
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import cloudpickle  # noqa: E402

from bench import kubernetes_jobs  # noqa: E402
from bench.kubernetes_jobs import train  # noqa: E402

from minitrain import RunConfig, ScalingConfig  # noqa: E402
from minitrain.hosts.cluster import ClusterConfig, HostSpec, use_cluster  # noqa: E402
from minitrain.hosts.joining import JoinConfig, read_token  # noqa: E402
from minitrain.torch import TorchTrainer  # noqa: E402

cloudpickle.register_pickle_by_value(kubernetes_jobs)  # the joined host's workers need not find the file

if __name__ == "__main__":
    out, storage, address, run_id = sys.argv[1:5]
    use_cluster(ClusterConfig(hosts=(HostSpec("head", local=True), HostSpec("gpu-a")), launcher="join",
                              join=JoinConfig(address=address, run_id=run_id, token=read_token(), timeout_s=120)))
    result = TorchTrainer(train, train_loop_config={"out": out, "steps": 3, "step_s": 0.05},
                          scaling_config=ScalingConfig(num_workers=2, placement_strategy="STRICT_SPREAD"),
                          run_config=RunConfig(name="joined", storage_path=storage)).fit()
    with open(os.path.join(out, "result.json"), "w") as handle:
        json.dump({"metrics": result.metrics}, handle)
