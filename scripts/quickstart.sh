#!/usr/bin/env bash
# The main job: installs what it needs, then trains examples/quickstart.py with DDP on 2 CPU workers.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
exec .venv/bin/python examples/quickstart.py --num-workers 2 --epochs 5 "$@"
