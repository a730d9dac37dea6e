"""The controller loop at a size no real test can run here: the real coordinator (in this process: gRPC
server, controller, commits, metrics log, run directory) against the scale benchmark's fake agents and
workers (`bench.scale.clients`, separate processes speaking the real protocol, no torch), with faults
injected into chosen ranks. The workers' streams are relayed by their fake agents, as the product runs
them; the restart test also runs with a direct connection per worker. What `decide` promises in its scripted unit tests (tests/unit/test_decide.py)
is checked here on the wire: a failed rank restarts the whole group once and the next attempt completes
every round; a frozen rank is found hung by the default adaptive deadline, named as the root cause, and
its waiting peers are marked consequences; a spent budget fails the run with the injected cause.
"""

from __future__ import annotations

import collections
import os
import re

import pytest
from procs_support import living_descendants

from bench.scale.coordinator import rank0_metrics, simulate
from minitrain.coordinator.observers import RunObserver
from minitrain.monitoring.monitor import RunMonitor
from minitrain.records import FailureKind
from minitrain.run_state import RunState, ray_status

WORKERS, SLOTS, REPORTS, RATE_HZ = 32, 8, 6, 5.0  # 4 fake nodes of 8 ranks; 6 reports at 5 Hz (about 1.2 s)


class Rounds(RunObserver):
    """A RunObserver: every (attempt, rank) -> the rounds it reported, in arrival order; and the other
    calls the controller made, in order. Told after `monitor` (a RunMonitor fed the same calls), it
    records the state the monitor shows at each move."""

    def __init__(self, monitor: RunMonitor):
        self.seen = collections.defaultdict(list)
        self.calls = []  # (method, its argument) in call order, reports left out
        self.monitor = monitor
        self.shown = []  # the monitor's state at each move

    def on_state(self, previous, next_state, reason, attempt) -> None:
        self.calls.append(("state", (previous, next_state, attempt)))
        self.shown.append(self.monitor.run()["state"])

    def on_report(self, report) -> None:
        self.seen[(report.attempt, report.rank)].append(report.round)

    def on_run_start(self, run) -> None:
        self.calls.append(("run_start", run))

    def on_attempt_start(self, attempt) -> None:
        self.calls.append(("attempt_start", attempt))

    def on_round(self, round_) -> None:
        self.calls.append(("round", round_))

    def on_attempt_end(self, end) -> None:
        self.calls.append(("attempt_end", end))

    def on_run_end(self, outcome) -> None:
        self.calls.append(("run_end", outcome))

    def complete(self, attempt: int) -> bool:
        """Every rank of `attempt` reported rounds 0..REPORTS-1 once each, in order."""
        return all(self.seen[(attempt, rank)] == list(range(REPORTS)) for rank in range(WORKERS))


def _simulate(tmp_path, faults, transport="relayed", **policy):
    """`transport`: the workers' streams relayed by their fake agents (as the product runs), or direct."""
    spec = {"workers": WORKERS, "slots": SLOTS, "reports": REPORTS, "rate_hz": RATE_HZ, "warmup_rounds": 0,
            "client_procs": 2, "out_dir": str(tmp_path), "ack_every": 2, "faults": faults, "stop_grace_s": 1.0,
            "transport": transport, **policy}
    monitor = RunMonitor()
    rounds = Rounds(monitor)
    # Only what this run started counts: a session fixture's daemons (the Slurm or SSH test clusters, shared
    # by the tests of this xdist worker) are this process's descendants too.
    before = {process.pid for process in living_descendants(os.getpid())}
    outcome, tap, checkpoints, _ = simulate(spec, observers=[monitor, rounds])
    left = [process for process in living_descendants(os.getpid()) if process.pid not in before]
    assert not left, f"a fake client outlived the run: {left}"
    return outcome, rounds, checkpoints


@pytest.mark.parametrize("transport", ["relayed", "direct"])
def test_a_failed_rank_restarts_the_whole_group_and_the_next_attempt_completes(tmp_path, transport):
    outcome, rounds, checkpoints = _simulate(
        tmp_path, [{"attempt": 0, "rank": 13, "after": 2, "kind": "exception"}], transport, max_failures=1)
    assert (outcome.state, outcome.attempt) == (RunState.SUCCEEDED, 1), outcome.error_message
    assert rounds.seen[(0, 13)] == [0, 1]  # it failed after two reports
    assert rounds.complete(1)
    # Rank 0's history (metrics.jsonl) and the committed rounds are the last attempt's, each round once, in order.
    assert [m["step"] for m in rank0_metrics({"out_dir": str(tmp_path)})][-REPORTS:] == list(range(REPORTS))
    assert checkpoints.report_index >= REPORTS
    # The observers saw the run in order: start, attempt 0 and its end (restarting, rank 13 the root
    # cause with its pickled exception), attempt 1 with every round of every rank, its end, the outcome.
    # Every move of the run's state, in order, as RunState values; the monitor showed each as it came.
    moves = [arg for kind, arg in rounds.calls if kind == "state"]
    S = RunState
    first = [(S.STARTING, S.RUNNING, 0), (S.RUNNING, S.RESTARTING, 0)]
    if (S.STARTING, S.RESTARTING, 0) in moves:  # rank 13 failed before every rank was training
        first = [(S.STARTING, S.RESTARTING, 0)]
    assert moves == [(S.PENDING, S.LAUNCHING, 0), (S.LAUNCHING, S.STARTING, 0), *first,
                     (S.RESTARTING, S.STARTING, 1), (S.STARTING, S.RUNNING, 1),
                     (S.RUNNING, S.STOPPING, 1), (S.STOPPING, S.SUCCEEDED, 1)]
    assert rounds.shown == [ray_status(next_state) for _, next_state, _ in moves]
    kinds = [kind for kind, _ in rounds.calls if kind != "state"]
    assert kinds[:2] == ["run_start", "attempt_start"] and kinds[-2:] == ["attempt_end", "run_end"]
    order = [(kind, arg[1] if kind == "state" else getattr(arg, "attempt", None)) for kind, arg in rounds.calls
             if kind != "round"]
    # on_state(STARTING) comes before its attempt's start; a restart's after the old attempt's end.
    ended = order.index(("attempt_end", 0))
    assert order.index(("state", S.STARTING)) < order.index(("attempt_start", 0)) < ended
    assert ended < order.index(("state", S.STARTING), ended) < order.index(("attempt_start", 1))
    assert order.index(("state", S.SUCCEEDED)) < order.index(("attempt_end", 1))
    starts = [arg for kind, arg in rounds.calls if kind == "attempt_start"]
    ends = [arg for kind, arg in rounds.calls if kind == "attempt_end"]
    assert [a.attempt for a in starts] == [0, 1] and all(a.world_size == WORKERS for a in starts)
    assert [(e.attempt, e.restarting) for e in ends] == [(0, True), (1, False)]
    assert ends[0].failures and "rank 13 " in ends[0].root_cause and not ends[1].failures
    last_rounds = [arg for kind, arg in rounds.calls if kind == "round" and arg.attempt == 1]
    assert [r.index for r in last_rounds] == sorted(r.index for r in last_rounds)
    assert len(last_rounds) == REPORTS and all(len(r.metrics_by_rank) == WORKERS for r in last_rounds)
    assert all(m is not None and m["step"] == i for i, r in enumerate(last_rounds) for m in r.metrics_by_rank)
    assert rounds.calls[-1][1] is outcome


def test_a_spent_budget_fails_the_run_naming_the_injected_rank(tmp_path):
    outcome, _, _ = _simulate(
        tmp_path, [{"attempt": 0, "rank": 5, "after": 1, "kind": "exception"},
                   {"attempt": 1, "rank": 30, "after": 3, "kind": "exception"}], max_failures=1)
    assert (outcome.state, outcome.attempt) == (RunState.FAILED, 1)
    assert "Root cause: rank 30 " in outcome.error_message and "injected fault on rank 30" in outcome.error_message


def test_a_silent_host_is_found_by_its_lease_and_named_as_lost(tmp_path):
    """A host whose agent sends nothing more (no heartbeat, none of its workers' messages) while its
    connection stays open: only the lease finds it, and the run names that node."""
    outcome, rounds, _ = _simulate(tmp_path, [{"attempt": 0, "rank": 17, "after": 2, "kind": "silent"}])
    assert outcome.state == RunState.FAILED, outcome.error_message
    assert "node0002 was lost" in outcome.error_message and "it sent nothing for" in outcome.error_message
    # Nothing of it after the silence (what its agent still had queued then is dropped with it).
    assert rounds.seen[(0, 17)] in ([], [0], [0, 1])


def test_a_frozen_rank_is_found_by_the_default_deadline_and_its_waiting_peers_are_consequences(tmp_path):
    """The default "auto" rule, its floor lowered from 600 s so that the test is quick: rank 21's pace
    (5 reports/s) gives it a deadline of max(2 s, 10 x 0.2 s).

    Relayed streams in lockstep, as the product runs: batched arrival makes the ranks' deadlines
    differ by milliseconds, and peers that wait for rank 21 may fall due just before it; rank 21 must
    still be declared (it goes past its deadline while the stacks are collected) and named."""
    outcome, rounds, _ = _simulate(tmp_path, [{"attempt": 0, "rank": 21, "after": 3, "kind": "freeze"}],
                                   worker_hang_floor_s=2.0)
    assert outcome.state is RunState.FAILED
    hung = {f.rank: f for f in outcome.failures if f.kind is FailureKind.HANG}
    assert 21 in hung and not hung[21].consequence, outcome.error_message
    assert "Root cause: rank 21 " in outcome.error_message
    message = hung[21].message
    assert "worker_hang_timeout_s='auto'" in message and "its last report was round 2;" in message
    # Its peers answered their stack dumps from inside all_reduce: they merely wait for it.
    waiting = re.search(r"rank\(s\) ([\d, ]+) wait for it in a collective", message)
    assert waiting and "21" not in waiting.group(1).split(", ") and len(waiting.group(1).split(", ")) >= 8
    assert all(f.consequence for rank, f in hung.items() if rank != 21)
