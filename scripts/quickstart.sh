#!/usr/bin/env bash
# The main job: installs what it needs, then trains examples/quickstart.py with DDP on 2 CPU workers.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
# A run name of its own each time: the main job trains, whatever ran before under the example's default
# name "quickstart" (e.g. `python -m minitrain.launch examples/quickstart.py --epochs 3`, which would
# otherwise resume this run, find its 5 epochs done, and train nothing).
exec .venv/bin/python examples/quickstart.py --num-workers 2 --epochs 5 --name "quickstart-$(date +%Y%m%d-%H%M%S)" "$@"
