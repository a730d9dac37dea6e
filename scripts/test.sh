#!/usr/bin/env bash
# The test suite: installs what it needs, then runs the default run (tests/unit, tests/process,
# tests/e2e and the fault smoke of tests/faults; its budget is 12 minutes on 2 cores, docs/development.md)
# on 2 processes (pytest-xdist), and lists the 25 slowest (where the run's time goes, for keeping it
# under its budget). `--soak` as the first argument runs the soak tier instead: the tests marked `soak`
# (the fault matrix and properties, real wall-clock straggles, the benchmark smoke runs), before a
# release; MINITRAIN_FAULTS_PROFILE=soak draws 500 fault schedules per property. `--dist worksteal`: a
# process that runs out of tests takes queued ones from the other (with the default, one process could
# sit idle while the other ran the whole end-to-end tail alone). `--maxfail=5`: a fault that breaks every
# test (each then waits out its timeout) ends the run with five tracebacks instead of at CI's deadline.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh tests/unit -k auth` or `bash scripts/test.sh
# --soak tests/faults`.
#
# A hung test fails after its timeout (pytest-timeout, pyproject.toml), but a frozen process cannot time
# itself out: if the run is still going after MINITRAIN_TEST_WATCHDOG_S (default 65 min, 12 h for the
# release soak; the default run takes under 12 min, the soak tier about 10 with the default fault
# profile), the process table, with each process's state (T: stopped), is printed and pytest is
# interrupted (SIGINT: it prints what failed so far) so that the run ends with a trace before CI's deadline.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh --dev
args=("$@")
watchdog_s=${MINITRAIN_TEST_WATCHDOG_S:-3900}
if [ "${1:-}" = "--soak" ]; then
    args=(-m soak "${@:2}")  # the soak tier only (tests/conftest.py deselects it unless -m names it)
    if [ "${MINITRAIN_FAULTS_PROFILE:-}" = "soak" ]; then
        watchdog_s=${MINITRAIN_TEST_WATCHDOG_S:-43200}  # the release soak's 500 schedules per property take hours
    fi
fi
set -m  # without job control a background job ignores SIGINT, and the watchdog could not interrupt it
.venv/bin/python -m pytest -n 2 --dist worksteal --maxfail=5 -q -p no:cacheprovider --durations=25 ${args[@]+"${args[@]}"} &
tests=$!
(
    deadline=$((SECONDS + watchdog_s))
    while kill -0 "$tests" 2>/dev/null; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            echo "scripts/test.sh: the tests are still running after $watchdog_s s; processes:" >&2
            ps -eo pid,ppid,stat,etimes,args --forest | cut -c1-220 >&2
            kill -INT "$tests" 2>/dev/null
            break
        fi
        sleep 2
    done
) &
watchdog=$!
status=0
wait "$tests" || status=$?
wait "$watchdog" 2>/dev/null || true  # it ends by itself within a poll once the tests have (no kill: job control would report it)
exit "$status"
