"""Training functions and storage filesystems of tests/e2e/test_memory_tier_faults.py.

Workers import this module by reference when they unpickle their payload, and node agents when they
unpickle the run's storage (the filesystems below decide how the agent's persistence of memory-tier
shards behaves), so it imports neither pytest nor the test module. Every wait has a deadline.

Each rank's checkpoint holds one file, `rank<r>.txt`, whose text names the round and the rank: a
merged checkpoint proves which round it is and that both ranks' files are in it.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import tempfile
import time

from fsspec.implementations.local import LocalFileSystem

import minitrain

STAGING = "/.staging/"
WAIT_S = 60.0  # the longest any wait here lasts: a test that goes wrong fails, it never hangs


def shard_text(round_: int, rank: int) -> str:
    """The text of `rank<rank>.txt` in the checkpoint of round `round_`."""
    return f"round {round_} rank {rank}"


def read_checkpoint(path: str) -> dict:
    """file name -> text of every file directly in the local directory `path`."""
    return {name: open(os.path.join(path, name)).read() for name in sorted(os.listdir(path))}


def write_json(path: str, data) -> None:
    """Write `data` to `path` so that a reader sees all of it or nothing (a rename)."""
    with open(path + ".tmp", "w") as handle:
        json.dump(data, handle)
    os.replace(path + ".tmp", path)


def wait_for_files(paths, what: str, timeout_s: float = WAIT_S) -> None:
    """Return once every path exists; TimeoutError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not all(os.path.exists(p) for p in paths):
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.01)


def _wait_to_be_stopped() -> None:
    """Stand still until the attempt is stopped (the coordinator ends this process)."""
    time.sleep(WAIT_S)
    raise TimeoutError("this rank was never stopped")


def _report_round(round_: int, rank: int, mode: str = "SYNC", big: int = 0) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, f"rank{rank}.txt"), "w") as handle:
            handle.write(shard_text(round_, rank))
        if big:
            with open(os.path.join(tmp, "padding.bin"), "wb") as handle:
                handle.write(b"\0" * big)
        minitrain.report({"round": round_}, checkpoint=minitrain.Checkpoint.from_directory(tmp),
                         checkpoint_upload_mode=mode)


def _note_resume(notes: str, rank: int, name: str) -> dict:
    """Note in <notes>/<name>_<rank>.json what get_checkpoint() gives: its path and files (None: none)."""
    checkpoint = minitrain.get_checkpoint()
    seen = {"path": None, "files": {}}
    if checkpoint is not None:
        with checkpoint.as_directory() as local:
            seen = {"path": checkpoint.path, "files": read_checkpoint(local)}
    write_json(os.path.join(notes, f"{name}_{rank}.json"), seen)
    return seen


def die_right_after_reports(config):
    """The first attempt reports checkpoint rounds 0 and 1 (config["mode"]: SYNC or ASYNC); each rank notes
    <notes>/returned_<rank> at once after its round-1 report() returned, and rank 0 SIGKILLs itself as soon
    as both notes exist. The next attempt notes what get_checkpoint() gives it (<notes>/resumed_<rank>.json)
    and opens <notes>/restarted (what a gated filesystem waits for), then ends."""
    rank = minitrain.get_context().get_world_rank()
    notes = config["notes"]
    if os.path.exists(os.path.join(notes, "killed")):
        _note_resume(notes, rank, "resumed")
        open(os.path.join(notes, "restarted"), "a").close()
        return
    for round_ in range(2):
        _report_round(round_, rank, config["mode"])
    open(os.path.join(notes, f"returned_{rank}"), "w").close()
    if rank == 0:
        wait_for_files([os.path.join(notes, f"returned_{r}") for r in range(2)], "every rank's report to return")
        open(os.path.join(notes, "killed"), "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    _wait_to_be_stopped()


def die_during_the_copy_into_the_tier(config):
    """Round 0 is committed; in round 1 rank 1 SIGKILLs itself while its files are being copied into the
    tier (a watcher thread sees the half-written `.incoming-*` directory and kills the process there). The
    next attempt notes what it resumes from and what the tier holds (<notes>/tier_<rank>.json: any
    `.incoming-*` entry, and the ledger's keys), then ends."""
    import threading

    rank = minitrain.get_context().get_world_rank()
    notes, tiers = config["notes"], config["tiers"]
    if os.path.exists(os.path.join(notes, "killed")):
        _note_resume(notes, rank, "resumed")
        incoming = [os.path.join(root, name) for root, dirs, _ in os.walk(tiers) for name in dirs
                    if name.startswith(".incoming-")]
        ledgers = [os.path.join(root, ".ledger") for root, _, files in os.walk(tiers) if ".ledger" in files]
        keys = sorted(key for path in ledgers for key in json.load(open(path)))
        write_json(os.path.join(notes, f"tier_{rank}.json"), {"incoming": incoming, "ledger": keys})
        return
    _report_round(0, rank)
    if rank == 1:
        def kill_while_copying() -> None:
            deadline = time.monotonic() + WAIT_S
            while time.monotonic() < deadline:
                for root, dirs, _ in os.walk(tiers):
                    if any(name.startswith(".incoming-") for name in dirs) and "rank_1" in root:
                        open(os.path.join(notes, "killed"), "w").close()
                        os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(0.0005)

        threading.Thread(target=kill_while_copying, daemon=True).start()
        _report_round(1, rank, big=256 << 20)  # a copy long enough to be caught in the middle
        raise AssertionError("the copy into the tier ended before the watcher saw it")
    _report_round(1, rank)
    _wait_to_be_stopped()


def report_rounds(config):
    """Checkpoint rounds 0..config["rounds"]-1; config["big"][str(round)][rank] bytes of padding in a
    rank's checkpoint (0 when absent)."""
    rank = minitrain.get_context().get_world_rank()
    sizes = config.get("big", {})
    for round_ in range(config["rounds"]):
        _report_round(round_, rank, config.get("mode", "SYNC"), int(sizes.get(str(round_), [0, 0])[rank]))


def hold_after_round(config):
    """Resume after the checkpoint get_checkpoint() names (noted in <notes>/<config["name"]>_<rank>.json),
    then report checkpoint rounds up to config["rounds"]-1; after round config["hold_after"] (when given)
    each rank notes <notes>/held_<rank> and stands still until it is stopped."""
    rank = minitrain.get_context().get_world_rank()
    notes = config["notes"]
    seen = _note_resume(notes, rank, config["name"])
    start = 0 if seen["path"] is None else int(seen["files"][f"rank{rank}.txt"].split()[1]) + 1
    for round_ in range(start, config["rounds"]):
        _report_round(round_, rank)
        if round_ == config.get("hold_after"):
            open(os.path.join(notes, f"held_{rank}"), "w").close()
            _wait_to_be_stopped()


def kill_the_persisting_agent(config):
    """Report checkpoint rounds 0 and 1; once the node agent is writing round 1 to storage (the gated
    filesystem noted its pid in config["pid_file"]), rank 0 of the first attempt SIGKILLs it. A later
    attempt notes what get_checkpoint() gives it and reports rounds up to config["rounds"]-1. Rank 0 notes
    the tiers in config["tiers"] (MINITRAIN_MEMORY_TIER_DIR) before the kill and after the restart."""
    rank = minitrain.get_context().get_world_rank()
    notes = config["notes"]
    if os.path.exists(os.path.join(notes, "agent_killed")):
        if rank == 0:  # the next agent has made its tier: the dead one's is swept by then
            write_json(os.path.join(notes, "tiers_after.json"), sorted(os.listdir(config["tiers"])))
        seen = _note_resume(notes, rank, "resumed")
        start = 0 if seen["path"] is None else int(seen["files"][f"rank{rank}.txt"].split()[1]) + 1
        for round_ in range(start, config["rounds"]):
            _report_round(round_, rank)
        return
    for round_ in range(2):
        _report_round(round_, rank)
    if rank == 0:
        wait_for_files([config["pid_file"]], "the agent to write round 1 to storage")
        # Round 0 is durable first (the agent wrote it before round 1, but its answer may still be on its
        # way to the coordinator): only round 1 is the agent's to lose.
        deadline = time.monotonic() + WAIT_S
        while "checkpoint_000000" not in _index_names(config["index"]):
            if time.monotonic() > deadline:
                raise TimeoutError("round 0 never became durable")
            time.sleep(0.01)
        write_json(os.path.join(notes, "tiers_before.json"), sorted(os.listdir(config["tiers"])))
        agent = int(open(config["pid_file"]).read())  # GatedFileSystem holds up node agents only
        open(os.path.join(notes, "agent_killed"), "w").write(str(agent))
        os.kill(agent, signal.SIGKILL)
    _wait_to_be_stopped()


def _index_names(path: str) -> list[str]:
    """The checkpoint directories the run's index at `path` names ([] while it cannot be read)."""
    try:
        with open(path) as handle:
            return [entry["checkpoint_dir_name"] for entry in json.load(handle)["checkpoint_results"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []


# ------------------------------------------------------------------------------------------ filesystems


def _in_agent() -> bool:
    """Whether this process is a node agent (`python -m minitrain.agent`)."""
    with open("/proc/self/cmdline", "rb") as handle:
        return b"minitrain.agent" in handle.read().split(b"\0")


class OutageFileSystem(LocalFileSystem):
    """Local storage whose staging area is unreachable: every file written under `.staging/` fails with
    EIO (the node agent's persistence of memory-tier shards writes there, and nothing else does when
    every shard fits in the tier)."""

    def put_file(self, lpath, rpath, **kwargs):
        if STAGING in str(rpath):
            raise OSError(errno.EIO, "injected storage outage", str(rpath))
        return super().put_file(lpath, rpath, **kwargs)


class GatedFileSystem(LocalFileSystem):
    """Local storage on which a node agent's writing of checkpoint `dir_name` to the staging area is held
    up: the agent notes its pid in `pid_file` and waits (at most `wait_s`) until the file `gate` exists
    (and holds `gate_text`, when given), `when` = "before" writing each file or "after" it (the file is
    then on storage, and the agent has not said so yet). Other files, and every file other processes
    write, are written at once."""

    def __init__(self, dir_name: str = "", pid_file: str = "", gate: str = "", gate_text: str = "",
                 when: str = "before", wait_s: float = WAIT_S, **kwargs):
        super().__init__(**kwargs)
        self.dir_name = dir_name
        self.pid_file = pid_file
        self.gate = gate
        self.gate_text = gate_text
        self.when = when
        self.wait_s = wait_s

    def _held(self, rpath: str) -> bool:
        return STAGING in rpath and f"/{self.dir_name}/" in rpath and _in_agent()

    def _gate_open(self) -> bool:
        try:
            with open(self.gate) as handle:
                return self.gate_text in handle.read()
        except OSError:
            return False

    def _wait(self) -> None:
        with open(self.pid_file + f".{os.getpid()}", "w") as handle:
            handle.write(str(os.getpid()))
        os.replace(self.pid_file + f".{os.getpid()}", self.pid_file)
        deadline = time.monotonic() + self.wait_s
        while not self._gate_open() and time.monotonic() < deadline:
            time.sleep(0.01)

    def put_file(self, lpath, rpath, **kwargs):
        held = self._held(str(rpath))
        if held and self.when == "before":
            self._wait()
        result = super().put_file(lpath, rpath, **kwargs)
        if held and self.when == "after":
            self._wait()
        return result

