"""The plain-words diagnoses (minitrain.monitoring.diagnoses): start-up phase, memory and data hints."""

import random

from minitrain.monitoring import diagnoses
from minitrain.monitoring.diagnoses import data_wait_hint, hints, memory_hint, startup_status

MIB = 2 ** 20


def _samples(rank, rss, data_wait=None, step=0.5, attempt=0):
    """One sample a second from t=100, the first before the rank's first report (start-up)."""
    return [{"rank": rank, "attempt": attempt, "time": 100.0 + i, "reports": i, "rss_bytes": value, "step_time_s": step,
             "data_wait_s": data_wait, "report_wait_s": 0.0, "collective_wait_s": None} for i, value in enumerate(rss)]


def _start_up(i):
    """Start-up growth as measured on a 3-rank DDP job: +35 MiB at the first step, then a few MiB more over
    the next half minute (the allocator settling), then flat."""
    return 290 * MIB + (35 * MIB if i >= 1 else 0) + min(i, 30) * MIB // 6


def _ranks(*curves, seconds=150):
    return [s for rank, curve in enumerate(curves) for s in _samples(rank, [curve(i) for i in range(seconds)])]


def _prefixes(samples):
    """The hint as the run goes on: judged on the samples of its first 8, 9, ... seconds."""
    return [memory_hint([s for s in samples if s["time"] < 100 + n]) for n in range(8, 151)]


def test_start_up_growth_on_every_rank_is_no_leak():
    # Judged at every moment: early on (the old rule named every rank here) and once the run has settled.
    assert _prefixes(_ranks(_start_up, _start_up, _start_up)) == [None] * 143
    # The same with a longer start-up (+100 MiB over its first 90 s, then flat): the growth that outlasts the
    # warm-up is every rank's, never clearly above the others', and no rank is named while it lasts either.
    slow = _ranks(*[lambda i: 300 * MIB + min(i, 90) * 100 * MIB // 90] * 3, seconds=240)
    assert all(memory_hint([s for s in slow if s["time"] < 100 + n]) is None for n in range(8, 241))


def test_a_leak_on_one_rank_names_that_rank_only():
    leak = lambda i: _start_up(i) + (i // 10) * 20 * MIB  # a tensor kept every 10 steps (20 MiB each)
    hints = _prefixes(_ranks(leak, _start_up, _start_up))
    named = [h["ranks"] for h in hints if h is not None]
    assert named and all(ranks == [0] for ranks in named), named  # never rank 1 or 2, at any moment
    assert hints[-1] is not None  # and named once it has climbed after the warm-up
    first = next(n for n, h in zip(range(8, 151), hints) if h)
    assert first >= diagnoses.MEMORY_WARMUP_S + diagnoses.MEMORY_MIN_SAMPLES  # not before the warm-up ended
    message = hints[-1]["message"]
    assert message.startswith("memory climbs steadily across epochs on rank(s) 0 (rank 0: ")
    assert "after its first 60 s of steps" in message and "the other ranks: +0.0 MiB/min" in message
    assert "likely a leak (tensors kept across steps" in message
    # The leak on a rank that is also the one whose start-up grew more is still that rank alone.
    assert memory_hint(_ranks(lambda i: leak(i) + 50 * MIB, _start_up))["ranks"] == [0]
    assert memory_hint(_ranks(leak, _start_up), attempt=1) is None  # another attempt's samples are not judged


def test_noise_is_no_leak():
    rng = random.Random(7)
    noisy = [lambda i, r=rng: _start_up(i) + r.randint(-40, 40) * MIB for _ in range(3)]
    assert _prefixes(_ranks(*noisy)) == [None] * 143
    # A one-off rise that levels off (a cache filling once, long after start-up) is no leak either.
    step = lambda i: _start_up(i) + (200 * MIB if i >= 100 else 0)
    assert _prefixes(_ranks(step, _start_up)) == [None] * 143


def test_a_leak_every_rank_shares_is_named_once_it_lasts():
    leak = lambda i: _start_up(i) + i * 2 * MIB
    hints = _prefixes(_ranks(leak, leak, leak))
    first = next(n for n, h in zip(range(8, 151), hints) if h)
    assert first >= diagnoses.MEMORY_WARMUP_S + diagnoses.MEMORY_SHARED_MIN_SAMPLES
    assert hints[-1]["ranks"] == [0, 1, 2] and "every rank climbs" in hints[-1]["message"]
    alone = _samples(0, [leak(i) for i in range(150)])  # one rank in all: nothing to compare with
    assert memory_hint(alone)["ranks"] == [0] and "the other ranks" not in memory_hint(alone)["message"]
    assert memory_hint(alone[:100]) is None  # too short a climb to tell from start-up, with no flat rank


def test_the_warm_up_counts_from_the_first_step_the_caller_knows():
    # A bounded history that no longer reaches back to the first step: the monitor says when it was.
    leak = lambda i: _start_up(i) + i * 2 * MIB
    late = [s for s in _ranks(leak, _start_up) if s["time"] >= 180]  # the first 80 s dropped
    assert memory_hint(late) is None  # counted from the first sample kept: still in its warm-up
    assert memory_hint(late, first_step_at={0: 101.0, 1: 101.0})["ranks"] == [0]
    assert diagnoses.first_steps(_ranks(leak, _start_up)) == {0: 101.0, 1: 101.0}


def test_a_rank_waiting_on_data_for_much_of_its_step_gets_the_pipeline_hint():
    slow = _samples(0, [MIB] * 5, data_wait=0.3)
    fast = _samples(1, [MIB] * 5, data_wait=0.01)
    hint = data_wait_hint(slow + fast)
    assert hint["ranks"] == [0] and "60% of each step" in hint["message"]
    assert "the data pipeline is not keeping up" in hint["message"]
    assert data_wait_hint(fast) is None and data_wait_hint(_samples(0, [MIB] * 5)) is None  # no data iterator
    leaking = _samples(2, [MIB * 100 + i * 8 * MIB for i in range(100)])
    assert [h["kind"] for h in hints(slow + leaking + _samples(1, [MIB * 100] * 100))] == ["memory", "data"]


def test_start_up_status_until_the_first_step_only():
    run = {"state": "STARTING", "started_at": 0.0, "state_since": 1.0, "rounds": 0, "ended_at": None}
    status = startup_status(run, [{"phase": "STARTUP"}, {"phase": None}], 5.0)
    assert status == {"phase": "spawning workers (starting Python, importing torch and your script)",
                      "ranks_in_phase": "1/2", "elapsed_s": 5.0, "phase_elapsed_s": 4.0}
    assert startup_status(dict(run, state="PENDING"), [], 5.0)["phase"] == "preparing the run"
    assert startup_status(dict(run, rounds=1), [], 5.0) is None
    assert startup_status(dict(run, ended_at=4.0), [], 5.0) is None
