"""A run in the shape of the run monitor's read API (minitrain.monitoring.monitor.RunMonitor), with
fixed values: the dashboard's unit tests check what it serves against these, value by value."""

import signal
import subprocess
import time


def stop_dashboard_cli(cli: subprocess.Popen, timeout_s: float) -> int:
    """Ctrl-C the `python -m minitrain.dashboard` process and return its exit code. One that has not exited
    within `timeout_s` is killed before the AssertionError, so that a failed test leaves no server behind
    (a SIGINT that the process ignores, e.g. inherited as SIG_IGN from a shell without job control, would
    otherwise keep it running after the test and its session)."""
    cli.send_signal(signal.SIGINT)
    try:
        return cli.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        cli.kill()
        cli.wait()
        raise AssertionError(f"the dashboard CLI did not exit within {timeout_s:g} s of a SIGINT "
                             f"(SIGINT inherited as ignored? killed)") from None


class FixedRun:
    """Two ranks on host h0, attempt 0 failed (rank 1, RuntimeError), attempt 1 running; rank 1 is a
    straggler (8x); two checkpoints, the first deleted; four rank-0 reports."""

    def __init__(self, now=None):
        now = now or time.time()
        self.now = now
        self._run = {"run_id": "abc123", "name": "demo<run>", "run_path": "/tmp/x/demo", "state": "RUNNING",
                     "started_at": now - 60, "ended_at": None, "attempt": 1, "num_workers": 2, "total": 100,
                     "progress": 0.5, "eta_s": 60.0, "steps_per_s": 2.0}
        self._attempts = [{"attempt": 0, "started_at": now - 60, "ended_at": now - 40, "hosts": ["h0", "h0"],
                           "failures": [{"rank": 1, "host": "h0", "kind": "exception", "exc_type": "RuntimeError",
                                         "message": "boom", "consequence": False}],
                           "root_cause": "rank 1 failed: RuntimeError: boom", "restarting": True},
                          {"attempt": 1, "started_at": now - 39, "ended_at": None, "hosts": ["h0", "h0"],
                           "failures": [], "root_cause": "", "restarting": False}]
        self._checkpoints = [{"dir": "checkpoint_000001", "index": 1, "attempt": 0, "metrics": {"loss": 0.5},
                              "committed_at": now - 45, "kept": False},
                             {"dir": "checkpoint_000003", "index": 3, "attempt": 1, "metrics": {"loss": 0.25},
                              "committed_at": now - 5, "kept": True}]
        self._reports = [{"index": i, "attempt": 0 if i < 2 else 1, "time": now - 50 + i,
                          "metrics": {"loss": 1.0 / (i + 1), "epoch": i, "note": "x", "ok": True}} for i in range(4)]
        self._ranks = [{"rank": r, "host": "h0", "pid": 100 + r, "phase": "training", "step_time_s": 0.1 * (r + 1) ** 3,
                        "report_wait_s": 0.01, "collective_wait_s": None, "data_wait_s": 0.0, "cpu_percent": 95.0,
                        "rss_bytes": 200 * 2**20, "gpus": [], "reports": 4, "last_report_age_s": 0.5,
                        "straggler": r == 1} for r in range(2)]
        for rank in self._ranks:  # the rank's own work per step: its waits for the others excluded
            rank["work_time_s"] = rank["step_time_s"] - rank["report_wait_s"]
        self._samples = [{**self._ranks[r], "time": now - 10 + t, "attempt": 1} for t in range(5) for r in range(2)]
        self._stragglers = [{"rank": 1, "host": "h0", "slower_by": 8.0, "step_time_s": 0.8,
                             "median_step_time_s": 0.1, "cause": "compute", "since": now - 8}]
    def run(self): return dict(self._run)
    def attempts(self): return [dict(a) for a in self._attempts]
    def checkpoints(self): return [dict(c) for c in self._checkpoints]
    def reports(self): return [dict(r) for r in self._reports]
    def ranks(self): return [dict(r) for r in self._ranks]
    def samples(self, rank=None, since=None):
        return [dict(s) for s in self._samples if (rank is None or s["rank"] == rank) and (since is None or s["time"] > since)]
    def stragglers(self): return [dict(s) for s in self._stragglers]
    def straggler_history(self): return [dict(s, attempt=1, until=None) for s in self._stragglers]
    def hints(self): return []
    def resizes(self): return []
    def nodes(self): return [{"host": "h0", "memory_bytes": 16 << 30}]
