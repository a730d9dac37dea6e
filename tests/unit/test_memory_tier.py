"""MemoryTier (minitrain.storage.memory_tier): a node's checkpoint shards in host memory.

What each contract promises, tried the hard way: the ledger never lets the tier's bytes exceed its
capacity (also when two writers reserve at once: flock(2) locks belong to an open file, so two opens
of the ledger in one process contend exactly as two processes' do; the race is played by two threads,
its interleaving forced, and tests/unit stays free of processes); a full tier writes and reserves
nothing; a shard is complete or absent, also after a copy that fails midway; `move` renames on the
tier's filesystem and copies across; a view is hard links merged in order, made once; `drop`,
`shards`, `default_capacity`, `create` (0700, its lock held, a dead owner's tier swept, a live one's
never) and `destroy`; a corrupt ledger is forgotten, not fatal.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import stat
import tempfile
import threading
import types

import pytest

from minitrain.storage import memory_tier
from minitrain.storage.memory_tier import PREFIX, MemoryTier, TierFull, default_capacity, tree_bytes


def make_dir(path, files: dict) -> str:
    """Make directory `path` holding `files` (relative path -> bytes); returns it as a str."""
    for name, data in files.items():
        target = os.path.join(path, name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as f:
            f.write(data)
    os.makedirs(path, exist_ok=True)
    return str(path)


def read(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def leftovers(tier: MemoryTier) -> list[str]:
    """Every `.incoming-*` entry anywhere in the tier (a half-made shard or view)."""
    return [os.path.join(root, name) for root, dirs, files in os.walk(tier.root)
            for name in dirs + files if name.startswith(".incoming-")]


@pytest.fixture
def tier(tmp_path):
    """A fresh tier of 1000 bytes in its own base directory under tmp_path (the sources go beside it)."""
    (tmp_path / "base").mkdir()
    made = MemoryTier.create(1000, base=str(tmp_path / "base"))
    yield made
    made.destroy()


# ---------------------------------------------------------------------------------------------- capacity


def test_reservations_never_exceed_the_capacity_and_a_key_reserved_again_is_replaced(tmp_path):
    tier = MemoryTier(make_dir(tmp_path / "t", {".ledger": b"{}"}), capacity=100)
    assert tier.reserve("a", 60)
    assert not tier.reserve("b", 41)  # 101 > 100: refused, nothing reserved
    assert tier.used_bytes() == 60
    assert tier.reserve("b", 40)  # exactly the capacity
    assert tier.used_bytes() == 100
    assert tier.reserve("a", 10)  # replaced, not added: 10 + 40
    assert tier.used_bytes() == 50
    tier.release("a")
    tier.release("a")  # nothing to forget: no error
    assert tier.used_bytes() == 40


def test_two_writers_reserving_at_once_never_take_the_tier_past_its_capacity(tmp_path, monkeypatch):
    """Writer A reads the ledger; before it writes back, writer B tries to reserve. B must wait for A's
    flock (then see A's bytes and be refused): without the lock both would read an empty ledger and both
    60-byte reservations would be granted in a 100-byte tier. The interleaving is forced: A pauses after
    its read until B has reached its own flock (or, were there none, has finished)."""
    tier = MemoryTier(make_dir(tmp_path / "t", {".ledger": b"{}"}), capacity=100)
    results: dict[str, bool] = {}
    progressed = threading.Event()  # B is about to block on the ledger's lock, or is done
    paused: list[bool] = []

    def writer_b():
        results["b"] = tier.reserve("b", 60)
        progressed.set()

    b = threading.Thread(target=writer_b, name="writer-b", daemon=True)

    def flock(fd, operation):
        if threading.current_thread() is b:
            progressed.set()  # the lock is A's until A's with-block ends: B blocks right here
        return fcntl.flock(fd, operation)

    def loads(data):
        if threading.current_thread() is threading.main_thread() and not paused:
            paused.append(True)  # A has read the ledger and holds its lock: let B race it now
            b.start()
            assert progressed.wait(5.0), "writer B neither reached the ledger's lock nor finished"
        return json.loads(data)

    monkeypatch.setattr(memory_tier, "fcntl", types.SimpleNamespace(flock=flock, LOCK_EX=fcntl.LOCK_EX))
    monkeypatch.setattr(memory_tier, "json", types.SimpleNamespace(loads=loads, dumps=json.dumps))
    results["a"] = tier.reserve("a", 60)
    b.join(5.0)
    assert not b.is_alive()
    assert results == {"a": True, "b": False}
    assert json.loads(read(os.path.join(tier.root, ".ledger"))) == {"a": 60}


def test_a_full_tier_refuses_a_shard_before_writing_or_reserving_anything(tmp_path, tier):
    source = make_dir(tmp_path / "src", {"model": b"x" * 600})
    tier.write_shard(0, 0, "ckpt", source)
    before = sorted(os.listdir(tier.root)), read(os.path.join(tier.root, ".ledger"))
    big = make_dir(tmp_path / "big", {"model": b"y" * 401})  # 600 + 401 > 1000
    with pytest.raises(TierFull, match=rf"the memory tier {tier.root} holds 600 of 1000 bytes"):
        tier.write_shard(0, 1, "ckpt", big)
    assert (sorted(os.listdir(tier.root)), read(os.path.join(tier.root, ".ledger"))) == before
    assert not os.path.exists(os.path.join(tier.root, "attempt_0", "rank_1"))
    assert tier.used_bytes() == 600
    assert tier.shards() == [(0, 0, "ckpt")]
    assert os.path.exists(big + "/model")  # the caller's files are untouched: they go to storage instead


def test_a_shard_holds_its_bytes_in_the_ledger_until_it_is_dropped(tmp_path, tier):
    tier.write_shard(0, 0, "ckpt", make_dir(tmp_path / "a", {"m": b"1" * 300, "sub/n": b"2" * 100}))
    tier.write_shard(0, 1, "ckpt", make_dir(tmp_path / "b", {"m": b"3" * 500}))
    assert tier.used_bytes() == 900
    tier.drop([(0, 0, "ckpt")])
    assert tier.used_bytes() == 500
    tier.write_shard(1, 0, "ckpt2", make_dir(tmp_path / "c", {"m": b"4" * 500}))  # the freed room is usable
    assert tier.used_bytes() == 1000


def test_a_failed_rewrite_of_a_shard_keeps_the_bytes_of_the_shard_that_is_still_there(tmp_path):
    """A rank restarted in the same attempt writes its shard again (the old one is replaced only once the
    new one is complete). When that rewrite fails, the old shard is still in the tier, so its bytes must
    still count: else the next shard is let in past the capacity."""
    tier = MemoryTier.create(150, base=str(tmp_path))
    try:
        tier.write_shard(0, 0, "ckpt", make_dir(tmp_path / "a", {"m": b"1" * 100}))
        broken = make_dir(tmp_path / "broken", {"m": b"2" * 10})
        os.mkfifo(os.path.join(broken, "pipe"))  # copyfile refuses a named pipe: the copy fails midway
        with pytest.raises(shutil.Error):
            tier.write_shard(0, 0, "ckpt", broken)
        assert read(tier.shard_path(0, 0, "ckpt") + "/m") == b"1" * 100  # the old shard stands
        assert tier.used_bytes() == 100
        with pytest.raises(TierFull):
            tier.write_shard(0, 1, "ckpt", make_dir(tmp_path / "b", {"m": b"3" * 100}))  # 200 > 150
    finally:
        tier.destroy()


# ---------------------------------------------------------------------------------------------- shards


def test_a_shard_is_a_copy_of_its_source_and_the_source_stays(tmp_path, tier):
    source = make_dir(tmp_path / "src", {"model": b"weights", "opt/state": b"adam"})
    path = tier.write_shard(2, 3, "checkpoint_000001", source)
    assert path == os.path.join(tier.root, "attempt_2", "rank_3", "checkpoint_000001") == \
        tier.shard_path(2, 3, "checkpoint_000001")
    assert read(path + "/model") == b"weights" and read(path + "/opt/state") == b"adam"
    assert read(source + "/model") == b"weights"
    assert os.stat(path + "/model").st_ino != os.stat(source + "/model").st_ino
    assert tier.has_shard(2, 3, "checkpoint_000001") and not tier.has_shard(2, 2, "checkpoint_000001")
    assert tier.used_bytes() == len(b"weights") + len(b"adam")
    assert leftovers(tier) == []


def test_links_in_the_source_are_followed_as_an_upload_follows_them(tmp_path, tier):
    outside = make_dir(tmp_path / "outside", {"target": b"the real bytes"})
    source = make_dir(tmp_path / "src", {"plain": b"p"})
    os.symlink(os.path.join(outside, "target"), os.path.join(source, "linked"))
    path = tier.write_shard(0, 0, "ckpt", source)
    assert not os.path.islink(path + "/linked") and read(path + "/linked") == b"the real bytes"
    assert tier.used_bytes() == len(b"p") + len(b"the real bytes")


def test_a_moved_source_s_links_are_followed_too(tmp_path):
    """`move` gives the directory up, not the files its links point to: the shard must hold the bytes
    (the module's contract: links are followed), or it breaks when the target goes."""
    tier = MemoryTier.create(1000, base=str(tmp_path))
    try:
        outside = make_dir(tmp_path / "outside", {"target": b"the real bytes"})
        source = make_dir(tmp_path / "src", {"plain": b"p"})
        os.symlink(os.path.join(outside, "target"), os.path.join(source, "linked"))
        path = tier.write_shard(0, 0, "ckpt", source, move=True)
        os.unlink(os.path.join(outside, "target"))  # the user cleans up what the link pointed to
        assert not os.path.islink(path + "/linked")
        assert read(path + "/linked") == b"the real bytes"
    finally:
        tier.destroy()


def test_move_renames_the_files_on_the_tier_s_filesystem(tmp_path, tier):
    source = make_dir(tmp_path / "src", {"model": b"weights", "opt/state": b"adam"})
    inodes = {name: os.stat(os.path.join(source, name)).st_ino for name in ("model", "opt/state")}
    path = tier.write_shard(0, 0, "ckpt", source, move=True)
    assert {name: os.stat(os.path.join(path, name)).st_ino for name in inodes} == inodes  # no byte copied
    assert not os.path.exists(source + "/model") and not os.path.exists(source + "/opt/state")
    assert read(path + "/model") == b"weights"
    assert tier.used_bytes() == len(b"weights") + len(b"adam")


def test_move_copies_from_another_filesystem(tier):
    other = "/dev/shm"
    if not os.path.isdir(other) or not os.access(other, os.W_OK) or \
            os.stat(other).st_dev == os.stat(tier.root).st_dev:
        pytest.skip(f"no writable filesystem other than the tier's ({other}) to put the source on")
    source = tempfile.mkdtemp(prefix="minitrain-test-source-", dir=other)
    try:
        make_dir(source, {"model": b"weights"})
        path = tier.write_shard(0, 0, "ckpt", source, move=True)
        assert read(path + "/model") == b"weights"
        assert os.stat(path + "/model").st_dev == os.stat(tier.root).st_dev  # the bytes are in the tier
        assert tier.has_shard(0, 0, "ckpt") and leftovers(tier) == []
        assert tier.used_bytes() == len(b"weights")
    finally:
        shutil.rmtree(source, ignore_errors=True)


def _assert_nothing_left(tier: MemoryTier) -> None:
    assert not tier.has_shard(0, 0, "ckpt")
    assert tier.shards() == []
    assert leftovers(tier) == []
    assert tier.used_bytes() == 0
    assert json.loads(read(os.path.join(tier.root, ".ledger"))) == {}


def test_a_copy_that_fails_midway_leaves_no_shard_and_no_reservation(tmp_path, tier):
    """Every other file is copied before copytree reports the named pipe it cannot copy: the half-made
    shard is removed and its bytes released."""
    source = make_dir(tmp_path / "src", {"a": b"1" * 100, "sub/b": b"2" * 100, "z": b"3" * 100})
    os.mkfifo(os.path.join(source, "sub", "pipe"))
    with pytest.raises(shutil.Error):
        tier.write_shard(0, 0, "ckpt", source)
    _assert_nothing_left(tier)


def test_a_dangling_link_fails_the_copy_and_leaves_nothing(tmp_path, tier):
    source = make_dir(tmp_path / "src", {"a": b"1" * 100})
    os.symlink(str(tmp_path / "gone"), os.path.join(source, "dangling"))
    with pytest.raises(shutil.Error):
        tier.write_shard(0, 0, "ckpt", source)
    _assert_nothing_left(tier)


def test_a_source_that_vanished_leaves_nothing(tmp_path, tier):
    with pytest.raises(FileNotFoundError):
        tier.write_shard(0, 0, "ckpt", str(tmp_path / "gone"))
    _assert_nothing_left(tier)
    with pytest.raises(FileNotFoundError):
        tier.write_shard(0, 0, "ckpt", str(tmp_path / "gone"), move=True)
    _assert_nothing_left(tier)


def test_a_rewritten_shard_replaces_the_old_one_whole(tmp_path, tier):
    tier.write_shard(0, 0, "ckpt", make_dir(tmp_path / "a", {"old_only": b"o" * 300, "m": b"1"}))
    path = tier.write_shard(0, 0, "ckpt", make_dir(tmp_path / "b", {"m": b"2" * 50}))
    assert sorted(os.listdir(path)) == ["m"] and read(path + "/m") == b"2" * 50
    assert tier.used_bytes() == 50
    assert tier.shards() == [(0, 0, "ckpt")] and leftovers(tier) == []


def test_shards_lists_complete_shards_only(tmp_path, tier):
    tier.write_shard(1, 0, "ckpt_b", make_dir(tmp_path / "a", {"m": b"1"}))
    tier.write_shard(0, 1, "ckpt_a", make_dir(tmp_path / "b", {"m": b"1"}))
    tier.write_shard(0, 0, "ckpt_a", make_dir(tmp_path / "c", {"m": b"1"}))
    os.makedirs(os.path.join(tier.root, "attempt_0", "rank_2", ".incoming-deadbeef"))  # a copy under way
    os.makedirs(os.path.join(tier.root, "attempt_x", "rank_0", "ckpt"))  # not a tier's name
    tier.build_view("ckpt_a", [(0, 0), (0, 1)])  # views are not shards
    assert tier.shards() == [(0, 0, "ckpt_a"), (0, 1, "ckpt_a"), (1, 0, "ckpt_b")]


def test_drop_removes_the_shards_their_views_and_their_reservations(tmp_path, tier):
    tier.write_shard(0, 0, "ckpt", make_dir(tmp_path / "a", {"m": b"1" * 100}))
    tier.write_shard(0, 1, "ckpt", make_dir(tmp_path / "b", {"n": b"2" * 100}))
    tier.write_shard(0, 0, "other", make_dir(tmp_path / "c", {"m": b"3" * 100}))
    view = tier.build_view("ckpt", [(0, 0), (0, 1)])
    assert os.path.isdir(view)
    tier.drop([(0, 0, "ckpt"), (0, 1, "ckpt"), (5, 5, "never_here")])
    assert not os.path.exists(view)
    assert tier.shards() == [(0, 0, "other")]
    assert tier.used_bytes() == 100
    assert json.loads(read(os.path.join(tier.root, ".ledger"))) == {"attempt_0/rank_0/other": 100}


# ---------------------------------------------------------------------------------------------- views


def test_a_view_merges_the_shards_in_order_by_hard_links(tmp_path, tier):
    r0 = tier.write_shard(0, 0, "ckpt", make_dir(tmp_path / "a", {"model": b"rank0", "only0": b"0",
                                                                   "sub/x": b"0x"}))
    r1 = tier.write_shard(0, 1, "ckpt", make_dir(tmp_path / "b", {"model": b"rank1", "sub/y": b"1y"}))
    used = tier.used_bytes()
    view = tier.build_view("ckpt", [(0, 0), (0, 1)])
    assert view == os.path.join(tier.root, "views", "attempt_0", "ckpt")
    assert read(view + "/model") == b"rank1"  # the later rank's file of the same name wins
    assert os.stat(view + "/model").st_ino == os.stat(r1 + "/model").st_ino
    assert os.stat(view + "/only0").st_ino == os.stat(r0 + "/only0").st_ino
    assert os.stat(view + "/sub/x").st_ino == os.stat(r0 + "/sub/x").st_ino
    assert os.stat(view + "/sub/y").st_ino == os.stat(r1 + "/sub/y").st_ino
    assert sorted(os.listdir(view)) == ["model", "only0", "sub"]
    assert tier.used_bytes() == used  # no bytes copied, none reserved
    assert read(r0 + "/model") == b"rank0"  # the shards are as they were
    assert leftovers(tier) == []


def test_the_order_given_decides_which_file_wins(tmp_path, tier):
    tier.write_shard(0, 0, "ckpt", make_dir(tmp_path / "a", {"model": b"rank0"}))
    tier.write_shard(0, 1, "ckpt", make_dir(tmp_path / "b", {"model": b"rank1"}))
    assert read(tier.build_view("ckpt", [(0, 1), (0, 0)]) + "/model") == b"rank0"


def test_no_view_when_a_shard_is_missing(tmp_path, tier):
    tier.write_shard(0, 0, "ckpt", make_dir(tmp_path / "a", {"m": b"1"}))
    assert tier.build_view("ckpt", [(0, 0), (0, 1)]) is None
    assert tier.build_view("ckpt", []) is None
    assert tier.build_view("absent", [(0, 0)]) is None
    assert not os.path.exists(os.path.join(tier.root, "views", "attempt_0", "ckpt"))
    assert leftovers(tier) == []


def test_a_view_once_made_is_returned_as_it_is(tmp_path, tier):
    """Readers may be in a view: asked again, even after a shard was rewritten, it is the same view
    with the same files, never rebuilt under them."""
    tier.write_shard(0, 0, "ckpt", make_dir(tmp_path / "a", {"m": b"first"}))
    view = tier.build_view("ckpt", [(0, 0)])
    inode = os.stat(view + "/m").st_ino
    tier.write_shard(0, 0, "ckpt", make_dir(tmp_path / "b", {"m": b"second"}))
    assert tier.build_view("ckpt", [(0, 0)]) == view
    assert os.stat(view + "/m").st_ino == inode and read(view + "/m") == b"first"


def test_two_callers_building_one_view_at_once_get_the_same_view(tmp_path, tier, monkeypatch):
    """The second caller finishes its view while the first is still linking: the first's rename then
    finds the view made, keeps it and removes its own half-made copy."""
    tier.write_shard(0, 0, "ckpt", make_dir(tmp_path / "a", {"m": b"0", "n": b"0"}))
    tier.write_shard(0, 1, "ckpt", make_dir(tmp_path / "b", {"m": b"1"}))
    real_link = os.link
    other: list = []

    def link(source, destination, *args, **kwargs):
        if not other:
            other.append(None)
            other[0] = tier.build_view("ckpt", [(0, 0), (0, 1)])  # the other caller, all the way through
        return real_link(source, destination, *args, **kwargs)

    monkeypatch.setattr(os, "link", link)
    first = tier.build_view("ckpt", [(0, 0), (0, 1)])
    monkeypatch.undo()
    assert first == other[0] == os.path.join(tier.root, "views", "attempt_0", "ckpt")
    assert read(first + "/m") == b"1" and read(first + "/n") == b"0"
    assert os.listdir(os.path.dirname(first)) == ["ckpt"] and leftovers(tier) == []


# ---------------------------------------------------------------------------------------------- the tier itself


def test_default_capacity_is_a_quarter_of_memory_but_at_most_half_the_free_space(tmp_path):
    base = str(tmp_path)
    assert default_capacity(base, 1000) == 250  # the free space is far more than 500 bytes
    stats = os.statvfs(base)
    free = stats.f_bavail * stats.f_frsize
    capped = default_capacity(base, 8 * free)  # a quarter of that memory is twice the free space
    assert abs(capped - free // 2) < 64 << 20  # (others may write to this filesystem meanwhile)
    assert capped < 2 * free * 0.9
    assert default_capacity(str(tmp_path / "missing"), 1 << 40) == 0


def test_tree_bytes_counts_regular_files_and_follows_links(tmp_path):
    source = make_dir(tmp_path / "src", {"a": b"1" * 10, "sub/b": b"2" * 5})
    os.symlink(os.path.join(source, "a"), os.path.join(source, "link"))
    assert tree_bytes(source) == 25
    assert tree_bytes(str(tmp_path / "gone")) == 0


def test_a_capacity_below_zero_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match=r"capacity must be >= 0 bytes, got -1"):
        MemoryTier(str(tmp_path), -1)


def test_create_makes_a_private_directory_and_holds_its_lock(tmp_path):
    tier = MemoryTier.create(1000, base=str(tmp_path))
    try:
        assert os.path.dirname(tier.root) == str(tmp_path)
        assert os.path.basename(tier.root).startswith(PREFIX)
        assert stat.S_IMODE(os.stat(tier.root).st_mode) == 0o700
        assert tier.capacity == 1000 and tier.used_bytes() == 0 and tier.shards() == []
        fd = os.open(os.path.join(tier.root, "owner.lock"), os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held by the tier's owner (us)
        finally:
            os.close(fd)
    finally:
        tier.destroy()


def _dead_tier(base, name: str) -> str:
    """A tier left by an agent that died: its files, and an owner.lock nobody holds."""
    path = make_dir(os.path.join(base, PREFIX + name), {"attempt_0/rank_0/ckpt/model": b"x" * 10,
                                                         ".ledger": b'{"attempt_0/rank_0/ckpt": 10}',
                                                         "owner.lock": b""})
    os.chmod(path, 0o700)
    return path


def test_create_sweeps_a_dead_agent_s_tier_and_never_a_live_one_s(tmp_path):
    base = str(tmp_path)
    live = MemoryTier.create(1000, base=base)
    live.write_shard(0, 0, "ckpt", make_dir(tmp_path / "src", {"m": b"1"}))
    dead = _dead_tier(base, "dead")
    no_lock = make_dir(os.path.join(base, PREFIX + "making"), {"m": b"1"})  # being made, or not ours
    other = make_dir(os.path.join(base, "someone-else"), {"owner.lock": b""})
    fresh = MemoryTier.create(1000, base=base)
    try:
        assert not os.path.exists(dead)
        assert live.has_shard(0, 0, "ckpt") and os.path.exists(os.path.join(live.root, "owner.lock"))
        assert os.path.exists(no_lock + "/m") and os.path.exists(other + "/owner.lock")
        assert sorted(os.listdir(base)) == sorted(os.path.basename(p) for p in
                                                   (live.root, fresh.root, no_lock, other, str(tmp_path / "src")))
    finally:
        fresh.destroy()
        live.destroy()


def test_a_tier_whose_owner_is_gone_is_swept_by_the_next_agent(tmp_path):
    """The kernel releases a dead process's flock: a tier whose lock was let go (as at its owner's
    death) is removed by the next create, with everything in it."""
    first = MemoryTier.create(1000, base=str(tmp_path))
    first.write_shard(0, 0, "ckpt", make_dir(tmp_path / "src", {"m": b"1"}))
    os.close(first._lock_fd)  # the owner dies: its lock goes, its directory stays
    first._lock_fd = -1
    second = MemoryTier.create(1000, base=str(tmp_path))
    try:
        assert not os.path.exists(first.root)
    finally:
        second.destroy()


def test_destroy_removes_everything_and_lets_the_lock_go(tmp_path):
    tier = MemoryTier.create(1000, base=str(tmp_path))
    tier.write_shard(0, 0, "ckpt", make_dir(tmp_path / "src", {"m": b"1"}))
    tier.build_view("ckpt", [(0, 0)])
    tier.destroy()
    assert not os.path.exists(tier.root)
    assert os.listdir(tmp_path) == ["src"]
    tier.destroy()  # idempotent


@pytest.mark.parametrize("ledger", [b'{"attempt_0/rank_0/ckpt": 4', b"\xff\xfe not json", b"[1, 2]", b'"text"'])
def test_a_corrupt_ledger_is_forgotten_not_fatal(tmp_path, ledger):
    tier = MemoryTier.create(100, base=str(tmp_path))
    try:
        with open(os.path.join(tier.root, ".ledger"), "wb") as f:
            f.write(ledger)
        assert tier.used_bytes() == 0
        tier.write_shard(0, 0, "ckpt", make_dir(tmp_path / "src", {"m": b"1" * 60}))
        assert json.loads(read(os.path.join(tier.root, ".ledger"))) == {"attempt_0/rank_0/ckpt": 60}
        assert not tier.reserve("more", 41)
    finally:
        tier.destroy()


@pytest.mark.parametrize("ledger", [b'{"attempt_0/rank_0/ckpt": "many"}', b'{"attempt_0/rank_0/ckpt": null}'])
def test_a_ledger_holding_a_non_number_is_forgotten_not_fatal(tmp_path, ledger):
    tier = MemoryTier.create(100, base=str(tmp_path))
    try:
        with open(os.path.join(tier.root, ".ledger"), "wb") as f:
            f.write(ledger)
        assert tier.used_bytes() == 0
        assert tier.reserve("attempt_0/rank_1/ckpt", 60)
    finally:
        tier.destroy()


def test_what_dead_writers_of_earlier_attempts_left_is_removed_and_nothing_else(tier, tmp_path):
    """Before an attempt starts, its node removes half-written shards of earlier attempts (a worker killed
    during the copy into the tier) with their reservations, and the shards of its own ranks of rounds that
    never completed; it keeps what waits to be persisted, what the restart reads, replicas of other nodes'
    ranks, and everything of an attempt whose workers here are still alive."""
    source = make_dir(tmp_path / "src", {"w.bin": b"x" * 10})
    for attempt, rank, name in ((0, 0, "ckpt_a"), (0, 0, "ckpt_b"), (0, 0, "ckpt_c"), (0, 5, "ckpt_a"),
                                (1, 0, "ckpt_d")):
        tier.write_shard(attempt, rank, name, source)
    # A writer of attempt 0 killed in the middle of its copy: its temporary directory and reservation.
    half = os.path.join(os.path.dirname(tier.shard_path(0, 1, "ckpt_e")), ".incoming-dead")
    os.makedirs(half)
    assert tier.reserve("attempt_0/rank_1/ckpt_e/.incoming-dead", 10)
    removed = tier.remove_leftovers(2, local_ranks={0: {0, 1}, 1: {0}},
                                    keep={(0, 0, "ckpt_a"), (0, 0, "ckpt_b")}, live=frozenset({1}))
    assert removed == ["attempt_0/rank_0/ckpt_c"]
    assert tier.shards() == [(0, 0, "ckpt_a"), (0, 0, "ckpt_b"), (0, 5, "ckpt_a"), (1, 0, "ckpt_d")]
    assert not os.path.exists(half)
    assert tier.used_bytes() == 4 * 10  # the dead writer's and the dropped shard's bytes are free again
