"""The processes of the GPU check (`bench.gpu_check`): one check per process, run as
`python -m bench.gpu_check_jobs --check NAME --spec SPEC.json`.

Each check is a small real minitrain job (`TorchTrainer.fit()` in this process, the driver) on the
GPUs torch sees, or on CPU workers (gloo) when the spec says `cpu` (the mode that tests the check
itself on a machine without a GPU). A check returns `(summary, figures)`, raises `CheckFailed` with
what was wrong, or `CheckSkipped` with why it cannot run here; the process writes
`{"status", "summary", "figures"}` to `spec["result"]` (an unexpected exception is a FAIL with its
traceback). The training functions live in this module, so the workers import them by reference.

The spec: `result` (where the outcome goes), `tmp` (a scratch directory of this check), `cpu`
(bool), `workers` (ranks of the multi-rank checks: the GPU count, or 2 on CPU), `root` (the
repository). The checks of the examples and the DDP benchmark row are in `bench.gpu_check_training`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

from bench import gpu_check_faults, gpu_check_training
from bench.common import read_json, write_json
from bench.gpu_check_support import (CheckFailed, CheckSkipped, device_facts, expected_visible_devices, fit,
                                     rank_notes, require, write_rank_note)


# ---------------------------------------------------------------------- env: the machine and the stack


def _requirements(root: str) -> list[str]:
    """minitrain's dependencies as pyproject.toml lists them."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        return []
    with open(os.path.join(root, "pyproject.toml"), "rb") as handle:
        return list(tomllib.load(handle)["project"]["dependencies"])


def dependency_facts(root: str) -> tuple[list[str], list[str]]:
    """(missing, too old): minitrain's dependencies absent from this interpreter, and those whose
    version does not meet pyproject.toml (checked when `packaging` is importable)."""
    import re
    from importlib import metadata

    missing, mismatched = [], []
    for requirement in _requirements(root):
        name = re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0]
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            missing.append(requirement)
            continue
        try:
            from packaging.requirements import Requirement

            if not Requirement(requirement).specifier.contains(version, prereleases=True):
                mismatched.append(f"{requirement} (found {version})")
        except ImportError:
            pass
    return missing, mismatched


def _nvidia_smi() -> str:
    import subprocess

    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30)
        return done.stdout.strip() or done.stderr.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"nvidia-smi not usable: {exc}"


def trivial_train(config: dict) -> None:
    """One report: proves the coordinator, agent and worker talk (grpc, protobuf) in this interpreter."""
    import minitrain

    minitrain.report({"ok": 1})


def check_env(spec: dict):
    """The machine: torch and CUDA, the GPUs, NCCL, NVML, DeepSpeed, minitrain's dependencies, and one
    trivial CPU job through the whole stack."""
    import importlib.util
    import platform

    figures = {"python": platform.python_version(), "executable": sys.executable, "nvidia_smi": _nvidia_smi(),
               "proc_driver_gpus": len(os.listdir("/proc/driver/nvidia/gpus"))
               if os.path.isdir("/proc/driver/nvidia/gpus") else None,
               "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    missing, mismatched = dependency_facts(spec["root"])
    figures.update(missing=missing, mismatched=mismatched)
    import torch

    figures.update(torch=torch.__version__, torch_cuda=torch.version.cuda, cuda=torch.cuda.is_available(),
                   gpus=torch.cuda.device_count() if torch.cuda.is_available() else 0)
    if figures["cuda"]:
        figures["gpu_names"] = [torch.cuda.get_device_name(i) for i in range(figures["gpus"])]
        try:
            figures["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception as exc:  # noqa: BLE001 - a fact to record, not a failure here
            figures["nccl"] = f"unavailable: {exc}"
    try:
        import pynvml

        pynvml.nvmlInit()
        figures["nvml_devices"] = pynvml.nvmlDeviceGetCount()
    except Exception as exc:  # noqa: BLE001
        figures["nvml_devices"] = f"unavailable: {type(exc).__name__}: {exc}"
    spec_ds = importlib.util.find_spec("deepspeed")
    figures["deepspeed"] = _version("deepspeed") if spec_ds else None
    if missing:
        raise CheckFailed(f"minitrain's dependencies missing from {sys.executable}: {', '.join(missing)}. "
                          + carry_hint(missing), figures)
    if spec["need_cuda"] and not figures["cuda"]:
        raise CheckFailed(f"torch {figures['torch']} in {sys.executable} has no usable CUDA "
                          f"(torch.cuda.is_available() is False; CUDA build {figures['torch_cuda']}; nvidia-smi: "
                          f"{figures['nvidia_smi'][:200]!r}). Run with the Python that holds a CUDA torch "
                          "(GPU_CHECK_PYTHON=/path/to/python), or pass --allow-no-gpu to check only the script.",
                          figures)
    start = time.perf_counter()
    try:
        fit(trivial_train, dict(spec, cpu=True), "env_trivial", {}, workers=1)
    except Exception as exc:  # noqa: BLE001 - most likely a dependency too old for the tree (protobuf, grpcio)
        hint = (f" Versions below pyproject's: {', '.join(mismatched)}. "
                + carry_hint([m.split(" (found")[0] for m in mismatched])) if mismatched else ""
        raise CheckFailed(f"a trivial 1-worker CPU job failed: {type(exc).__name__}: {str(exc)[:400]}.{hint}",
                          figures) from exc
    figures["trivial_cpu_job_s"] = round(time.perf_counter() - start, 2)
    gpus = f"{figures['gpus']} GPU(s): {', '.join(figures.get('gpu_names', []))}" if figures["cuda"] else "no CUDA"
    summary = (f"torch {figures['torch']} (CUDA {figures['torch_cuda']}), {gpus}; NCCL {figures.get('nccl', '-')}; "
               f"NVML devices {figures['nvml_devices']}; DeepSpeed {figures['deepspeed'] or 'absent'}; "
               f"a trivial CPU job {figures['trivial_cpu_job_s']} s")
    if mismatched:
        summary += f"; versions below pyproject's: {', '.join(mismatched)}"
    return summary, figures


def _version(name: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "unknown version"


def carry_hint(requirements: list[str]) -> str:
    """How to bring packages to a machine that cannot download: wheels carried in .whl/, which
    scripts/gpu_check.sh installs into a scratch directory before it runs."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    names = " ".join(f"'{r}'" for r in requirements)
    return (f"On a machine with network access, in the repository root: python3 -m pip download --no-deps "
            f"--only-binary=:all: --python-version {version} --implementation cp --platform manylinux_2_28_x86_64 "
            f"--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl {names} ; then carry .whl "
            f"(git ignores it) with the tree: scripts/gpu_check.sh installs .whl/*.whl before it runs.")


# ---------------------------------------------------------------------- devices and CUDA_VISIBLE_DEVICES


def devices_train(config: dict) -> None:
    """Every rank notes what it sees of its device."""
    import minitrain

    write_rank_note(config["notes"], device_facts())
    minitrain.report({"ok": 1})


def check_devices(spec: dict):
    """One rank per GPU: each gets `cuda:<local rank>` from get_device(), CUDA's current device is set to
    it, CUDA_VISIBLE_DEVICES lists the run's GPUs on the node, the backend is NCCL, and no two ranks
    share a GPU (their UUIDs differ)."""
    notes_dir = os.path.join(spec["tmp"], "notes")
    workers = spec["workers"]
    fit(devices_train, spec, "devices", {"notes": notes_dir})
    notes = rank_notes(notes_dir, workers)
    for note in notes:
        rank = note["rank"]
        require(note["matmul_ok"], f"rank {rank}: a matmul on {note['device']} gave a wrong result")
        require(note["local_rank_env"] == str(note["local_rank"]),
                f"rank {rank}: LOCAL_RANK={note['local_rank_env']} but its context says {note['local_rank']}")
        if spec["cpu"]:
            require(note["device"] == "cpu" and note["backend"] == "gloo", f"rank {rank}: {note}")
            continue
        require(note["device"] == f"cuda:{note['local_rank']}",
                f"rank {rank}: get_device() = {note['device']}, expected cuda:{note['local_rank']}")
        require(note["current_device"] == note["local_rank"],
                f"rank {rank}: torch.cuda.current_device() = {note['current_device']}, expected {note['local_rank']}")
        expected = expected_visible_devices(workers)
        require(note["cuda_visible_devices"] == expected,
                f"rank {rank}: CUDA_VISIBLE_DEVICES={note['cuda_visible_devices']!r}, expected {expected!r}")
        require(note["backend"] == "nccl", f"rank {rank}: backend {note['backend']}, expected nccl")
    uuids = [n.get("uuid") for n in notes]
    if not spec["cpu"] and all(uuids):
        require(len(set(uuids)) == len(uuids), f"two ranks share a GPU: {uuids}")
    summary = "; ".join(f"rank {n['rank']}: {n['device']} CUDA_VISIBLE_DEVICES={n['cuda_visible_devices']} "
                        f"{n.get('name', '')}".rstrip() for n in notes)
    return f"{summary}; backend {notes[0]['backend']}", {"ranks": notes}


def shared_train(config: dict) -> None:
    """Two ranks on one GPU (a fractional share), gloo over CUDA tensors."""
    import torch
    import torch.distributed as dist

    import minitrain

    facts = device_facts()
    tensor = torch.full((4,), float(facts["rank"] + 1), device=facts["device"])
    dist.all_reduce(tensor)
    facts["all_reduce"] = tensor.tolist()
    write_rank_note(config["notes"], facts)
    minitrain.report({"ok": 1})


def check_shared_gpu(spec: dict):
    """`resources_per_worker={"GPU": 0.5}`: two ranks placed on one GPU, both `cuda:0`, the same UUID,
    an all_reduce of CUDA tensors between them (gloo: NCCL refuses two ranks on one device)."""
    from minitrain.torch import TorchConfig

    if spec["cpu"]:
        raise CheckSkipped("a fractional GPU share needs a GPU")
    notes_dir = os.path.join(spec["tmp"], "notes")
    fit(shared_train, spec, "shared_gpu", {"notes": notes_dir}, workers=2, scaling={"resources_per_worker": {"GPU": 0.5}},
        torch_config=TorchConfig(backend="gloo"))
    notes = rank_notes(notes_dir, 2)
    for note in notes:
        require(note["device"] == "cuda:0", f"rank {note['rank']}: get_device() = {note['device']}, expected cuda:0")
        require(note["all_reduce"] == [3.0] * 4, f"rank {note['rank']}: all_reduce gave {note['all_reduce']}")
        require(note["cuda_visible_devices"] == expected_visible_devices(1),
                f"rank {note['rank']}: CUDA_VISIBLE_DEVICES={note['cuda_visible_devices']!r}")
    require(notes[0].get("uuid") == notes[1].get("uuid"), f"the ranks are on different GPUs: {notes}")
    return f"2 ranks on {notes[0]['device']} ({notes[0].get('name')}), gloo all_reduce of CUDA tensors ok", {"ranks": notes}


# ---------------------------------------------------------------------- NCCL DDP


def ddp_train(config: dict) -> None:
    """DDP (NCCL on GPUs) of the benchmark's MLP: the replicas stay equal and the loss drops."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    import minitrain
    from bench.ddp import BATCH, MLP_IN, MLP_OUT, build_mlp
    from minitrain.torch import get_device, prepare_model

    device = get_device()
    rank, world = dist.get_rank(), dist.get_world_size()
    model = prepare_model(build_mlp())  # DDP when the world size is above 1
    if not isinstance(model, DistributedDataParallel):  # world size 1: wrap it ourselves, NCCL still runs
        model = DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
    generator = torch.Generator().manual_seed(rank)
    x = torch.randn(BATCH, MLP_IN, generator=generator).to(device)
    y = torch.randint(0, MLP_OUT, (BATCH,), generator=generator).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for step in range(config["steps"]):
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        minitrain.report({"step": step, "loss": losses[-1]})
    checksum = torch.stack([p.detach().double().sum() for p in model.parameters()]).sum().reshape(1)
    gathered = [torch.zeros_like(checksum) for _ in range(world)]
    dist.all_gather(gathered, checksum)
    ones = torch.ones(1, device=device)
    dist.all_reduce(ones)
    write_rank_note(config["notes"], {"rank": rank, "device": str(device), "backend": dist.get_backend(),
                                      "checksums": [g.item() for g in gathered], "all_reduce": ones.item(),
                                      "first_loss": losses[0], "last_loss": losses[-1], "world": world})


def check_ddp_nccl(spec: dict):
    """DDP over NCCL on every GPU (one rank each; with one GPU, world size 1 wrapped explicitly):
    all_reduce and all_gather agree, the replicas' parameters are equal, the loss drops."""
    notes_dir = os.path.join(spec["tmp"], "notes")
    fit(ddp_train, spec, "ddp_nccl", {"notes": notes_dir, "steps": 40})
    notes = rank_notes(notes_dir, spec["workers"])
    expected_backend = "gloo" if spec["cpu"] else "nccl"
    for note in notes:
        require(note["backend"] == expected_backend, f"rank {note['rank']}: backend {note['backend']}")
        require(note["all_reduce"] == float(note["world"]), f"rank {note['rank']}: all_reduce of ones = {note['all_reduce']}")
        checksums = note["checksums"]
        require(max(checksums) - min(checksums) <= 1e-6 * max(1.0, abs(checksums[0])),
                f"rank {note['rank']}: the replicas differ after DDP steps: {checksums}")
        require(note["last_loss"] < note["first_loss"],
                f"rank {note['rank']}: the loss did not drop ({note['first_loss']:.4f} -> {note['last_loss']:.4f})")
    summary = (f"{len(notes)} rank(s), {notes[0]['backend']}, replicas equal, loss {notes[0]['first_loss']:.3f} -> "
               f"{notes[0]['last_loss']:.3f}")
    return summary, {"ranks": notes}


# ---------------------------------------------------------------------- check process entry


def _checks() -> dict:
    return {"env": check_env, "devices": check_devices, "shared_gpu": check_shared_gpu, "ddp_nccl": check_ddp_nccl,
            "cuda_restart": gpu_check_faults.check_cuda_restart,
            "nvml_dashboard": gpu_check_faults.check_nvml_dashboard,
            "fsdp_dcp": gpu_check_training.check_fsdp_dcp,
            "deepspeed_zero2": gpu_check_training.check_deepspeed_zero2,
            "deepspeed_zero3": gpu_check_training.check_deepspeed_zero3,
            "ddp_bench": gpu_check_training.check_ddp_bench}


def run_check(name: str, spec: dict) -> dict:
    """Run check `name`; its outcome as `{"status", "summary", "figures"}`."""
    try:
        summary, figures = _checks()[name](spec)
        return {"status": "PASS", "summary": summary, "figures": figures}
    except CheckSkipped as exc:
        return {"status": "SKIP", "summary": str(exc), "figures": {}}
    except CheckFailed as exc:
        return {"status": "FAIL", "summary": str(exc), "figures": exc.figures}
    except Exception as exc:  # noqa: BLE001 - any other error is the check's failure, with its traceback
        traceback.print_exc()
        return {"status": "FAIL", "summary": f"{type(exc).__name__}: {str(exc)[:600]}",
                "figures": {"traceback": traceback.format_exc()[-4000:]}}


def main(argv=None) -> int:
    """`--check NAME --spec PATH`: run one check and write its outcome to the spec's `result`;
    `--role torchrun-ddp --spec PATH`: one torchrun worker of the DDP benchmark row."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check")
    parser.add_argument("--role", choices=["torchrun-ddp"])
    parser.add_argument("--spec", required=True)
    args = parser.parse_args(argv)
    spec = read_json(args.spec)
    if args.role == "torchrun-ddp":
        gpu_check_training.role_torchrun_ddp(spec)
        return 0
    outcome = run_check(args.check, spec)
    write_json(spec["result"], outcome)
    print(json.dumps({"check": args.check, "status": outcome["status"], "summary": outcome["summary"]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
