"""Workload `memory_tier`: what the node agent's memory tier costs and saves, each figure beside its floor
on the same machine. The measured code is in `memory_tier_jobs.py`.

The checkpoint: 2 ranks, each with 4 files of random bytes (`--size-mib` is the TOTAL over both ranks, as
for `checkpoint`: default 2048, i.e. S = 1024 MiB per rank; `--quick` 32), written once before anything is
timed into the benchmark's temporary directory (local disk, in the page cache from then on). The S3
storage is moto's S3-compatible server in a process of its own on 127.0.0.1, through s3fs. Every round's
files are deleted once measured (num_to_keep=1; the storage prefix after each job).

Each job's first attempt starts with an untimed copy of the sources into the tier's parent (warming the
sources' pages and the tmpfs), then runs `repeats` repetitions of its rounds, each waiting until it is
durable before the next measurement, so nothing runs beside one.

report: `report(checkpoint)` blocking time, the slower rank's, median of `repeats` rounds: with the tier,
    SYNC (returns when every rank's files are in the tier: committed in memory) and ASYNC (returns when
    this rank's are in and the report is recorded), and SYNC without the tier (memory_tier_bytes=0: the
    worker uploads into S3 itself). Floor: the same bytes copied by the same two worker processes at the
    same time (shutil.copyfile, as the tier copies) into a fresh directory in the tier's parent
    (MINITRAIN_MEMORY_TIER_DIR, default /dev/shm), in the same job, alternately before and after the
    round. Target: tier SYNC and ASYNC <= 1.2x the floor.
restart: rank 1 SIGKILLs itself at the end of an attempt, `repeats` times; in each new attempt rank 0
    times its training function's first line -> get_checkpoint() -> every byte of its S MiB read (its 4
    files, readinto one 8 MiB buffer): with the tier from `checkpoint.as_directory()`, the tier's merged
    view (a local directory: nothing copied); without, streamed from S3 through `checkpoint.filesystem`
    (only those bytes: `as_directory()` would download both ranks' files first). Floor: rank 0 reading
    the same bytes from a copy in the tier's parent, right after (the second read of the copy: the first
    read of pages just written to a tmpfs is slower, and the tier's view was written long before).
    Both windows record the CPU the reading thread used and what the rest of the machine used meanwhile
    (/proc/stat), which says whether a slow read waited for a core. Target: the tier's load <= 1.2x
    the floor.
persistence: the time from the memory commit (SYNC report() returned) to durable (rank 0 polls the run's
    index `checkpoint_manager_snapshot.json` on storage until it names the round: every 0.1 s on S3, 0.01
    s on local disk), as throughput (2 S MiB / time). The agent writes a node's shards on one thread, a
    file after another (on S3 s3fs put_file), then the coordinator's commit moves the staged files into
    the checkpoint directory: renames on local disk, a server-side copy of every byte and a delete on S3.
    Peer, measured by rank 0 in the same repetition (after the round in even ones, before it in odd ones,
    while rank 1 waits): both ranks' files, copied first into the tier's parent as the tier holds them,
    written beside the run directory: s3fs `put` of the two directories (files uploaded concurrently, no
    move) on S3, `cp -r` on local disk (a tier job of SYNC rounds only). In the first repetition on S3
    the put is followed by the moves a commit makes (`put_then_move_s`), to show where the time goes.
    Target: >= 0.9x the peer's throughput.

Memory: the tier holds up to two rounds at once (the one kept for restarts and the new one), and the
floor's copy one more: at the default size about 4 GiB of /dev/shm at the peak, besides the page cache.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import statistics
import subprocess
import sys
import time
import uuid

from bench.checkpoint import FILES_PER_RANK, MIB, write_sources
from bench.common import (NUM_WORKERS, BenchError, read_json, read_jsonl, run_role, say, stop_tree, tail,
                          write_json)
from bench.memory_tier_jobs import S3_REGION
from bench.table import Row, WorkloadResult

TARGET_REPORT_RATIO = 1.2
TARGET_LOAD_RATIO = 1.2
TARGET_PERSIST_RATIO = 0.9
S3_START_TIMEOUT_S = 60.0
# The dummy credentials of the loopback server (moto accepts any); they travel in spec files, never argv.
S3_KEY, S3_SECRET = "minitrain-bench-key", "minitrain-bench-secret"


def per_rank_mib(total_mib: int) -> int:
    """`--size-mib` (the total over both ranks) -> each rank's share, S; ValueError when it is not a whole
    number of MiB per file."""
    if total_mib <= 0 or total_mib % (NUM_WORKERS * FILES_PER_RANK):
        raise ValueError(f"--size-mib for memory_tier must be a positive multiple of "
                         f"{NUM_WORKERS * FILES_PER_RANK} ({NUM_WORKERS} ranks x {FILES_PER_RANK} files), "
                         f"got {total_mib}")
    return total_mib // NUM_WORKERS


def tier_base() -> str:
    """The memory tier's parent directory, as the agents will choose it (MINITRAIN_MEMORY_TIER_DIR)."""
    return os.environ.get("MINITRAIN_MEMORY_TIER_DIR") or "/dev/shm"


def job_timeout_s(total_mib: int) -> float:
    """A whole job's limit: generous for moto's ~100 MiB/s, every round uploaded and moved on S3."""
    return 300.0 + total_mib * 0.6


# ---------------------------------------------------------------------- the S3 server


@contextlib.contextmanager
def s3_server(tmp: str):
    """moto's S3 server in a process of its own (bench.memory_tier_jobs role s3-server) with one fresh
    bucket; yields (s3fs filesystem, bucket, storage options). The process is ended on the way out."""
    try:
        import s3fs  # noqa: F401
        import moto.server  # noqa: F401
    except ImportError as exc:
        raise BenchError(f"memory_tier needs s3fs and moto[server] for its S3 storage ({exc}); "
                         "pip install -e '.[dev]'") from None
    import s3fs

    spec_path, endpoint_file = os.path.join(tmp, "spec_s3.json"), os.path.join(tmp, "s3_endpoint.json")
    write_json(spec_path, {"endpoint_file": endpoint_file})
    output = os.path.join(tmp, "s3_server.txt")
    with open(output, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "bench.memory_tier_jobs", "--role", "s3-server",
                                 "--spec", spec_path], cwd=tmp, stdin=subprocess.PIPE, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + S3_START_TIMEOUT_S
        while not os.path.exists(endpoint_file):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise BenchError(f"the S3 server did not start; its output:\n{tail(output)}")
            time.sleep(0.05)
        endpoint = read_json(endpoint_file)["endpoint_url"]
        options = {"key": S3_KEY, "secret": S3_SECRET, "use_listings_cache": False, "skip_instance_cache": True,
                   "client_kwargs": {"endpoint_url": endpoint, "region_name": S3_REGION}}
        fs = s3fs.S3FileSystem(**options)
        bucket = f"bench-{uuid.uuid4().hex[:12]}"
        fs.mkdir(bucket)
        yield fs, bucket, options
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            stop_tree(proc)


# ---------------------------------------------------------------------- jobs


def run_job(tmp: str, name: str, sources: list[list[str]], storage: str, s3, tier_bytes: int, modes: list[str],
            repeats: int, kills: int, peer: bool, total_mib: int, floor_prefix: str) -> dict:
    """One tier-job; its rounds and restarts as the workers recorded them."""
    out_dir = os.path.join(tmp, name)
    os.makedirs(out_dir)
    run_dir = f"{storage}/bench"
    spec = {"sources": sources, "storage": storage, "s3": s3, "tier_bytes": tier_bytes, "modes": modes,
            "repeats": repeats, "kills": kills, "peer": peer, "events": os.path.join(out_dir, "events.jsonl"),
            "results": os.path.join(out_dir, "results.jsonl"), "index": f"{run_dir}/checkpoint_manager_snapshot.json",
            "tier_base": tier_base(), "floor_prefix": floor_prefix, "durable_timeout_s": job_timeout_s(total_mib)}
    wall = run_role(tmp, "memory_tier_jobs", "tier-job", spec, name, job_timeout_s(total_mib))
    records = read_jsonl(spec["results"])
    return {"wall_s": wall, "rounds": [r for r in records if r["kind"] == "round"],
            "restarts": [r for r in records if r["kind"] == "restart"]}


def round_figures(rounds: list[dict], mode: str) -> list[dict]:
    """Per repetition of `mode`: the slower rank's report() and floor copy (seconds), rank 0's memory
    commit -> durable, and the phases of the ranks' reports."""
    reps = sorted({r["rep"] for r in rounds if r["mode"] == mode})
    out = []
    for rep in reps:
        ranks = sorted((r for r in rounds if r["mode"] == mode and r["rep"] == rep), key=lambda r: r["rank"])
        if len(ranks) != NUM_WORKERS:
            raise BenchError(f"repetition {rep} of {mode} has records of {len(ranks)} ranks, not {NUM_WORKERS}")
        out.append({"rep": rep, "report_s": max(r["seconds"] for r in ranks),
                    "floor_s": max(r["floor"]["seconds"] for r in ranks),
                    "durable_s": ranks[0].get("durable_s"), "peer": ranks[0].get("peer"),
                    "load_1min": max(r["load_1min"] for r in ranks),
                    "tier_s": max(r["phases"].get("tier_s", 0.0) for r in ranks),
                    "upload_s": max(r["phases"].get("upload_s", 0.0) for r in ranks),
                    "ack_wait_s": max(r["phases"].get("ack_wait_s", 0.0) for r in ranks)})
    return out


def _median(values) -> float:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else float("nan")


def summarise_report(per_rep: list[dict]) -> dict:
    """Medians and the ratio of the medians (report / floor)."""
    report, floor = _median(r["report_s"] for r in per_rep), _median(r["floor_s"] for r in per_rep)
    return {"per_rep": per_rep, "report_s": report, "floor_s": floor, "ratio": report / floor,
            "durable_s": _median(r["durable_s"] for r in per_rep)}


def summarise_restarts(restarts: list[dict], expected_bytes: int, from_tier: bool) -> dict:
    """Medians of the loads and their floors; BenchError when a load read the wrong bytes or came from
    the wrong place (the tier's view, or storage)."""
    if not restarts:
        raise BenchError("no restarted attempt recorded its load")
    for r in restarts:
        if r["bytes"] != expected_bytes or r["floor_bytes"] != expected_bytes:
            raise BenchError(f"attempt {r['attempt']} read {r['bytes']} bytes (floor {r['floor_bytes']}), "
                             f"expected {expected_bytes}")
        in_tier = os.path.basename(os.path.dirname(r["path"])).startswith("attempt_") and "minitrain-tier-" in r["path"]
        if in_tier != from_tier:
            where = "the memory tier" if from_tier else "storage"
            raise BenchError(f"attempt {r['attempt']} resumed from {r['path']}, not from {where}")
    load, floor = _median(r["load_s"] for r in restarts), _median(r["floor_s"] for r in restarts)
    return {"restarts": restarts, "load_s": load, "floor_s": floor, "ratio": load / floor}


def check_paths(per_rep: list[dict], tier: bool, what: str) -> None:
    """Each round went the way it was meant to: into the tier (time in the tier copy, no upload by the
    worker), or uploaded by the worker (a full tier falls back to that path silently otherwise)."""
    for r in per_rep:
        if tier and (r["tier_s"] <= 0 or r["upload_s"] > 0):
            raise BenchError(f"{what}, repetition {r['rep']}: the checkpoint did not go through the memory "
                             f"tier (tier copy {r['tier_s']:.3f} s, worker upload {r['upload_s']:.3f} s)")
        if not tier and (r["tier_s"] > 0 or r["upload_s"] <= 0):
            raise BenchError(f"{what}, repetition {r['rep']}: expected the worker's own upload, got tier copy "
                             f"{r['tier_s']:.3f} s, upload {r['upload_s']:.3f} s")


# ---------------------------------------------------------------------- rows


def tier_rows(figures: dict) -> list[Row]:
    """The workload's rows from its figures (see `bench_memory_tier`'s return)."""
    s, repeats = figures["per_rank_mib"], figures["repeats"]
    rows = []
    what = f"2 ranks x {s} MiB, S3 (moto, loopback)"
    floor = "2 concurrent copies into /dev/shm"
    for key, label in (("tier_sync", "SYNC, memory tier"), ("tier_async", "ASYNC, memory tier"),
                       ("no_tier_sync", "SYNC, no tier (memory_tier_bytes=0: the worker uploads)")):
        r = figures["report"][key]
        tier = key != "no_tier_sync"
        rows.append(Row("memory_tier", f"`report(checkpoint)` blocking, {label}, {what} (median of {repeats})",
                        f"{r['report_s']:.3f} s", f"{floor} {r['floor_s']:.3f} s", f"{r['ratio']:.2f}x",
                        f"<= {TARGET_REPORT_RATIO}x" if tier else "-",
                        r["ratio"] <= TARGET_REPORT_RATIO if tier else None))
    tier, s3 = figures["restart"]["tier"], figures["restart"]["s3"]
    rows.append(Row("memory_tier", f"worker SIGKILL, new attempt's first line -> get_checkpoint() -> rank 0's "
                    f"{s} MiB read, from the memory tier (median of {len(tier['restarts'])})",
                    f"{tier['load_s']:.3f} s", f"reading it from /dev/shm {tier['floor_s']:.3f} s",
                    f"{tier['ratio']:.2f}x", f"<= {TARGET_LOAD_RATIO}x", tier["ratio"] <= TARGET_LOAD_RATIO))
    rows.append(Row("memory_tier", f"the same, no tier: read from S3 (median of {len(s3['restarts'])}; "
                    f"{s3['load_s'] / tier['load_s']:.1f}x the tier's)", f"{s3['load_s']:.3f} s",
                    f"reading it from /dev/shm {s3['floor_s']:.3f} s", f"{s3['ratio']:.2f}x"))
    for key, where, peer in (("s3", "S3 (moto, loopback): upload + the commit's server-side moves", "s3fs put"),
                             ("local", "local disk", "`cp -r`")):
        p = figures["persist"][key]
        rows.append(Row("memory_tier", f"background persistence, memory commit -> durable, 2 x {s} MiB, {where} "
                        f"(median of {p['n']})", f"{p['mib_s']:.0f} MiB/s", f"{peer} {p['peer_mib_s']:.0f} MiB/s",
                        f"{p['ratio']:.2f}x", f">= {TARGET_PERSIST_RATIO}x", p["ratio"] >= TARGET_PERSIST_RATIO))
    return rows


def _persist_figures(per_rep: list[dict], size_bytes: int) -> dict:
    """Memory commit -> durable against the peer measured in the same repetition, as throughputs."""
    for r in per_rep:
        if not r["peer"] or r["peer"]["bytes"] != size_bytes:
            raise BenchError(f"repetition {r['rep']}: the persistence peer wrote {r['peer'] and r['peer']['bytes']} "
                             f"bytes, expected {size_bytes}")
    mib = size_bytes / MIB
    durable_s, peer_s = [r["durable_s"] for r in per_rep], [r["peer"]["seconds"] for r in per_rep]
    d, p = _median(durable_s), _median(peer_s)
    figures = {"n": len(durable_s), "durable_s": durable_s, "peer_s": peer_s, "durable_median_s": d,
               "peer_median_s": p, "mib_s": mib / d, "peer_mib_s": mib / p, "ratio": (mib / d) / (mib / p)}
    moves = [r["peer"]["move_s"] for r in per_rep if "move_s" in r["peer"]]
    if moves:  # the first repetition's put, then the moves a commit makes on S3
        figures["put_then_move_s"] = per_rep[0]["peer"]["seconds"] + moves[0]
        figures["move_s"] = moves[0]
    return figures


def bench_memory_tier(tmp: str, total_mib: int, repeats: int) -> dict:
    """Every measurement of the workload (see the module docstring); the figures `tier_rows` takes."""
    s = per_rank_mib(total_mib)
    size_bytes = total_mib * MIB
    base = tier_base()
    free = shutil.disk_usage(base).free
    if free < 3 * size_bytes:
        raise BenchError(f"{base} has {free / MIB:.0f} MiB free; the memory_tier workload at --size-mib "
                         f"{total_mib} needs {3 * total_mib} (two rounds in the tier and a floor copy)")
    tier_bytes = 3 * size_bytes  # two rounds and slack: a round that did not fit would bypass the tier
    floor_prefix = f"minitrain-bench-floor-{uuid.uuid4().hex[:8]}-"
    sources = write_sources(os.path.join(tmp, "sources"), size_bytes)
    kills = repeats
    figures: dict = {"per_rank_mib": s, "size_bytes": size_bytes, "repeats": repeats, "tier_base": base,
                     "files_per_rank": FILES_PER_RANK, "report": {}, "restart": {}, "persist": {}}
    try:
        with s3_server(tmp) as (fs, bucket, options):
            s3 = {"options": options}
            say(f"  S3: moto on {options['client_kwargs']['endpoint_url']}, bucket {bucket}")
            jobs = {}
            for name, tier, modes in (("tier_s3", tier_bytes, ["sync", "async"]), ("no_tier_s3", 0, ["sync"])):
                jobs[name] = run_job(tmp, name, sources, f"{bucket}/{name}", s3, tier, modes, repeats, kills,
                                     tier > 0, total_mib, floor_prefix)
                with contextlib.suppress(FileNotFoundError):
                    fs.rm(f"{bucket}/{name}", recursive=True)
                say(f"  {name}: one job, {jobs[name]['wall_s']:.1f} s")
            with contextlib.suppress(FileNotFoundError):
                fs.rm(bucket, recursive=True)
        storage = os.path.join(tmp, "storage_local")
        jobs["tier_local"] = run_job(tmp, "tier_local", sources, storage, None, tier_bytes, ["sync"], repeats, 0, True,
                                     total_mib, floor_prefix)
        shutil.rmtree(storage, ignore_errors=True)
        say(f"  tier_local: one job, {jobs['tier_local']['wall_s']:.1f} s")
    finally:
        shutil.rmtree(os.path.join(tmp, "sources"), ignore_errors=True)
        for left in glob.glob(os.path.join(base, floor_prefix + "*")):
            shutil.rmtree(left, ignore_errors=True)

    for key, job, mode, tier in (("tier_sync", "tier_s3", "sync", True), ("tier_async", "tier_s3", "async", True),
                                 ("no_tier_sync", "no_tier_s3", "sync", False)):
        per_rep = round_figures(jobs[job]["rounds"], mode)
        check_paths(per_rep, tier, key)
        figures["report"][key] = summarise_report(per_rep)
    expected = size_bytes // NUM_WORKERS
    figures["restart"]["tier"] = summarise_restarts(jobs["tier_s3"]["restarts"], expected, from_tier=True)
    figures["restart"]["s3"] = summarise_restarts(jobs["no_tier_s3"]["restarts"], expected, from_tier=False)
    local_reps = round_figures(jobs["tier_local"]["rounds"], "sync")
    check_paths(local_reps, True, "tier_local")
    figures["persist"]["s3"] = _persist_figures(figures["report"]["tier_sync"]["per_rep"], size_bytes)
    figures["persist"]["local"] = _persist_figures(local_reps, size_bytes)
    figures["persist"]["local"]["report"] = summarise_report(local_reps)
    figures["jobs_wall_s"] = {name: job["wall_s"] for name, job in jobs.items()}
    return figures


def memory_tier_workload(tmp: str, total_mib: int, repeats: int) -> WorkloadResult:
    """`memory_tier`: the figures, progress lines and rows."""
    s = per_rank_mib(total_mib)
    say(f"  {NUM_WORKERS} ranks x {s} MiB ({FILES_PER_RANK} files each), {repeats} repetition(s); memory tier in "
        f"{tier_base()}")
    figures = bench_memory_tier(tmp, total_mib, repeats)
    for key, r in figures["report"].items():
        reps = "; ".join(f"{p['report_s']:.3f} / {p['floor_s']:.3f} s" for p in r["per_rep"])
        say(f"  report {key}: median {r['report_s']:.3f} s vs floor {r['floor_s']:.3f} s ({r['ratio']:.2f}x); "
            f"report / floor per repetition: {reps}")
    for key, r in figures["restart"].items():
        loads = "; ".join(f"{p['load_s']:.3f} / {p['floor_s']:.3f} s (reading thread's CPU "
                          f"{p['load_cpu']['thread_cpu_s']:.3f} / {p['floor_cpu']['thread_cpu_s']:.3f} s, the "
                          f"rest of the machine's {p['load_cpu']['others_cpu_s']:.3f} / "
                          f"{p['floor_cpu']['others_cpu_s']:.3f} s)" for p in r["restarts"])
        say(f"  restart {key}: load median {r['load_s']:.3f} s vs floor {r['floor_s']:.3f} s ({r['ratio']:.2f}x); "
            f"load / floor per restart: {loads}")
    for key, p in figures["persist"].items():
        moves = f"; the first put then the commit's moves {p['put_then_move_s']:.2f} s" if "move_s" in p else ""
        say(f"  persistence {key}: {p['mib_s']:.0f} MiB/s (durable after "
            f"{', '.join(f'{v:.2f}' for v in p['durable_s'])} s) vs peer {p['peer_mib_s']:.0f} MiB/s "
            f"({', '.join(f'{v:.2f}' for v in p['peer_s'])} s): {p['ratio']:.2f}x{moves}")
    return WorkloadResult("memory_tier", rows=tier_rows(figures), figures=figures)
