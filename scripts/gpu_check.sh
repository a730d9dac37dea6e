#!/usr/bin/env bash
# The GPU check: the paths only a GPU exercises (NCCL DDP, FSDP + DCP resume, DeepSpeed ZeRO-2/3, get_device()
# and CUDA_VISIBLE_DEVICES per rank, a CUDA worker crash and its restart, NVML telemetry on the dashboard, the
# DDP benchmark row against torchrun), as small real minitrain jobs on this machine's GPUs, in under 8 minutes.
#
#   bash scripts/gpu_check.sh                      # every check; exit 1 when one FAILED (SKIP is fine)
#   bash scripts/gpu_check.sh --only devices,ddp_nccl
#   bash scripts/gpu_check.sh --allow-no-gpu       # no GPU here: checks the script's own plumbing (CI)
#   bash scripts/gpu_check.sh --cpu                # every check on CPU workers: tests the checks themselves
#
# What each check does: bench/gpu_check.py. Output: one summary table; every figure as JSON in
# $OUT/gpu_check.json when OUT is set (or --json PATH).
#
# Which Python: $GPU_CHECK_PYTHON when set, else the first of .venv/bin/python, python3 and python whose torch
# sees CUDA, else the first that has torch, else the first there is (the env check then says what is missing).
# Nothing is downloaded: on a machine without network, packages minitrain needs that its Python lacks travel as
# wheels in .whl/ (git ignores it; the env check prints the `pip download` command that makes them), installed
# here into a scratch directory with `pip --no-index` and put on PYTHONPATH. Torch itself (with CUDA) must be
# in that Python already: it is far larger than what can travel with the tree.
#
# Time: every check has its own timeout (capped by GPU_CHECK_TIMEOUT_S, default 240 s), no check starts past
# the budget (--budget-s, default 450 s), and the whole run is stopped at GPU_CHECK_TOTAL_S (default 475 s).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

candidates=()
if [ -n "${GPU_CHECK_PYTHON:-}" ]; then candidates+=("$GPU_CHECK_PYTHON"); fi
for name in .venv/bin/python python3 python; do
    if command -v "$name" >/dev/null 2>&1; then candidates+=("$(command -v "$name")"); fi
done
if [ ${#candidates[@]} -eq 0 ]; then
    echo "gpu_check: no Python found (set GPU_CHECK_PYTHON)" >&2
    exit 2
fi

# 0: torch with CUDA; 3: torch without CUDA; anything else: no usable torch.
probe='import sys, torch; sys.exit(0 if torch.cuda.is_available() else 3)'
PY=""
fallback=""
for candidate in "${candidates[@]}"; do
    timeout 120 "$candidate" -c "$probe" >/dev/null 2>&1
    status=$?
    case $status in
        0) echo "gpu_check: $candidate: torch with CUDA" ;;
        3) echo "gpu_check: $candidate: torch without CUDA" ;;
        *) echo "gpu_check: $candidate: no usable torch (exit $status)" ;;
    esac
    if [ $status -eq 0 ]; then PY=$candidate; break; fi
    if [ $status -eq 3 ] && [ -z "$fallback" ]; then fallback=$candidate; fi
done
PY=${PY:-${fallback:-${candidates[0]}}}
echo "gpu_check: using $PY"

if compgen -G ".whl/*.whl" >/dev/null; then
    site=$(mktemp -d "${TMPDIR:-/tmp}/minitrain-gpu-check-site.XXXXXX")
    echo "gpu_check: installing the carried wheels $(ls .whl | tr '\n' ' ')into $site"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" .whl/*.whl || {
        echo "gpu_check: installing .whl/*.whl failed" >&2
        exit 2
    }
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
# The tree's minitrain and bench first, also in every process the checks start.
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

exec timeout -k 15 "${GPU_CHECK_TOTAL_S:-475}" "$PY" -m bench.gpu_check \
    --check-timeout-s "${GPU_CHECK_TIMEOUT_S:-240}" "$@"
