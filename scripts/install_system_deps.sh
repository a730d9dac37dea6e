#!/usr/bin/env bash
# System packages the fake multi-host cluster tests need (scripts/netns_cluster.py): openssh-server for
# a private sshd per network namespace (the system ssh service is not used) and iproute2 for `ip netns`.
# Idempotent: installs only when /usr/sbin/sshd or `ip` is missing, and only as root with apt-get;
# otherwise says why it skipped (those tests then skip themselves with the reason). Never fails CI.
set -uo pipefail
if [ -x /usr/sbin/sshd ] && command -v ip >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "install_system_deps: skipped (not root); cluster tests will be skipped" >&2
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install_system_deps: skipped (no apt-get); install openssh-server and iproute2 by hand" >&2
    exit 0
fi
echo "install_system_deps: installing openssh-server iproute2" >&2
if ! { DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
       DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openssh-server iproute2 >/dev/null; }; then
    echo "install_system_deps: apt-get failed; cluster tests will be skipped" >&2
fi
exit 0
