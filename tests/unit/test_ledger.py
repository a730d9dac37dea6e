"""The host's resource ledger (minitrain.hosts.ledger) and the run's demand on it (demand.py), in process.

Claims are real files with real flocks in tmp_path; a claim "held by another process" is a descriptor
this test holds on its own open file description, which flock treats exactly as another process's.
"""

from __future__ import annotations

import fcntl
import json
import os
import pwd
import threading
import time

import pytest

from minitrain.errors import ConfigError
from minitrain.hosts import ledger as ledger_mod
from minitrain.hosts.cluster import ClusterConfig, HostSpec
from minitrain.hosts.demand import Need, plan, room, waiting_text
from minitrain.hosts.gpus import Gpu
from minitrain.hosts.ledger import Claim, Ledger, LedgerError, Snapshot, Totals
from minitrain.hosts.reserve import ResourcesBusyError, reserve

FOUR_GPUS = Totals(tuple(Gpu(i, f"GPU-{i:04d}") for i in range(4)), 8.0, 64 * 2**30)


def _ledger(tmp_path, **kwargs) -> Ledger:
    return Ledger(str(tmp_path / "ledger"), host="gpu1", **kwargs)


def _claim_gpus(ledger: Ledger, count: int, run: str = "r"):
    need = Need(count, gpus=1.0)
    return ledger.claim(FOUR_GPUS, run, lambda snap: need.claim_for(count, snap))


def test_a_claim_is_seen_by_every_reader_and_gone_when_released(tmp_path):
    ledger = _ledger(tmp_path)
    held = _claim_gpus(ledger, 3, run="first")
    assert held.claim.gpus == (0, 1, 2) and held.claim.pid == os.getpid()
    mode = os.stat(ledger.directory).st_mode
    assert mode & 0o1777 == 0o1777  # sticky and shared, whatever the umask
    other = Ledger(ledger.directory, host="gpu1")  # another run on the host reads the same files
    snapshot = other.snapshot(FOUR_GPUS)
    assert [c.run for c in snapshot.claims] == ["first"] and snapshot.free_gpus() == [3]
    assert _claim_gpus(other, 2) is None  # only one GPU is left: nothing is held
    second = _claim_gpus(other, 1, run="second")
    assert second.claim.gpus == (3,)
    held.release()
    held.release()  # idempotent
    assert [c.run for c in other.snapshot(FOUR_GPUS).claims] == ["second"]
    second.release()
    assert os.listdir(ledger.directory) == [ledger_mod.LOCK_NAME]


def test_a_claim_whose_holder_died_is_stale_and_removed(tmp_path):
    """A claim file whose lock nobody holds (its process died: the kernel dropped the lock) counts for
    nothing, and the first reader that may remove it does."""
    ledger = _ledger(tmp_path)
    held = _claim_gpus(ledger, 4)
    name = held.claim.file
    os.close(held._fd)  # what the kernel does when the holder dies: the lock goes, the file stays
    held._fd = None
    assert name in os.listdir(ledger.directory)
    snapshot = ledger.snapshot(FOUR_GPUS)
    assert snapshot.claims == () and snapshot.problems == ()
    assert name not in os.listdir(ledger.directory)


def _plant(ledger: Ledger, name: str, content: str, uid: int = 0, locked: bool = True) -> int:
    os.makedirs(ledger.directory, exist_ok=True)
    os.chmod(ledger.directory, 0o1777)
    path = os.path.join(ledger.directory, name)
    with open(path, "w") as handle:
        handle.write(content)
    os.chown(path, uid, -1)
    fd = os.open(path, os.O_RDONLY)
    if locked:
        fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def _content(**changes) -> str:
    claim = {"version": 1, "run": "x", "user": "root", "uid": os.geteuid(), "pid": os.getpid(), "since": 1.0,
             "gpus": [0, 1], "cpus": 0.0, "memory_bytes": 0}
    return json.dumps({**claim, **changes})


@pytest.mark.parametrize("content, uid, why", [
    ("{not json", 0, "corrupt"),
    (_content(gpus="all"), 0, "corrupt"),
    (_content(), 4242, "refused as foreign"),  # the file's owner is not the uid it names
    (_content(pid=2**22), 0, "not a process of"),  # no such process: pids stay below PID_MAX_LIMIT
])
def test_a_held_claim_that_is_corrupt_or_foreign_is_refused_with_why(tmp_path, content, uid, why):
    if os.geteuid() != 0 and uid:
        pytest.skip("chown to another uid needs root")
    ledger = _ledger(tmp_path)
    fd = _plant(ledger, "claim-planted.json", content, uid=uid)
    try:
        snapshot = ledger.snapshot(FOUR_GPUS)
        assert snapshot.claims == ()
        assert len(snapshot.problems) == 1 and why in snapshot.problems[0]
        assert "claim-planted.json" in snapshot.problems[0]
        assert snapshot.free_gpus() == [0, 1, 2, 3]
    finally:
        os.close(fd)


def _raw(**fields: str) -> str:
    """A claim's text with some values as raw JSON text (Infinity, 400 digits: what json.dumps would not write)."""
    text = _content(**{name: "@" + name for name in fields})
    for name, raw in fields.items():
        text = text.replace(f'"@{name}"', raw)
    return text


@pytest.mark.parametrize("content, why", [
    (_raw(since="Infinity"), "since is Infinity, not a number from 0 to "),
    (_raw(since="1e300"), "since is 1e+300, not a number from 0 to "),
    (_raw(since="NaN"), "since is NaN, not a number"),
    (_raw(cpus="-Infinity"), "cpus is -Infinity, not a number from 0 to 1048576"),
    (_raw(cpus="9" * 400), "cpus is a 400-digit number, not a number from 0 to 1048576"),
    (_raw(memory_bytes="9" * 400), "memory_bytes is a 400-digit number, not a whole number from 0 to "),
    (_raw(uid="9" * 400), "uid is a 400-digit number, not a whole number from 0 to 4294967294"),
    (_raw(pid=str(2**40)), "pid is 1099511627776, not a whole number from 0 to 4194304"),
    (_raw(gpus=json.dumps(list(range(2000)))), "gpus is [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11..., not a list"),
    (_raw(gpus="[0, 0]"), "gpus is [0, 0], not a list of distinct GPU indices below 1024"),
    ("[" * 60000, "nested too deeply to be a claim"),
])
def test_a_hostile_claim_is_refused_naming_the_field_and_crashes_no_reader(local_ledger, caplog, content, why):
    """Another user's claim is text anyone can write: a value that is not finite, out of range or of the wrong
    type leaves the claim out, named once in the log (the file and the field), and no reader fails: not the
    snapshot, not a run that claims, not --status."""
    from minitrain.hosts.reserve import ledger_report

    ledger = Ledger(local_ledger, host="localhost")
    fd = _plant(ledger, "claim-hostile.json", content, uid=os.geteuid())
    try:
        with caplog.at_level("WARNING", logger="minitrain"):
            for _ in range(2):
                snapshot = ledger.snapshot(FOUR_GPUS)
                assert snapshot.claims == () and len(snapshot.problems) == 1
        path = os.path.join(local_ledger, "claim-hostile.json")
        assert snapshot.problems[0].startswith(f"{path} (owned by ") and why in snapshot.problems[0]
        assert [r.getMessage() for r in caplog.records] == [f"resource ledger of localhost: {snapshot.problems[0]}"]
        with reserve(LOCAL, _whole_host(), "mine", timeout_s=0) as mine:  # counted free: the run claims at once
            assert mine.claims["localhost"].run == "mine"
        report = ledger_report(LOCAL)
        assert report.startswith("localhost: ") and f"  refused: {path} (owned by " in report
    finally:
        os.close(fd)


def test_a_claim_for_more_than_the_host_has_is_refused_and_blocks_nobody(local_ledger):
    """A live, well-formed claim of this user for 1 PB of memory (or more CPUs than the host has) is not
    trusted: no run could hold that. It is named, and a run that needs the host's CPUs claims at once."""
    from minitrain.hosts import hostinfo

    ledger = Ledger(local_ledger, host="localhost")
    petabyte = _plant(ledger, "claim-petabyte.json", _content(memory_bytes=2**50, gpus=[]), uid=os.geteuid())
    cpus = _plant(ledger, "claim-cpus.json", _content(cpus=float(os.cpu_count() + 1), gpus=[]), uid=os.geteuid())
    try:
        problems = ledger.snapshot(Totals((), float(hostinfo.cpu_count()), hostinfo.memory_bytes())).problems
        assert [p.split(" (owned by ")[0].rsplit("/", 1)[-1] for p in problems] == ["claim-cpus.json",
                                                                                     "claim-petabyte.json"]
        assert f"claims {os.cpu_count() + 1} CPUs, more than the host's {os.cpu_count()}: refused" in problems[0]
        assert "claims 1048576.0 GiB of memory, more than the host's " in problems[1]
        with reserve(LOCAL, _whole_host(), "mine", timeout_s=0) as mine:
            assert mine.claims["localhost"].run == "mine"
    finally:
        os.close(petabyte)
        os.close(cpus)


def test_a_run_that_needs_none_of_a_resource_is_never_blocked_by_claims_on_it():
    """Trusted claims may still add up to more than the host has (each fits alone): only what a run asks for
    can hold it back."""
    whole_memory = Claim("x", "u", 0, 1, 0.0, (), 0.0, FOUR_GPUS.memory_bytes)
    snapshot = Snapshot("h", FOUR_GPUS, (whole_memory, whole_memory))
    assert snapshot.free_memory() < 0
    assert room(snapshot, Need(2, cpus=1.0), 2) == 2 and room(snapshot, Need(2, gpus=1.0), 2) == 2
    assert room(snapshot, Need(2, memory_bytes=1), 2) == 0
    all_cpus = Claim("x", "u", 0, 1, 0.0, (), FOUR_GPUS.cpus, 0)
    assert room(Snapshot("h", FOUR_GPUS, (all_cpus, all_cpus)), Need(2, memory_bytes=2**30), 2) == 2


def test_a_valid_claim_of_this_user_counts(tmp_path):
    ledger = _ledger(tmp_path)
    fd = _plant(ledger, "claim-planted.json", _content(), uid=os.geteuid())
    try:
        assert ledger.snapshot(FOUR_GPUS).free_gpus() == [2, 3]
    finally:
        os.close(fd)


def test_a_symbolic_link_among_the_claims_is_refused_or_removed(tmp_path):
    ledger = _ledger(tmp_path)
    _ledger(tmp_path).snapshot(FOUR_GPUS)  # creates the directory
    target = tmp_path / "elsewhere.json"
    target.write_text(_content())
    os.symlink(target, os.path.join(ledger.directory, "claim-link.json"))
    os.lchown(os.path.join(ledger.directory, "claim-link.json"), 4242, -1)
    snapshot = ledger.snapshot(FOUR_GPUS)
    assert snapshot.claims == () and "symbolic link" in snapshot.problems[0]
    os.lchown(os.path.join(ledger.directory, "claim-link.json"), os.geteuid(), -1)
    assert ledger.snapshot(FOUR_GPUS).problems == ()  # our own link: removed
    assert "claim-link.json" not in os.listdir(ledger.directory)
    assert target.exists()


def test_a_ledger_directory_that_is_a_link_or_not_shared_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    os.symlink(real, tmp_path / "ledger")
    with pytest.raises(LedgerError, match="symbolic link"):
        _ledger(tmp_path).snapshot(FOUR_GPUS)
    os.unlink(tmp_path / "ledger")
    (tmp_path / "ledger").mkdir(mode=0o755)
    os.chmod(tmp_path / "ledger", 0o755)
    _ledger(tmp_path).snapshot(FOUR_GPUS)  # ours: repaired
    assert os.stat(tmp_path / "ledger").st_mode & 0o7777 == 0o1777
    if os.geteuid() == 0:
        os.chmod(tmp_path / "ledger", 0o755)
        os.chown(tmp_path / "ledger", 4242, -1)
        with pytest.raises(LedgerError, match="chmod 1777"):
            Ledger(str(tmp_path / "ledger")).snapshot(FOUR_GPUS)


@pytest.mark.parametrize("make, what", [
    (lambda path: os.mkdir(path), "is a directory"),
    (lambda path: os.symlink("/nonexistent", path), "is a symbolic link"),
    (lambda path: os.mkfifo(path), "is not a regular file"),
    (lambda path: os.link(os.path.join(os.path.dirname(path), "claim-x.json"), path), "has 2 names (hard links)"),
])
def test_a_lock_file_made_in_advance_as_anything_but_a_file_is_the_ledgers_error(tmp_path, make, what):
    """Another user can make .lock first in the shared directory: whatever it makes, a claim fails with the
    ledger's error naming the path and the fix (never a raw OSError, never a hang on a FIFO)."""
    ledger = _ledger(tmp_path)
    ledger.snapshot(FOUR_GPUS)
    (tmp_path / "ledger" / "claim-x.json").write_text("{}")  # a file of the directory to hard-link to
    lock = os.path.join(ledger.directory, ledger_mod.LOCK_NAME)
    make(lock)
    with pytest.raises(LedgerError) as refused:
        _claim_gpus(ledger, 1)
    assert str(refused.value).startswith(f"the resource ledger's lock file {lock} (owned by ")
    assert what in str(refused.value) and f"(rm -r {lock}); the next run makes a new one" in str(refused.value)
    if os.geteuid() == 0:  # another user's: only its owner or root can remove it from the sticky directory
        os.lchown(lock, 4242, -1)
        with pytest.raises(LedgerError, match=r"\(owned by uid 4242\) .* its owner \(uid 4242\) or root must remove"):
            _claim_gpus(ledger, 1)


def _hold_lock(ledger: Ledger) -> int:
    """The ledger's lock, held on an open file description of this test's own: flock treats it as another
    process's lock."""
    fd = os.open(os.path.join(ledger.directory, ledger_mod.LOCK_NAME), os.O_RDONLY | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def test_a_held_lock_makes_a_claim_give_up_in_time_naming_its_holder(tmp_path):
    ledger = _ledger(tmp_path)
    ledger.snapshot(FOUR_GPUS)
    held = _hold_lock(ledger)
    need = Need(1, gpus=1.0)
    try:
        started = time.monotonic()
        with pytest.raises(ledger_mod.LedgerBusyError) as busy:
            ledger.claim(FOUR_GPUS, "r", lambda snap: need.claim_for(1, snap), lock_wait_s=0.2)
        assert 0.2 <= time.monotonic() - started < 2.0
    finally:
        os.close(held)
    lock = os.path.join(ledger.directory, ledger_mod.LOCK_NAME)
    assert str(busy.value) == (f"pid {os.getpid()} ({pwd.getpwuid(os.geteuid()).pw_name}), which holds the "
                               f"ledger's lock {lock} on gpu1 longer than any claim takes (no run can claim there "
                               f"until it lets go)")
    assert ledger.snapshot(FOUR_GPUS).claims == ()  # nothing was held
    assert _claim_gpus(ledger, 1) is not None  # let go: the next claim gets it


def test_a_lock_file_replaced_while_a_claim_waits_is_taken_again(tmp_path):
    """In the sticky directory the owner of .lock may remove it and make another: the lock on the file no
    longer named .lock excludes nobody, so a claim that got it takes the one under the name instead."""
    ledger = _ledger(tmp_path)
    ledger.snapshot(FOUR_GPUS)
    lock = os.path.join(ledger.directory, ledger_mod.LOCK_NAME)
    old = _hold_lock(ledger)
    outcome = {}

    def claim():
        try:
            outcome["held"] = Ledger(ledger.directory, host="gpu1").claim(
                FOUR_GPUS, "r", lambda snap: Need(1, gpus=1.0).claim_for(1, snap), lock_wait_s=1.0)
        except Exception as exc:  # noqa: BLE001 - judged below
            outcome["error"] = exc

    def opened_by_the_claim() -> bool:
        return sum(os.path.realpath(f"/proc/self/fd/{fd}") == lock for fd in os.listdir("/proc/self/fd")) >= 2

    claimer = threading.Thread(target=claim)
    new = None
    try:
        claimer.start()
        deadline = time.monotonic() + 10
        while not opened_by_the_claim():
            assert time.monotonic() < deadline, "the claim never opened the lock file"
            time.sleep(0.005)
        os.unlink(lock)  # replaced: a new .lock, held, while the claim waits on the old one
        new = _hold_lock(ledger)
        os.close(old)
        old = None
        claimer.join(timeout=10)
    finally:
        for fd in (old, new):
            if fd is not None:
                os.close(fd)
        claimer.join(timeout=10)
    if "held" in outcome:  # taken under the replaced file's lock while another held the new one's
        outcome["held"].release()
    assert isinstance(outcome.get("error"), ledger_mod.LedgerBusyError), outcome


def test_a_claim_is_atomic_between_threads(tmp_path):
    """Many claimers for 4 GPUs at once: each GPU is held by one claim only."""
    ledger = _ledger(tmp_path)
    held, barrier = [], threading.Barrier(12)

    def claimer():
        barrier.wait()
        got = _claim_gpus(Ledger(ledger.directory), 1)
        if got is not None:
            held.append(got)

    threads = [threading.Thread(target=claimer) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(g for h in held for g in h.claim.gpus) == [0, 1, 2, 3]
    for h in held:
        h.release()


# ---------------------------------------------------------------------------------- demand and plan

def test_gpus_for_follows_rank_placement():
    assert Need(4, gpus=0.5).gpus_for(4) == 2 and Need(3, gpus=0.5).gpus_for(3) == 2
    assert Need(2, gpus=2.0).gpus_for(2) == 4 and Need(1, gpus=1.0).gpus_for(3) == 3
    assert not Need(2).claims and Need(2, cpus=1.0).claims


def test_room_counts_free_gpus_cpus_and_memory():
    snapshot = Snapshot("h", FOUR_GPUS, (Claim("x", "u", 0, 1, 0.0, (0,), 2.0, 0),))
    assert room(snapshot, Need(8, gpus=1.0), 8) == 3
    assert room(snapshot, Need(8, cpus=2.0), 8) == 3
    assert room(snapshot, Need(8, gpus=1.0), 8, idle=True) == 4
    assert room(snapshot, Need(8, memory_bytes=16 * 2**30), 8) == 4


@pytest.mark.parametrize("strategy, rooms, expected", [
    ("PACK", [("a", 2), ("b", 4)], {"a": 2, "b": 2}),
    ("STRICT_PACK", [("a", 2), ("b", 4)], {"b": 4}),
    ("SPREAD", [("a", 2), ("b", 4)], {"a": 2, "b": 2}),
    ("SPREAD", [("a", 1), ("b", 4)], {"a": 1, "b": 3}),
    ("STRICT_SPREAD", [("a", 2), ("b", 4)], None),
    ("PACK", [("a", 1), ("b", 2)], None),
])
def test_plan_places_by_strategy(strategy, rooms, expected):
    assert plan(rooms, Need(4, gpus=1.0, strategy=strategy)) == expected


def test_the_waiting_text_names_what_and_who():
    claim = Claim("big-run", "alice", 1000, 4242, 0.0, (0, 1), 0.0, 0)
    text = waiting_text(Need(2, gpus=1.0), [Snapshot("gpu1", FOUR_GPUS, (claim,))], since=0.0)
    assert text.startswith("waiting for 2 GPUs on gpu1 since ")
    assert "held by run big-run (alice, pid 4242, since " in text and "2 GPUs (0,1)" in text


def test_a_gpu_busy_outside_minitrain_is_reported_and_optionally_taken():
    totals = Totals((Gpu(0, busy_pids=(77,)), Gpu(1)), 8.0, 2**30)
    assert Snapshot("h", totals).free_gpus() == [0, 1]
    assert Snapshot("h", totals, foreign_taken=True).free_gpus() == [1]
    assert "GPU 0 busy with pid 77 outside minitrain" in waiting_text(Need(2, gpus=1.0), [Snapshot("h", totals)], 0.0)


# ---------------------------------------------------------------------------------- reserve (this machine)

@pytest.fixture
def local_ledger(tmp_path, monkeypatch):
    monkeypatch.setenv("MINITRAIN_LEDGER_DIR", str(tmp_path / "ledger"))
    return str(tmp_path / "ledger")


LOCAL = ClusterConfig(hosts=(HostSpec("localhost"),))


def _whole_host() -> Need:
    from minitrain.hosts import hostinfo
    return Need(1, cpus=float(hostinfo.cpu_count()))


def test_a_run_that_claims_nothing_touches_no_ledger(local_ledger):
    reservation = reserve(LOCAL, Need(2), "r")
    assert reservation.cluster is LOCAL and not os.path.exists(local_ledger)


def test_a_run_that_can_never_fit_fails_at_once_with_the_table(local_ledger):
    with pytest.raises(ConfigError, match=r"(?s)cannot hold even when no other run.*host +gpus +cpus"):
        reserve(LOCAL, Need(1, gpus=1.0), "r", timeout_s=None)


def test_busy_hosts_fail_at_once_with_zero_timeout_naming_the_holder(local_ledger):
    with reserve(LOCAL, _whole_host(), "holder") as first:
        assert first.cluster.hosts[0].slots == 1 and first.claims["localhost"].cpus
        with pytest.raises(ResourcesBusyError, match=r"waiting for .* CPUs on localhost .*held by run holder"):
            reserve(LOCAL, _whole_host(), "second", timeout_s=0)


def test_a_waiting_run_gets_the_host_when_the_holder_releases(local_ledger):
    first = reserve(LOCAL, _whole_host(), "holder")
    told = []

    def on_wait(text):
        told.append(text)
        first.release()  # the holder's run ends while the second waits

    with reserve(LOCAL, _whole_host(), "second", on_wait=on_wait, poll_s=0.01) as second:
        assert second.claims["localhost"].run == "second"
    assert len(told) == 1 and "held by run holder" in told[0]


def test_an_elastic_run_takes_what_fits_now_down_to_its_minimum(local_ledger):
    from minitrain.hosts import hostinfo
    cpus = hostinfo.cpu_count()
    half = max(cpus // 2, 1)
    if cpus < 2:
        pytest.skip("needs 2 CPUs to hold half of them")
    elastic_cpus = Need(cpus, cpus=1.0, min_workers=1)  # 1..cpus workers of one CPU each
    with reserve(LOCAL, Need(1, cpus=float(half)), "holder"):
        with reserve(LOCAL, elastic_cpus, "elastic", timeout_s=0) as elastic:
            assert elastic.cluster.hosts[0].slots == cpus - half == elastic.claims["localhost"].cpus
    with reserve(LOCAL, elastic_cpus, "elastic") as alone:  # nobody else: its maximum
        assert alone.cluster.hosts[0].slots == cpus
    with reserve(LOCAL, _whole_host(), "holder"):  # not even its minimum fits: it waits, saying so
        with pytest.raises(ResourcesBusyError, match=r"waiting for 1 CPUs \(at least 1 workers\)"):
            reserve(LOCAL, elastic_cpus, "elastic", timeout_s=0)


def test_an_elastic_scaling_config_is_a_need_of_max_workers_min_enough():
    from minitrain import ScalingConfig
    need = Need.of(ScalingConfig(num_workers=(1, 3), resources_per_worker={"CPU": 1}))
    assert (need.workers, need.fewest, list(need.sizes())) == (3, 1, [3, 2, 1])
    fixed = Need.of(ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}))
    assert (fixed.workers, fixed.min_workers, list(fixed.sizes())) == (2, None, [2])


# ---------------------------------------------------------------------------------- GPUs as agents get them

class _FakeNvml:
    """pynvml's calls host_gpus makes, over a list of (uuid, busy pids): a named fake of the NVML library."""

    def __init__(self, gpus):
        self.gpus = gpus

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetUUID(self, handle):
        return self.gpus[handle][0]

    def nvmlDeviceGetName(self, handle):
        return b"Fake GPU"

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return [type("P", (), {"pid": pid})() for pid in self.gpus[handle][1]]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle):
        return []


@pytest.mark.parametrize("environ, entries", [
    ({}, ["0", "1", "2"]),
    ({"CUDA_VISIBLE_DEVICES": "2,0"}, ["2", "0"]),
    ({"CUDA_VISIBLE_DEVICES": "GPU-c,GPU-a"}, ["GPU-c", "GPU-a"]),
    ({"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}, ["GPU-a", "GPU-b", "GPU-c"]),
])
def test_host_gpus_name_gpus_as_the_host_does(monkeypatch, environ, entries):
    from minitrain.hosts import gpus

    monkeypatch.setitem(__import__("sys").modules, "pynvml", _FakeNvml([("GPU-a", ()), ("GPU-b", (9,)), ("GPU-c", ())]))
    found = gpus.host_gpus(environ)
    assert [g.visible_entry for g in found] == entries
    assert {g.index: g.busy_pids for g in found}.get(1, ()) in ((9,), ())


def test_host_gpus_without_nvml_follow_cuda_visible_devices(monkeypatch):
    from minitrain.hosts import gpus

    monkeypatch.setitem(__import__("sys").modules, "pynvml", None)  # import fails: no NVML
    assert [g.visible_entry for g in gpus.host_gpus({"CUDA_VISIBLE_DEVICES": "3,5"})] == ["3", "5"]
    assert [g.visible_entry for g in gpus.host_gpus({"CUDA_VISIBLE_DEVICES": "GPU-x,GPU-y"})] == ["GPU-x", "GPU-y"]


def test_reserved_gpus_reach_the_agents_as_the_host_names_them(local_ledger, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "pynvml", _FakeNvml([("GPU-a", ()), ("GPU-b", (9,)), ("GPU-c", ())]))
    with reserve(LOCAL, Need(2, gpus=1.0), "two") as two:
        assert two.agent_env == {"localhost": {"CUDA_VISIBLE_DEVICES": "0,1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}}
        assert two.cluster.hosts == (HostSpec("localhost", 2, local=True),)
        with reserve(LOCAL, Need(1, gpus=1.0), "one") as one:
            assert one.agent_env["localhost"]["CUDA_VISIBLE_DEVICES"] == "2"
            with pytest.raises(ResourcesBusyError) as busy:
                reserve(LOCAL, Need(1, gpus=1.0), "three", timeout_s=0)
            assert "run one (" in str(busy.value) and "run two (" in str(busy.value)
    monkeypatch.setenv("MINITRAIN_LEDGER_FOREIGN_GPUS", "taken")  # GPU 1 computes for pid 9, outside minitrain
    with reserve(LOCAL, Need(2, gpus=1.0), "two") as two:
        assert two.agent_env["localhost"]["CUDA_VISIBLE_DEVICES"] == "0,2"
        with pytest.raises(ResourcesBusyError, match=r"GPU 1 busy with pid 9 outside minitrain \(taken\)"):
            reserve(LOCAL, Need(1, gpus=1.0), "three", timeout_s=0)


def test_another_users_names_reach_the_terminal_without_control_characters():
    claim = Claim.from_json(_content(run="evil\x1b[2J\nrun", user="bob\r"))
    assert claim.run == "evil?[2J?run" and claim.user == "bob?"



def test_with_the_ledger_off_a_run_claims_nothing(local_ledger, monkeypatch):
    monkeypatch.setenv("MINITRAIN_LEDGER_DIR", "off")
    reservation = reserve(LOCAL, _whole_host(), "r", timeout_s=0)
    assert reservation.cluster is LOCAL and reservation.claims == {} and not os.path.exists(local_ledger)
    monkeypatch.setenv("MINITRAIN_LEDGER_DIR", "relative/dir")
    with pytest.raises(ConfigError, match="MINITRAIN_LEDGER_DIR='relative/dir': must be an absolute path"):
        reserve(LOCAL, _whole_host(), "r")


def test_inside_a_slurm_allocation_a_run_claims_nothing(local_ledger):
    """Slurm owns an allocation's nodes and renumbers each job's GPUs from 0: a shared ledger would make two
    jobs on one node wait for each other's "GPU 0"."""
    slurm = ClusterConfig(hosts=(HostSpec("localhost"),), launcher="srun", slurm_job_id="42")
    reservation = reserve(slurm, _whole_host(), "r", timeout_s=0)
    assert reservation.cluster is slurm and reservation.claims == {} and not os.path.exists(local_ledger)


def test_the_remote_holder_answers_one_line_per_request_and_releases_at_the_end(local_ledger, monkeypatch):
    """minitrain.hosts.hold.serve, as the driver speaks to it over ssh (here over in-memory streams)."""
    import io

    from minitrain.hosts.hold import serve, snapshot_from_dict

    need = {"workers": 1, "gpus": 0.0, "cpus": 1.0, "memory_bytes": 0, "strategy": "PACK"}
    requests = [{"op": "snapshot"}, {"op": "claim", "workers": 1, "need": need, "run": "remote-run"},
                {"op": "snapshot"}, {"op": "bogus"}]
    out = io.StringIO()
    assert serve("gpu9", io.StringIO("".join(json.dumps(r) + "\n" for r in requests)), out) == 0
    answers = [json.loads(line) for line in out.getvalue().splitlines()]
    assert answers[0] == {"ready": True}
    assert snapshot_from_dict(answers[1]["snapshot"]).claims == ()
    assert answers[2]["claim"]["run"] == "remote-run" and answers[2]["claim"]["cpus"] == 1.0
    (claim,) = snapshot_from_dict(answers[3]["snapshot"]).claims
    assert claim.run == "remote-run" and snapshot_from_dict(answers[3]["snapshot"]).host == "gpu9"
    assert answers[4] == {"error": "unknown request 'bogus'"}
    assert os.listdir(local_ledger) == [ledger_mod.LOCK_NAME]  # stdin ended: the claim went with it
    monkeypatch.setenv("MINITRAIN_LEDGER_DIR", "off")
    out = io.StringIO()
    assert serve("gpu9", io.StringIO(""), out) == 1
    assert "host gpu9 has MINITRAIN_LEDGER_DIR=off" in json.loads(out.getvalue())["error"]


def test_the_remote_holder_answers_busy_when_its_ledgers_lock_stays_held(local_ledger):
    """A remote host's ledger lock held by another process: its holder answers {"busy": who} within the wait the
    driver asked for, so the driver's wait goes on (and its limit holds) instead of hanging on ssh."""
    import io

    from minitrain.hosts.hold import serve

    ledger = Ledger(local_ledger, host="gpu9")
    ledger.snapshot(FOUR_GPUS)
    held = _hold_lock(ledger)
    need = {"workers": 1, "gpus": 0.0, "cpus": 1.0, "memory_bytes": 0, "strategy": "PACK"}
    request = {"op": "claim", "workers": 1, "need": need, "run": "remote-run", "lock_wait_s": 0.05}
    out = io.StringIO()
    answered = threading.Thread(target=serve, args=("gpu9", io.StringIO(json.dumps(request) + "\n"), out))
    try:
        answered.start()
        answered.join(timeout=10)
        assert not answered.is_alive(), "the holder hung on the ledger's lock"
    finally:
        os.close(held)  # a holder stuck on the lock gets it now, and ends
        answered.join(timeout=10)
    answers = [json.loads(line) for line in out.getvalue().splitlines()]
    assert answers[1] == {"busy": f"pid {os.getpid()} ({pwd.getpwuid(os.geteuid()).pw_name}), which holds the "
                                  f"ledger's lock {local_ledger}/.lock on gpu9 longer than any claim takes (no run "
                                  f"can claim there until it lets go)"}


def test_an_agent_is_started_with_its_hosts_claimed_gpus():
    import shlex

    from minitrain.hosts.launcher import ClusterLauncher

    cluster = ClusterConfig(hosts=(HostSpec("gpu1", 2), HostSpec("localhost", 1)))
    env = {"gpu1": {"CUDA_VISIBLE_DEVICES": "4,5", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}}
    argv = ClusterLauncher(cluster, agent_env=env)._argv(cluster.hosts[0], "10.0.0.1:5000", "run")
    remote = shlex.split(argv[-1])
    assert "CUDA_VISIBLE_DEVICES=4,5" in remote and "CUDA_DEVICE_ORDER=PCI_BUS_ID" in remote
    assert remote.index("CUDA_VISIBLE_DEVICES=4,5") < remote.index("minitrain.agent")
