"""Every benchmark workload still runs: `python -m bench --quick --only <workload>` end to end (tiny
sizes, one repetition). The figures are printed, never asserted. These are the soak tier's (marked
`soak`, run by `bash scripts/test.sh --soak`; 230 s of test-process time on 2 cores): the default run
checks the benchmarks' pure pieces (tests/unit/test_benchmarks.py) and drives the real coordinator with
the scale benchmark's fake agents (tests/process/test_fake_cluster.py)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from bench import cli

pytestmark = [pytest.mark.e2e, pytest.mark.soak]

ROOT = Path(__file__).resolve().parents[2]
QUICK_TIMEOUT_S = 300
# The restart and detect workloads stop a job that made no progress for --stall-s (30 s in --quick): on a
# loaded machine (load 11-14) a job that was only slow was stopped and the test failed. A test must not
# fail because the machine is busy: their stall limit here is generous, and so is the whole run's.
BUSY_MACHINE_STALL_S = 240
BUSY_MACHINE_TIMEOUT_S = 1200


def run_quick(tmp_path, only: str, *extra: str, timeout_s: float = QUICK_TIMEOUT_S) -> tuple[dict, str]:
    """`python -m bench --quick --only <only>`; its JSON figures and its stdout. Running past `timeout_s`
    fails the test with what it waited for and the machine's load."""
    out = tmp_path / "bench.json"
    command = [sys.executable, "-m", "bench", "--quick", "--only", only, "--json", str(out),
               "--tmp-dir", str(tmp_path), *extra]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT) as bench:
        stdout = ""
        try:
            stdout, stderr = bench.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            # The bench's own processes (a torchrun peer, agents, workers) go with it: killing only the
            # bench left a hung torchrun behind.
            with contextlib.suppress(psutil.Error):
                descendants = psutil.Process(bench.pid).children(recursive=True)
                bench.kill()
                for process in descendants:
                    with contextlib.suppress(psutil.Error):
                        process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                stdout, _ = bench.communicate(timeout=30)
            pytest.fail(f"waited {timeout_s:g} s for `{' '.join(command[1:])}` to finish; it had not (load "
                        f"average {os.getloadavg()[0]:.1f}). Its last output:\n{stdout[-2000:]}")
    done = subprocess.CompletedProcess(command, bench.returncode, stdout, stderr)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert not list(tmp_path.glob("minitrain-bench-*")), "the temporary directory was left behind"
    figures = json.loads(out.read_text())
    assert figures["quick"] and not figures["failures"]
    assert "| workload | measure |" in done.stdout and figures["markdown"].startswith("| workload")
    return figures["workloads"], done.stdout


@pytest.mark.e2e
def test_job_memory_report_and_ddp_quick(tmp_path):
    workloads, _ = run_quick(tmp_path, "job,report,ddp")
    job = workloads["job"]["figures"]
    assert job["minitrain_median_s"] > 0 and job["torchrun_median_s"] > 0
    assert job["peak_rss_mib"]["coordinator"] > 0 and job["peak_rss_mib"]["agent"] > 0
    assert not job["agent_imported_torch"] and not job["driver_imported_torch"]
    assert {r["workload"] for r in workloads["job"]["rows"]} == {"job", "memory"}
    report = workloads["report"]["figures"]
    assert report["calls"] == cli.QUICK.calls and report["median_us"] > 0 and report["p99_us"] >= report["median_us"]
    assert report["sustained_per_rank_per_s"] > 0 and len(workloads["report"]["rows"]) == 5
    # The driver's CPU over the report loop, from its own samples: some, and not more than the loop's wall
    # time on 2 cores (a figure taken outside the loop would be larger).
    loop_s = report["calls"] * report["workers"] / report["absorbed_per_s"]
    assert 0 < report["driver_cpu_s"] <= 2 * loop_s + 0.05 and report["driver_us_per_report"] > 0
    ddp = workloads["ddp"]["figures"]
    assert ddp["minitrain_steps_per_s"] > 0 and ddp["torchrun_steps_per_s"] > 0
    assert ddp["runs"]["minitrain"][0]["threads"] == ddp["runs"]["torchrun"][0]["threads"]
    # What the supervising processes used during the timed steps, found by each side's rank 0 among its
    # ancestors: minitrain's driver and agent, torchrun's launcher.
    assert set(ddp["runs"]["minitrain"][0]["supervisor_cpu_ms_per_step"]) == {"driver", "agent"}
    assert set(ddp["runs"]["torchrun"][0]["supervisor_cpu_ms_per_step"]) == {"launcher"}
    assert set(ddp["supervisor_cpu_ms_per_step"]) == {"driver", "agent", "launcher"}
    assert all(v >= 0 for v in ddp["supervisor_cpu_ms_per_step"].values())
    # The telemetry overhead side: the minitrain loop again with MINITRAIN_TELEMETRY=0 in its workers.
    assert set(ddp["runs"]) == {"minitrain", "torchrun", "minitrain_telemetry_off"}
    assert ddp["runs"]["minitrain"][0]["telemetry_env"] != "0"
    off = ddp["runs"]["minitrain_telemetry_off"]
    assert len(off) == cli.QUICK.repeats and off[0]["telemetry_env"] == "0"
    assert off[0]["steps"] == cli.QUICK.ddp_steps and off[0]["threads"] == ddp["runs"]["minitrain"][0]["threads"]
    assert ddp["telemetry_off_steps_per_s"] > 0
    # The ratio is the median of back-to-back pairs' ratios (one pair in the quick run).
    pairs = [on["steps_per_s"] / o["steps_per_s"] for on, o in zip(ddp["runs"]["minitrain"], off)]
    assert ddp["telemetry_pair_ratios"] == pairs and ddp["telemetry_ratio"] == pairs[0]
    # Telemetry on and off in alternating blocks of the minitrain job (one pair in the quick run).
    blocks = ddp["runs"]["minitrain"][0]["telemetry_blocks"]
    assert len(blocks) == 1 and all(on > 0 and off > 0 for on, off in blocks)
    assert ddp["telemetry_block_ratios"] == [off / on for on, off in blocks]
    assert "telemetry_blocks" not in off[0]
    # The direct cost is timed only where telemetry is on.
    assert ddp["runs"]["minitrain"][0]["report_bookkeeping_us"] > 0 and ddp["sample_us"] > 0
    assert "report_bookkeeping_us" not in off[0]
    assert 0 < ddp["direct_fraction"] < 1
    measures = [row["measure"] for row in workloads["ddp"]["rows"]]
    assert len(measures) == 5 and measures[1].startswith("CPU used by the processes supervising the workers")
    assert measures[2].startswith("telemetry overhead")
    assert measures[3].startswith("telemetry on / off in alternating blocks")
    assert measures[4].startswith("telemetry cost timed directly")


@pytest.mark.e2e
def test_checkpoint_and_async_quick(tmp_path):
    workloads, _ = run_quick(tmp_path, "checkpoint,async")
    persist = workloads["checkpoint"]["figures"]
    assert persist["size_bytes"] == cli.QUICK.size_mib << 20 and persist["ratio"] > 0
    assert not persist["page_cache_dropped"]  # --quick never drops the cache of the tests beside it
    steps = workloads["async"]["figures"]
    for variant in ("plain", "metrics", "async", "sync"):
        assert steps["summary"][variant]["median_ms"] > 0, variant
        assert len(steps["runs"][variant][0]["step_s"]) == steps["steps"]
    assert isinstance(steps["async_overhead_pct"], float)


@pytest.mark.e2e
def test_memory_tier_quick(tmp_path):
    workloads, _ = run_quick(tmp_path, "memory_tier")
    figures = workloads["memory_tier"]["figures"]
    assert figures["per_rank_mib"] * 2 == cli.QUICK.tier_size_mib and figures["repeats"] == 1
    # Every round went where it was meant to (the tier, or the worker's own upload: checked by the
    # workload) and has its floor; the restarts read from the tier's view and from S3 (checked too).
    for key in ("tier_sync", "tier_async", "no_tier_sync"):
        report = figures["report"][key]
        assert report["report_s"] > 0 and report["floor_s"] > 0 and len(report["per_rep"]) == 1, key
    assert figures["report"]["tier_sync"]["per_rep"][0]["durable_s"] > 0
    for key in ("tier", "s3"):
        assert len(figures["restart"][key]["restarts"]) == 1 and figures["restart"][key]["load_s"] > 0, key
    for key in ("s3", "local"):
        assert figures["persist"][key]["mib_s"] > 0 and figures["persist"][key]["peer_mib_s"] > 0, key
    assert figures["persist"]["s3"]["put_then_move_s"] > figures["persist"]["s3"]["peer_s"][0]
    assert [row["target"] for row in workloads["memory_tier"]["rows"]] == [
        "<= 1.2x", "<= 1.2x", "-", "<= 1.2x", "-", ">= 0.9x", ">= 0.9x"]
    assert not [name for name in os.listdir(figures["tier_base"]) if name.startswith("minitrain-bench-floor-")]


@pytest.mark.e2e
@pytest.mark.timeout(BUSY_MACHINE_TIMEOUT_S + 60)
def test_restart_quick(tmp_path):
    workloads, _ = run_quick(tmp_path, "restart", "--stall-s", str(BUSY_MACHINE_STALL_S),
                             timeout_s=BUSY_MACHINE_TIMEOUT_S)
    figures = workloads["restart"]["figures"]
    restart = figures["minitrain"]
    # minitrain: every kill was followed by an attempt that reached its first step, and the job finished.
    assert restart["kills"] == cli.QUICK.restarts == restart["succeeded_after_kill"], restart["per_restart"]
    assert restart["resumed_every_attempt"] and restart["run"]["leftover_processes"] == 0
    assert "kill_to_detected_log" in restart["phases"] and restart["first_line"]["n"] == restart["kills"]
    # A crash at the first line of the first attempt (the fork server still cold): restarted too.
    early = figures["early_crash"]
    assert early["runs"] == cli.QUICK.early_crashes == early["kills"] == early["succeeded_after_kill"], early
    assert early["first_line"]["n"] == early["kills"] and early["leftover_processes"] == 0
    assert {"kill_to_detected_log", "starting_log_to_process", "process_to_train_fn"} <= set(early["phases"])
    assert "crash at the first line of the first attempt" in "".join(r["measure"] for r in workloads["restart"]["rows"])
    # torchrun: whatever it did is recorded (its restarts may fail or hang: a finding, not an error).
    torchrun = figures["torchrun"]
    assert torchrun["runs"] == 1 and torchrun["leftover_processes"] == 0
    assert {"kills", "succeeded_after_kill", "failed", "latencies_s", "endings"} <= set(torchrun)


@pytest.mark.e2e
@pytest.mark.timeout(BUSY_MACHINE_TIMEOUT_S + 60)
def test_detect_quick(tmp_path):
    workloads, _ = run_quick(tmp_path, "detect", "--stall-s", str(BUSY_MACHINE_STALL_S),
                             timeout_s=BUSY_MACHINE_TIMEOUT_S)
    figures = workloads["detect"]["figures"]
    for kind in ("agent", "agent-stop"):  # SIGKILLed and SIGSTOPped (silent) agents
        loss = figures[kind]
        assert loss["kills"] == 1 == loss["succeeded_after_kill"], loss["per_restart"]
        assert loss["phases"]["kill_to_lost_log"]["median_s"] >= 0
        assert loss["run"]["leftover_processes"] == 0


@pytest.mark.e2e
def test_ledger_quick(tmp_path):
    workloads, _ = run_quick(tmp_path, "ledger")
    figures = workloads["ledger"]["figures"]
    assert len(figures["after_release_s"]) == cli.QUICK.ledger_rounds
    assert len(figures["kill_free_s"]) == len(figures["kill_start_s"]) == cli.QUICK.ledger_kills
    assert all(v > 0 for v in figures["after_release_s"] + figures["kill_free_s"] + figures["kill_start_s"])
    assert [r["measure"] for r in workloads["ledger"]["rows"]] == [
        "second run holds the host after the first releases", "SIGKILLed holder: the ledger shows the host free",
        "SIGKILLed holder: a waiting run holds the host"]


@pytest.mark.e2e
def test_scale_quick(tmp_path):
    workloads, stdout = run_quick(tmp_path, "scale", "--transport", "both")
    runs = workloads["scale"]["figures"]["runs"]
    # Relayed by the fake agents (the default, as the product runs), then one connection per worker.
    assert [(r["transport"], r["phase"]) for r in runs] == [("relayed", "lockstep"), ("direct", "lockstep")]
    for run in runs:
        assert run["workers"] == cli.QUICK.workers[0] and run["state"] == "SUCCEEDED"
        # Every report of every fake worker was recorded by the real coordinator, in order.
        assert run["lost"] == 0 and run["reordered"] == 0 and run["all_recorded"], run
        assert run["recorded"] == run["expected"] == run["workers"] * run["reports_per_worker"]
        assert run["p99_ms"] > 0 and run["rss_peak_mib"] > 0 and run["coordinator_cores"] is not None
    # A relayed worker's report and telemetry of a tick, queued together, go up in one agent message;
    # direct, only the agents' own messages queued together share one (their workers' spawned, exited).
    assert runs[0]["items_per_message"] > runs[1]["items_per_message"] >= 1.0
    assert "Control-plane scale" in stdout and "| 64 (8) | relayed |" in stdout and "| 64 (8) | direct |" in stdout


@pytest.mark.e2e
@pytest.mark.cluster
def test_multihost_quick(tmp_path):
    from cluster import skip_reason  # tests/cluster.py

    if reason := skip_reason():
        pytest.skip(reason)
    workloads, _ = run_quick(tmp_path, "multihost")
    figures = workloads["multihost"]["figures"]
    assert "skipped" not in figures, figures.get("skipped")
    start = figures["startup"]
    for kind in ("ssh", "local"):  # 2 hosts x 2 workers over ssh, and the same job on one host
        assert len(start[kind]["fit"]["values_s"]) == 1 and start[kind]["fit"]["median_s"] > 0
    for name in ("cut", "agent_kill"):
        run = figures[name]["runs"][0]
        assert run["detect_s"] >= 0 and run["raised_s"] >= run["detect_s"], run
        assert "WorkerGroupError" in run["error_head"], run
    assert figures["leftover_processes"] == 0


@pytest.mark.e2e
def test_preempt_quick(tmp_path):
    workloads, _ = run_quick(tmp_path, "preempt")
    figures = workloads["preempt"]["figures"]
    jobs = figures["jobs"]
    assert [job["target"] for job in jobs] == ["driver", "agent"]
    for job in jobs:
        assert 0 < job["knows_s"] < job["exited_s"] and job["lost_steps"] >= 0 and job["round"] > 0
    measures = [row["measure"] for row in workloads["preempt"]["rows"]]
    assert measures[0].startswith("signal -> every rank knows") and measures[1].startswith("work lost")
    assert measures[2].startswith("signal -> committed -> exited")


@pytest.mark.cluster
def test_slurm_quick(tmp_path):
    from slurm_cluster import skip_reason  # tests/slurm_cluster.py

    if reason := skip_reason():
        pytest.skip(reason)
    workloads, stdout = run_quick(tmp_path, "slurm")
    figures = workloads["slurm"]["figures"]
    assert "skipped" not in figures, figures.get("skipped")
    run = figures["runs"][0]
    assert run["startup_s"] > 0 and run["restart_s"] > 0 and run["resumed_at_step"] >= 1, run
    assert "Slurm step of one node killed -> first step of the new attempt" in stdout
    requeue = figures["requeue"]
    assert requeue["signal_to_requeue_s"] > 0 and requeue["requeue_to_first_step_s"] > 0, requeue
    assert "requeue -> first step of the requeued job" in stdout


@pytest.mark.e2e
def test_elastic_quick(tmp_path):
    workloads, stdout = run_quick(tmp_path, "elastic")
    figures = workloads["elastic"]["figures"]
    assert figures["repeats"] == 1 == len(figures["runs"])
    run = figures["runs"][0]
    # Shrunk on the loss and grew back when the host returned, with no failure charged (max_failures=0).
    assert run["resizes"] == [[2, 1], [1, 2]] and run["final_world"] == 2 and run["failures_charged"] == 0, run
    assert "lost" in run["shrink_reason"] and "checkpoint boundary" in run["grow_reason"], run
    for key in ("kill_to_detected_s", "detected_to_running_s", "detected_to_first_step_s", "boundary_to_running_s",
                "boundary_to_first_step_s"):
        assert run[key] >= 0, (key, run)
    assert run["shrink_to_growth_s"] >= figures["interval_s"] - 0.1, run  # growth waits the interval
    measures = [row["measure"] for row in workloads["elastic"]["rows"]]
    assert measures[0].startswith("host lost") and measures[2].startswith("returning host"), measures
    assert "after the checkpoint boundary" in stdout


@pytest.mark.e2e
def test_scale_elastic_hosts_lost_quick(tmp_path):
    workloads, stdout = run_quick(tmp_path, "scale", "--recovery", "64", "--recovery-scenarios", "hosts_lost")
    recovery = workloads["scale"]["figures"]["recovery"]
    assert set(recovery) == {"hosts_lost"}
    lost = recovery["hosts_lost"]
    # 10% of the 8 fake hosts (one), its agent's stream cancelled; the elastic run shrank to the survivors,
    # its lost host was relaunched after the resize interval and the run grew back to 64 at the next
    # committed checkpoint, and it succeeded with max_failures=0: no failure charged.
    assert lost["hosts_lost"] == lost["losses_seen"] == 1 and lost["survivors"] == 56, lost
    assert [(r["from_workers"], r["to_workers"]) for r in lost["resizes"]] == [(64, 56), (56, 64)], lost
    assert lost["complete"] and lost["state"] == "SUCCEEDED" and lost["attempts"] == 3, lost
    assert 0 <= lost["detected_s"] <= lost["decided_s"] <= lost["assigned_s"] <= lost["running_s"], lost
    regain = lost["regain"]
    assert regain["relaunched"] == regain["rejoined"] == 1 and regain["grew"], regain
    assert regain["relaunch_asked_s"] >= regain["interval_s"] - 0.1, regain  # probed after the interval
    assert "checkpoint boundary" in regain["grow_reason"], regain
    assert 0 <= regain["decided_s"] <= regain["stopped_s"] <= regain["assigned_s"] <= regain["running_s"], regain
    assert regain["growth_steps"] == [64] and regain["full_running_s"] == regain["running_s"], regain
    assert "elastic at scale: 1 of 8 hosts (10%) lost among 64 workers -> resize decided" in stdout
    assert "elastic at scale: the 1 lost host(s) back among 64 workers, from the checkpoint boundary -> attempt at 64" in stdout
