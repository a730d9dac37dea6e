#!/usr/bin/env bash
# The test suite: installs what it needs, then runs every test on 2 processes (pytest-xdist).
# Extra arguments go to pytest, e.g. `bash scripts/test.sh tests/unit -k auth`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh --dev
exec .venv/bin/python -m pytest -n 2 -q -p no:cacheprovider "$@"
