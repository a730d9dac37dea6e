"""The pure pieces of `python -m bench` (statistics, the table, the restart analysis, the command
line), without processes. tests/e2e/test_bench_quick.py (soak tier) runs every workload once in quick mode.
"""

from __future__ import annotations

import pytest

from bench import cli
from bench.common import BenchError, percentile, summary
from bench.memory_tier import per_rank_mib, summarise_restarts, tier_rows
from bench.restart_analysis import analyse_restarts, parse_log, phases_of_minitrain
from bench.table import Row, markdown, plain, ratio


# ---------------------------------------------------------------------- pure pieces


def test_percentile_and_summary():
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile(list(range(1, 101)), 99) == 99
    assert percentile([5.0], 99) == 5.0
    assert summary([])["median_s"] is None
    assert summary([1.0, 3.0])["median_s"] == 2.0


def test_table_renders_every_row_and_target():
    rows = [Row("job", "wall time", "1.00 s", "torchrun 2.00 s", ratio(1.0, 2.0), "<= 1.2x", True),
            Row("memory", "agent", "40 MiB", met=False), Row("report", "p99", "12 us")]
    text = markdown(rows)
    assert text.splitlines()[0] == "| workload | measure | minitrain | peer | ratio | target | met |"
    assert "| job | wall time | 1.00 s | torchrun 2.00 s | 0.50x | <= 1.2x | yes |" in text
    assert "| **no** |" in text and text.count("\n") == 4
    assert plain(rows).splitlines()[2].startswith("job ")
    assert ratio(None, 1.0) == "-" and ratio(1.0, 0.0) == "-"


def test_restart_analysis_pairs_kills_with_the_next_first_step():
    records = [{"kind": "start", "rank": 0, "attempt": 0, "time": 10.0},
               {"kind": "kill", "rank": 1, "attempt": 0, "time": 15.0},
               {"kind": "start", "rank": 0, "attempt": 1, "time": 15.8},
               {"kind": "start", "rank": 1, "attempt": 1, "time": 15.9},
               {"kind": "kill", "rank": 1, "attempt": 1, "time": 20.0}]
    figures = analyse_restarts(records, [0, 1])
    assert figures["kills"] == 2 and figures["succeeded_after_kill"] == 1 and figures["failed"] == 1
    assert figures["latencies_s"] == pytest.approx([0.8])
    assert figures["per_restart"][-1] == {"attempt": 2, "cause": "kill", "ok": False, "never_started": True}
    assert figures["first_line"]["n"] == 0  # these start records do not say when the function was entered


def test_restart_analysis_measures_to_the_first_line_and_splits_the_start_up():
    records = [{"kind": "kill", "rank": 1, "attempt": 0, "time": 10.0, "fork_servers": [{"ready": False,
                                                                                        "quick_server": True}]},
               {"kind": "start", "rank": 0, "attempt": 1, "time": 12.5, "entered": 10.4, "prepared": 12.4,
                "created": 10.2}]
    figures = analyse_restarts(records, [0, 1])
    assert figures["first_line"]["values_s"] == pytest.approx([0.4]) and figures["latencies_s"] == pytest.approx([2.5])
    assert figures["per_restart"][0]["fork_servers_at_kill"] == "0/1 ready, 1 quick"
    marks = parse_log([{"time": 10.05, "msg": "attempt 0: rank 1 on vm (pid 7) during training: killed by signal "
                                              "SIGKILL (9); stopping every rank of the attempt"},
                       {"time": 10.1, "msg": "attempt 0 failed (x); restarting as attempt 1"},
                       {"time": 10.12, "msg": "attempt 1: starting 2 worker(s) on 1 node(s)"}])
    phases = phases_of_minitrain(figures, marks, "worker")
    assert phases["kill_to_detected_log"]["values_s"] == pytest.approx([0.05])
    assert phases["starting_log_to_process"]["values_s"] == pytest.approx([0.08])
    assert phases["process_to_train_fn"]["values_s"] == pytest.approx([0.2])
    assert phases["train_fn_to_prepared"]["values_s"] == pytest.approx([2.0])


def test_restart_analysis_reads_the_drivers_log_marks():
    marks = parse_log([{"time": 1.0, "msg": "attempt 0: starting 2 worker(s) on 1 node(s)"},
                       {"time": 2.0, "msg": "node localhost lost: its session ended"},
                       {"time": 2.5, "msg": "attempt 0 failed (x); restarting as attempt 1"}])
    assert [m[0] for m in marks["starting"]] == [1.0] and marks["lost"][0][1] == "localhost"
    assert [m[1] for m in marks["failed"]] == ["0"]


def test_command_line_sizes_and_selection():
    args = cli.parser().parse_args(["--quick", "--only", "restart,report", "--restarts", "7"])
    sizes = cli._sizes(args)
    assert args.only == ("restart", "report") and sizes["restarts"] == 7 and sizes["calls"] == cli.QUICK.calls
    assert sizes["early_crashes"] == cli.QUICK.early_crashes == 1
    assert cli._sizes(cli.parser().parse_args(["--early-crashes", "3"]))["early_crashes"] == 3
    assert cli._sizes(cli.parser().parse_args([]))["workers"] == (64, 256, 1024, 4096)
    assert cli.parser().parse_args(["scale", "--workers", "64,256"]).workers == (64, 256)
    assert not set(cli.OPTIONAL) & set(cli.DEFAULT) and set(cli.DEFAULT) | {"multihost", "slurm", "kubernetes"} == set(cli.RUNNERS)
    for bad in (["--only", "nope"], ["--workers", "100"], ["--workers", "x"]):
        with pytest.raises(SystemExit):
            cli.parser().parse_args(bad)


def test_memory_tier_sizes_are_totals_over_both_ranks():
    assert "memory_tier" in cli.DEFAULT and "memory_tier" in cli.RUNNERS
    quick = cli.parser().parse_args(["--quick", "--only", "memory_tier"])
    assert cli.tier_total_mib(cli._sizes(quick), quick) == 32 and per_rank_mib(32) == 16
    full = cli.parser().parse_args([])
    assert cli.tier_total_mib(cli._sizes(full), full) == 2048 and per_rank_mib(2048) == 1024
    given = cli.parser().parse_args(["--size-mib", "512"])  # the total, as for `checkpoint`
    assert cli.tier_total_mib(cli._sizes(given), given) == 512 and per_rank_mib(512) == 256
    with pytest.raises(ValueError, match="--size-mib for memory_tier must be a positive multiple of 8"):
        per_rank_mib(12)


def _tier_figures(tier_load_s: float) -> dict:
    report = {key: {"report_s": r, "floor_s": 1.0, "ratio": r} for key, r in
              (("tier_sync", 1.1), ("tier_async", 1.3), ("no_tier_sync", 9.0))}
    persist = {"s3": {"n": 3, "mib_s": 90.0, "peer_mib_s": 200.0, "ratio": 0.45},
               "local": {"n": 3, "mib_s": 950.0, "peer_mib_s": 1000.0, "ratio": 0.95}}
    restart = {"tier": {"restarts": [{}] * 3, "load_s": tier_load_s, "floor_s": 0.2, "ratio": tier_load_s / 0.2},
               "s3": {"restarts": [{}] * 3, "load_s": 2.0, "floor_s": 0.2, "ratio": 10.0}}
    return {"per_rank_mib": 1024, "repeats": 3, "report": report, "restart": restart, "persist": persist}


def test_memory_tier_rows_say_which_targets_were_met():
    rows = tier_rows(_tier_figures(tier_load_s=0.22))
    assert [r.workload for r in rows] == ["memory_tier"] * 7
    assert [r.met for r in rows] == [True, False, None, True, None, False, True]
    assert [r.target for r in rows] == ["<= 1.2x", "<= 1.2x", "-", "<= 1.2x", "-", ">= 0.9x", ">= 0.9x"]
    assert "2 ranks x 1024 MiB" in rows[0].measure and rows[3].ratio == "1.10x"
    assert "9.1x the tier's" in rows[4].measure and rows[5].minitrain == "90 MiB/s"
    assert tier_rows(_tier_figures(tier_load_s=0.3))[3].met is False


def test_memory_tier_refuses_a_restart_that_did_not_read_from_where_it_should():
    loaded = {"attempt": 1, "bytes": 8, "floor_bytes": 8, "load_s": 0.2, "floor_s": 0.1}
    view = dict(loaded, path="/dev/shm/minitrain-tier-x1/views/attempt_0/ckpt_0_sync")
    assert summarise_restarts([view], 8, from_tier=True)["ratio"] == pytest.approx(2.0)
    with pytest.raises(BenchError, match="not from storage"):
        summarise_restarts([view], 8, from_tier=False)
    with pytest.raises(BenchError, match="not from the memory tier"):
        summarise_restarts([dict(loaded, path="bench-1/no_tier_s3/bench/ckpt_0_sync")], 8, from_tier=True)
    with pytest.raises(BenchError, match="read 8 bytes"):
        summarise_restarts([view], 16, from_tier=True)


def test_a_tmp_dir_that_does_not_exist_is_refused_before_anything_runs(tmp_path, capsys):
    missing = tmp_path / "nope"
    with pytest.raises(SystemExit) as refused:
        cli.main(["--only", "report", "--tmp-dir", str(missing)])
    assert refused.value.code == 2
    assert f"--tmp-dir '{missing}' is not a directory: give one that exists" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------- each workload, quick


