#!/usr/bin/env bash
# System packages some tests need: openssh-server for a private sshd per network namespace and iproute2
# for `ip netns` (the fake multi-host cluster, scripts/netns_cluster.py; the system ssh service is not
# used), chromium for the dashboard's browser test (tests/e2e/test_dashboard.py, headless), and Debian's
# Slurm (slurmctld, slurmd, slurm-client) with munge for the real Slurm cluster of the Slurm tests
# (tests/slurm_cluster.py, which also installs them itself when they are missing), and a C++ compiler
# (g++) for the C++ ops DeepSpeed compiles on CPU (tests/deepspeed_support.py, tests/e2e/test_deepspeed_cpu.py).
# Idempotent: installs only what is missing, and only as root with apt-get; otherwise says why it
# skipped (those tests then skip themselves with the reason). Never fails CI.
set -uo pipefail
missing=""
[ -x /usr/sbin/sshd ] || missing="$missing openssh-server"
command -v ip >/dev/null 2>&1 || missing="$missing iproute2"
command -v chromium >/dev/null 2>&1 || missing="$missing chromium"
[ -x /usr/sbin/slurmctld ] || missing="$missing slurmctld"
[ -x /usr/sbin/slurmd ] || missing="$missing slurmd"
command -v srun >/dev/null 2>&1 || missing="$missing slurm-client"
[ -x /usr/sbin/munged ] || missing="$missing munge"
command -v c++ >/dev/null 2>&1 || missing="$missing g++"
if [ -z "$missing" ]; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "install_system_deps: skipped (not root); tests needing$missing will be skipped" >&2
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install_system_deps: skipped (no apt-get); install$missing by hand" >&2
    exit 0
fi
echo "install_system_deps: installing$missing" >&2
if ! DEBIAN_FRONTEND=noninteractive apt-get update -qq; then
    echo "install_system_deps: apt-get update failed; tests needing$missing will be skipped" >&2
    exit 0
fi
# One package at a time: a distribution without one of them (Ubuntu ships chromium as a snap) still
# gets the others.
for package in $missing; do
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$package" >/dev/null; then
        echo "install_system_deps: could not install $package; the tests needing it will be skipped" >&2
    fi
done
exit 0
