"""DeepSpeed for the tests, installed on demand and run on CPU.

`deepspeed_environment()` answers the environment in which a subprocess imports DeepSpeed with its CPU
accelerator (`DS_ACCELERATOR=cpu`): the installed DeepSpeed when there is one (`pip install -e '.[dev]'`
installs the pinned one), else `DEEPSPEED_PIN` installed by pip into a cache directory,
`~/.cache/minitrain-tests/deepspeed-<pin>-py<X.Y>`, with the few pure-Python packages DeepSpeed needs
beside torch (`--no-deps`: torch is never installed a second time). The cache is kept between runs, as
DeepSpeed keeps the C++ ops it compiles on first use (`~/.cache/torch_extensions`); both are built once
per machine, under a file lock so that pytest-xdist workers wait for one another, and the install is
moved into place only when complete. The ops the tests use (the shared-memory collective every engine
loads on CPU, and CPU Adam for ZeRO-Offload) are compiled here, before any test's timeout starts, through
a compiler wrapper (`CXX`, torch's extension builder reads it) that drops DeepSpeed's `-g` and turns its
`-O3` into `-O1`: the tests train tiny models, and on a fresh 2-core CI machine the build was the suite's
slowest step (321 s beside the other tests; on a quiet one 97 s, 64 s with the wrapper).

Raises `Unavailable` with the reason (no network, no compiler, pip's error) when that cannot be done.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

DEEPSPEED_PIN = "deepspeed==0.19.8"  # keep in step with the dev extra in pyproject.toml
# DeepSpeed's requirements other than torch, by the module that shows each is importable.
REQUIREMENTS = {"hjson": "hjson", "ninja": "ninja", "cpuinfo": "py-cpuinfo", "einops": "einops",
                "msgpack": "msgpack", "pydantic": "pydantic>=2", "tqdm": "tqdm", "psutil": "psutil",
                "packaging": "packaging", "numpy": "numpy"}
INSTALL_TIMEOUT_S = 900
BUILD_TIMEOUT_S = 1200  # two C++ ops, compiled once per machine; minutes on a loaded 2-core host

# Compile (or load from torch's extension cache) the CPU ops the tests use; report fp16 support.
_BUILD_OPS = """
from deepspeed.accelerator import get_accelerator
accelerator = get_accelerator()
assert accelerator.device_name() == "cpu", accelerator.device_name()
accelerator.create_op_builder("ShareMemCommBuilder").load()
accelerator.create_op_builder("CPUAdamBuilder").load()
print("fp16" if accelerator.is_fp16_supported() else "bf16")
"""


# Runs the real compiler (its path substituted in) without debug info and at -O1 (see the module docstring).
_QUICK_CXX = """#!/bin/sh
compiler={compiler}
for arg do
    shift
    case "$arg" in
        -g) ;;
        -O3) set -- "$@" -O1 ;;
        *) set -- "$@" "$arg" ;;
    esac
done
exec "$compiler" "$@"
"""


class Unavailable(Exception):
    """DeepSpeed cannot run here; the message says why."""


def _cache_root() -> Path:
    return Path(os.path.expanduser("~")) / ".cache" / "minitrain-tests"


def _install(target: Path) -> None:
    missing = [req for module, req in REQUIREMENTS.items() if importlib.util.find_spec(module) is None]
    partial = target.with_name(target.name + f".partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    for args in [[DEEPSPEED_PIN, "--no-deps"]] + ([missing] if missing else []):
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                               "--target", str(partial), *args],
                              capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
        if done.returncode != 0:
            shutil.rmtree(partial, ignore_errors=True)
            raise Unavailable(f"pip install {' '.join(args)} failed: {(done.stdout + done.stderr)[-1500:]}")
    partial.rename(target)


def _quick_compiler(compiler: str) -> str:
    """The wrapper script around `compiler` (written once per machine, atomically)."""
    path = _cache_root() / "quick-c++"
    text = _QUICK_CXX.format(compiler=shlex.quote(compiler))
    if not path.is_file() or path.read_text() != text:
        partial = path.with_name(f"{path.name}.partial-{os.getpid()}")
        partial.write_text(text)
        partial.chmod(0o755)
        partial.rename(path)
    return str(path)


def deepspeed_environment() -> tuple[dict, str]:
    """(environment for subprocesses, "fp16" or "bf16": the half precision DeepSpeed's CPU accelerator
    supports on this CPU)."""
    env = dict(os.environ, DS_ACCELERATOR="cpu")
    root = Path(__file__).resolve().parents[1]
    paths = [str(root)]
    if importlib.util.find_spec("deepspeed") is None:
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        target = _cache_root() / f"{DEEPSPEED_PIN.replace('==', '-')}-py{version}"
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target.parent / ".deepspeed.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not target.is_dir():
                _install(target)
        paths.append(str(target))
        env["PATH"] = os.pathsep.join([str(target / "bin"), env.get("PATH", "")])  # ninja, if pip brought it
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in [env.get("PYTHONPATH")] if p])
    _cache_root().mkdir(parents=True, exist_ok=True)
    compiler = shutil.which("c++", path=env["PATH"])
    if compiler is None:
        raise Unavailable("DeepSpeed compiles its CPU ops with a C++ compiler and none is installed "
                          "(scripts/install_system_deps.sh installs g++)")
    env["CXX"] = _quick_compiler(compiler)
    with open(_cache_root() / ".deepspeed-ops.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = subprocess.run([sys.executable, "-c", _BUILD_OPS], env=env, capture_output=True, text=True,
                              timeout=BUILD_TIMEOUT_S)
    if done.returncode != 0:
        raise Unavailable(f"DeepSpeed's CPU ops did not build: {(done.stdout + done.stderr)[-1500:]}")
    return env, done.stdout.strip().splitlines()[-1]
