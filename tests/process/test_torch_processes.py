"""minitrain.torch across processes: a fresh interpreter's imports, and prepare_model under a real
two-process gloo group."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


REPO_ROOT = Path(__file__).resolve().parents[2]


def _child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return env


def test_import_minitrain_torch_does_not_import_torch():
    code = (
        "import sys, minitrain.torch as m; "
        "assert 'torch' not in sys.modules, 'torch imported eagerly'; "
        "assert {'prepare_model', 'TorchTrainer', 'get_device'} <= set(dir(m)); "
        "m.get_device; assert 'torch' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=_child_env(), check=True, timeout=60)


_DDP_WORKER = textwrap.dedent(
    """
    import json, os, sys, time
    from datetime import timedelta
    from pathlib import Path

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel
    from torch.distributed.fsdp import FullyShardedDataParallel

    from minitrain import _session
    from minitrain.context import TrainContext
    from minitrain.torch import prepare_model

    rank, tmp = int(sys.argv[1]), Path(sys.argv[2])
    timeout = timedelta(seconds=30)
    port_file = tmp / "port"
    if rank == 0:
        store = dist.TCPStore("127.0.0.1", 0, 2, True, timeout=timeout, wait_for_workers=False)
        (tmp / "port.tmp").write_text(str(store.port))
        os.replace(tmp / "port.tmp", port_file)
    else:
        deadline = time.monotonic() + 30
        while not port_file.exists():
            if time.monotonic() > deadline:
                sys.exit("rank 0 never published its store port")
            time.sleep(0.02)
        store = dist.TCPStore("127.0.0.1", int(port_file.read_text()), 2, False, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=timeout)

    class FakeSession:
        context = TrainContext(experiment_name="ddp", world_size=2, world_rank=rank, local_rank=rank,
                               local_world_size=2)

    _session.set_current(FakeSession())
    torch.manual_seed(rank)  # different initial weights per rank: DDP must broadcast rank 0's
    model = prepare_model(nn.Linear(4, 1))
    model(torch.full((2, 4), float(rank + 1))).sum().backward()
    fsdp = prepare_model(nn.Linear(4, 2), parallel_strategy="fsdp")
    fsdp(torch.ones(3, 4)).sum().backward()  # sharded forward/backward really runs on CPU + gloo
    from minitrain.torch.checkpoint_dirs import owns_directory
    owners = [owns_directory(str(tmp)), owns_directory(str(tmp / f"own{rank}")), owns_directory(None)]
    result = {
        "owners": owners,
        "ddp": isinstance(model, DistributedDataParallel),
        "fsdp": isinstance(fsdp, FullyShardedDataParallel),
        "weight": model.module.weight.detach().flatten().tolist(),
        "grad": model.module.weight.grad.flatten().tolist(),
    }
    (tmp / f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    # Exit as minitrain workers do: rank 0 hosts the TCPStore, and a peer still tearing down its
    # process group when rank 0 is gone can abort ("terminate called without an active exception").
    os._exit(0)
    """
)


def test_prepare_model_wraps_in_ddp_across_two_processes(tmp_path):
    env = _child_env()
    if sys.platform.startswith("linux") and Path("/sys/class/net/lo").exists():
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # don't depend on the hostname resolving
    procs = [
        subprocess.Popen([sys.executable, "-c", _DDP_WORKER, str(rank), str(tmp_path)], cwd=REPO_ROOT, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for rank in range(2)
    ]
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=60)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(outputs)
    results = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    assert all(r["ddp"] and r["fsdp"] for r in results)
    # One uploader per physical directory: the shared one is rank 0's, each own one its rank's.
    assert [r["owners"] for r in results] == [[True, True, False], [False, True, False]]
    assert results[0]["weight"] == results[1]["weight"]  # broadcast from rank 0
    assert results[0]["grad"] == pytest.approx(results[1]["grad"])  # gradients all-reduced
    assert results[0]["grad"] == pytest.approx([3.0] * 4)  # mean of 2*1 and 2*2 per input feature
