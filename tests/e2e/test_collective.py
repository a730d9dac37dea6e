"""minitrain.collective end to end: barrier, broadcast_from_rank_zero and a timeout naming the missing
rank, in one fit on 2 gloo workers."""

from __future__ import annotations

import json
import os
import time

import pytest

import minitrain
from minitrain import RunConfig, ScalingConfig
from minitrain.torch import TorchTrainer

pytestmark = pytest.mark.e2e


def train_with_collectives(config: dict):
    import torch.distributed as dist

    import minitrain.collective as collective

    rank = minitrain.get_context().get_world_rank()
    collective.barrier()
    first = collective.broadcast_from_rank_zero({"from": rank, "blob": "x" * 5000})
    second = collective.broadcast_from_rank_zero([rank] * 3)
    info = {"first_from": first["from"], "blob": len(first["blob"]), "second": second}
    if rank == 0:
        # Rank 1 never calls this barrier: it waits in a gloo barrier until rank 0 has timed out.
        started = time.monotonic()
        try:
            collective.barrier(timeout_s=0.5)
        except collective.CollectiveTimeoutError as exc:
            info.update(error=str(exc), missing=list(exc.missing_ranks), waited=time.monotonic() - started)
    dist.barrier()
    with open(os.path.join(config["out"], f"rank{rank}.json"), "w") as handle:
        json.dump(info, handle)


def test_barrier_broadcast_and_a_timeout_naming_the_missing_rank(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    TorchTrainer(train_with_collectives, train_loop_config={"out": str(out)},
                 scaling_config=ScalingConfig(num_workers=2),
                 run_config=RunConfig(name="collective", storage_path=str(tmp_path / "results"))).fit()

    info = {rank: json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)}
    for rank in (0, 1):
        assert info[rank]["first_from"] == 0 and info[rank]["blob"] == 5000
        assert info[rank]["second"] == [0, 0, 0]
    assert info[0]["missing"] == [1]
    assert "barrier() timed out after 0.5 s on rank 0: rank(s) [1] did not call it" in info[0]["error"]
    assert 0.5 <= info[0]["waited"] < 5
