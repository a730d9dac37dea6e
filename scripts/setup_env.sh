#!/usr/bin/env bash
# Creates .venv (once) and installs minitrain, editable, with its dependencies.
# torch is pinned to 2.13.0 so that an unpinned install never pulls a newer multi-GB CUDA build;
# on a GPU host, install the torch build you want into .venv first and this keeps it.
#   bash scripts/setup_env.sh          runtime dependencies
#   bash scripts/setup_env.sh --dev    plus the test tools (pytest, pytest-xdist, hypothesis, grpcio-tools)
#                                      and the Lightning / transformers extras that their tests run
# Whatever is installed, the torch already in .venv stays: a constraints file pins it, so a package
# that wants another torch fails the install instead of replacing it (with a multi-GB CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
    echo "minitrain needs Python >= 3.10; set PYTHON=/path/to/python3.x" >&2
    exit 1
fi
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
# torch is looked up by its installed metadata, never imported: importing it before numpy is installed
# printed torch's "Failed to initialize NumPy" warning on every fresh set-up.
torch_version() {
    .venv/bin/python -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null
}
if ! torch_version >/dev/null; then
    .venv/bin/python -m pip install -q "torch==2.13.0"
fi
extras=""
if [ "${1:-}" = "--dev" ]; then extras="[dev]"; fi
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
echo "torch==$(torch_version)" > "$constraints"
.venv/bin/python -m pip install -q -c "$constraints" -e ".${extras}"
