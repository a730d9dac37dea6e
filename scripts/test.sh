#!/usr/bin/env bash
# The test suite: installs what it needs, then runs every test on 2 processes (pytest-xdist), and lists
# the 25 slowest (where the suite's time goes, for keeping CI under its budget). `--dist worksteal`: a
# process that runs out of tests takes queued ones from the other (with the default, one process could
# sit idle while the other ran the whole end-to-end tail alone). `--maxfail=5`: a fault that breaks every
# test (each then waits out its timeout) ends the run with five tracebacks instead of at CI's deadline.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh tests/unit -k auth`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh --dev
exec .venv/bin/python -m pytest -n 2 --dist worksteal --maxfail=5 -q -p no:cacheprovider --durations=25 "$@"
