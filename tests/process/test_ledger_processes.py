"""The resource ledger across real processes: a SIGKILLed holder's claim is free again, a waiting
process gets the host when the holder ends, ten processes racing for two slots never hold three, and a
process holding the ledger's lock cannot make a run wait past its limit."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from minitrain.errors import LaunchError
from minitrain.hosts import hostinfo
from minitrain.hosts.cluster import ClusterConfig, HostSpec
from minitrain.hosts.demand import Need
from minitrain.hosts.hold import this_host_ledger, this_host_totals
from minitrain.hosts.reserve import ResourcesBusyError, reserve

CLAIMANT = Path(__file__).with_name("ledger_claimant.py")
LOCAL = ClusterConfig(hosts=(HostSpec("localhost"),))


@pytest.fixture
def ledger_env(tmp_path, monkeypatch):
    monkeypatch.setenv("MINITRAIN_LEDGER_DIR", str(tmp_path / "ledger"))
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")])}


def _holder(env) -> subprocess.Popen:
    holder = subprocess.Popen([sys.executable, str(CLAIMANT), "hold", "-"], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_sigkilled_holder_releases_at_once(ledger_env):
    holder = _holder(ledger_env)
    try:
        claims = this_host_ledger("localhost").snapshot(this_host_totals()).claims
        assert [(c.run, c.pid) for c in claims] == [("holder", holder.pid)]
        holder.kill()
        holder.wait(30)
        # The process is gone, so is its lock: the very next look finds nothing held (no wait, no retry).
        assert this_host_ledger("localhost").snapshot(this_host_totals()).claims == ()
    finally:
        holder.kill()
        holder.wait(30)


def test_a_waiting_run_starts_when_a_killed_holder_dies(ledger_env):
    holder = _holder(ledger_env)
    told = []

    def on_wait(text):
        told.append(text)
        if len(told) == 1:
            os.kill(holder.pid, signal.SIGKILL)

    try:
        with reserve(LOCAL, Need(1, cpus=float(hostinfo.cpu_count())), "second", on_wait=on_wait,
                     poll_s=0.01) as second:
            assert second.claims["localhost"].pid == os.getpid()
        assert f"held by run holder (" in told[0] and f"pid {holder.pid}" in told[0]
    finally:
        holder.kill()
        holder.wait(30)


def test_ten_processes_racing_for_two_slots_never_hold_three(ledger_env, tmp_path):
    markers = tmp_path / "holding"
    markers.mkdir()
    racers = [subprocess.Popen([sys.executable, str(CLAIMANT), "race", str(markers)], env=ledger_env,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for _ in range(10)]
    for racer in racers:
        assert racer.stdout.readline().strip() == "ready"
    for racer in racers:  # all at once: their first claims land in the same few milliseconds
        racer.stdin.write("go\n")
        racer.stdin.flush()
    counts = []
    for racer in racers:
        out, _ = racer.communicate(timeout=120)
        assert racer.returncode == 0
        counts.append(int(out.strip()))
    assert max(counts) <= 2, f"more than two held the host's two slots at once: {counts}"
    assert this_host_ledger("localhost").snapshot(this_host_totals()).claims == ()


def test_one_after_the_other_in_a_loop(ledger_env):
    """The second run gets the host after every release of the first, never while it holds it."""
    for _ in range(20):
        holder = _holder(ledger_env)
        released = []

        def on_wait(text):
            if not released:
                holder.stdin.close()  # the holder's run ends
                holder.wait(30)
                released.append(True)

        with reserve(LOCAL, Need(1, cpus=float(hostinfo.cpu_count())), "second", on_wait=on_wait, poll_s=0.01):
            assert released and holder.returncode == 0


def test_a_process_holding_the_ledgers_lock_cannot_freeze_a_run(ledger_env):
    """Any local user can flock the ledger's .lock (flock needs only read access): a run that claims waits its
    limit and no longer, and its waiting line names the process that holds the lock; once that process lets
    go, the next run claims at once."""
    locker = subprocess.Popen([sys.executable, str(CLAIMANT), "lock", "-"], env=ledger_env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    told, outcome = [], {}
    whole_host = Need(1, cpus=float(hostinfo.cpu_count()))

    def run() -> None:
        try:
            outcome["reservation"] = reserve(LOCAL, whole_host, "blocked", timeout_s=1.0, on_wait=told.append,
                                             poll_s=0.05)
        except BaseException as exc:  # noqa: BLE001 - judged below, in the test's thread
            outcome["error"] = exc

    waiter = threading.Thread(target=run, daemon=True)
    try:
        assert locker.stdout.readline().strip() == "locked"
        started = time.monotonic()
        waiter.start()
        waiter.join(timeout=30)
        took = time.monotonic() - started
        assert not waiter.is_alive(), "the run hung on the ledger's lock"
    finally:
        locker.kill()  # a run stuck on the lock gets it now, and its thread ends
        locker.wait(30)
        if waiter.ident is not None:
            waiter.join(30)
        if "reservation" in outcome:
            outcome["reservation"].release()
    assert isinstance(outcome.get("error"), ResourcesBusyError), outcome
    assert took < 1.0 + 2.0, f"a wait limit of 1 s took {took:.1f} s"
    lock = os.path.join(os.environ["MINITRAIN_LEDGER_DIR"], ".lock")
    user = pwd.getpwuid(os.geteuid()).pw_name
    named = f"held by pid {locker.pid} ({user}), which holds the ledger's lock {lock} on localhost"
    assert named in str(outcome["error"]) and "MINITRAIN_RESOURCE_WAIT_S=1" in str(outcome["error"])
    assert told and named in told[0]
    with reserve(LOCAL, whole_host, "next", timeout_s=0) as after:  # the lock went with its process
        assert after.claims["localhost"].run == "next"


def test_launch_status_lists_what_the_ledger_holds(ledger_env):
    holder = _holder(ledger_env)
    try:
        shown = subprocess.run([sys.executable, "-m", "minitrain.launch", "--status"], env=ledger_env,
                               capture_output=True, text=True, timeout=60)
    finally:
        holder.kill()
        holder.wait(30)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("localhost: ")
    assert f"  run holder (" in shown.stdout and f"pid {holder.pid}," in shown.stdout
    assert f"{float(hostinfo.cpu_count()):g} CPUs" in shown.stdout


NOBODY = 65534


def _as_nobody(script: str, **kwargs) -> subprocess.Popen:
    """`sh -c script` as the user nobody (setpriv, util-linux): another user of the host."""
    return subprocess.Popen(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "sh", "-c", script],
                            **kwargs)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv") or not shutil.which("flock"),
                    reason="acting as another user needs root, setpriv and flock (util-linux)")
def test_another_users_claim_counts_and_neither_user_can_erase_the_others(monkeypatch):
    """Two users share the ledger: nobody's live claim, checked (its file, uid and pid agree), holds the host
    for root's run until nobody's process ends, and nobody cannot remove root's claim (the sticky bit)."""
    # pytest's tmp_path is root's alone (0700 above it), and so is the session's TMPDIR (tests/conftest.py):
    # the other user needs a path it can reach, the system's temporary directory (removed on the way out)
    with tempfile.TemporaryDirectory(prefix="minitrain-ledger-test-", dir="/tmp") as shared:
        os.chmod(shared, 0o755)
        monkeypatch.setenv("MINITRAIN_LEDGER_DIR", os.path.join(shared, "ledger"))
        _two_users_share_the_ledger()


def _two_users_share_the_ledger() -> None:
    from minitrain.hosts.ledger import Claim

    ledger = this_host_ledger("localhost")
    totals = this_host_totals()
    ledger.snapshot(totals)  # creates the directory, mode 1777
    claim = Claim("theirs", "nobody", NOBODY, 0, 1.0, (), totals.cpus, 0)
    before, after = claim.to_json().split('"pid": 0')
    text = f"'{before}\"pid\": '$$'{after}'"  # the shell puts its own pid in
    # nobody writes its claim as minitrain does (a temporary name, locked, then renamed into place) and holds
    # its flock as the process the claim names (exec keeps the shell's pid: flock holds, its child waits)
    theirs = _as_nobody(f"cd {ledger.directory} && echo {text} > .tmp-nobody && exec flock .tmp-nobody "
                        f"sh -c 'mv .tmp-nobody claim-nobody.json && echo ok && exec cat'",
                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert theirs.stdout.readline().strip() == "ok"

        def counted():
            claims = ledger.snapshot(totals).claims
            return [(c.run, c.uid, c.pid) for c in claims]

        assert counted() == [("theirs", NOBODY, theirs.pid)]
        with pytest.raises(ResourcesBusyError, match=r"held by run theirs \(nobody, pid"):
            reserve(LOCAL, Need(1, cpus=totals.cpus), "mine", timeout_s=0)
        with reserve(LOCAL, Need(1, cpus=0.0, memory_bytes=1), "mine") as mine:
            own = os.path.join(ledger.directory, mine.claims["localhost"].file)
            erase = _as_nobody(f"rm -f {own}", stderr=subprocess.PIPE, text=True)
            _, err = erase.communicate(timeout=30)
            assert erase.returncode != 0 and "Operation not permitted" in err and os.path.exists(own)
        theirs.stdin.close()  # nobody's run ends: its lock goes, and its claim with it
        theirs.wait(30)
        assert counted() == []
    finally:
        theirs.kill()
        theirs.wait(30)


def test_a_host_whose_ledger_cannot_be_reached_says_why(ledger_env):
    from minitrain.hosts.reserve import ledger_report

    report = ledger_report(ClusterConfig(hosts=(HostSpec("host.invalid"),)))
    assert report.startswith("host.invalid: cannot read its ledger: the resource ledger of host host.invalid did "
                             "not answer (it ended: ")
    with pytest.raises(LaunchError, match="host.invalid did not answer"):
        reserve(ClusterConfig(hosts=(HostSpec("host.invalid"),)), Need(1, gpus=1.0), "r")
