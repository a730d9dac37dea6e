"""The plain-words diagnoses (minitrain.monitoring.diagnoses): start-up phase, memory and data hints."""

from minitrain.monitoring.diagnoses import data_wait_hint, hints, memory_hint, startup_status

MIB = 2 ** 20


def _samples(rank, rss, data_wait=None, step=0.5, attempt=0):
    return [{"rank": rank, "attempt": attempt, "time": 100.0 + i, "rss_bytes": value, "step_time_s": step,
             "data_wait_s": data_wait, "report_wait_s": 0.0, "collective_wait_s": None} for i, value in enumerate(rss)]


def test_memory_that_climbs_steadily_is_named_a_likely_leak():
    leaking = _samples(0, [200 * MIB + i * 4 * MIB for i in range(12)])
    flat = _samples(1, [200 * MIB + (i % 3) * MIB for i in range(12)])
    hint = memory_hint(leaking + flat)
    assert hint["ranks"] == [0] and "memory climbs steadily across epochs" in hint["message"]
    assert "likely a leak (tensors kept across steps" in hint["message"] and "rank 0: 200 MiB -> 244 MiB" in hint["message"]
    assert memory_hint(flat) is None
    assert memory_hint(_samples(0, [200 * MIB + i * 4 * MIB for i in range(5)])) is None  # too few samples
    # Growth that levels off (the cache warming up) is no leak: the last quarter is not higher.
    assert memory_hint(_samples(0, [100 * MIB] * 3 + [300 * MIB] * 9)) is None
    assert memory_hint(leaking, attempt=1) is None  # another attempt's samples are not judged


def test_a_rank_waiting_on_data_for_much_of_its_step_gets_the_pipeline_hint():
    slow = _samples(0, [MIB] * 5, data_wait=0.3)
    fast = _samples(1, [MIB] * 5, data_wait=0.01)
    hint = data_wait_hint(slow + fast)
    assert hint["ranks"] == [0] and "60% of each step" in hint["message"]
    assert "the data pipeline is not keeping up" in hint["message"]
    assert data_wait_hint(fast) is None and data_wait_hint(_samples(0, [MIB] * 5)) is None  # no data iterator
    assert [h["kind"] for h in hints(slow + _samples(1, [MIB * 100 + i * 8 * MIB for i in range(12)]))] == ["memory",
                                                                                                          "data"]


def test_start_up_status_until_the_first_step_only():
    run = {"state": "STARTING", "started_at": 0.0, "state_since": 1.0, "rounds": 0, "ended_at": None}
    status = startup_status(run, [{"phase": "STARTUP"}, {"phase": None}], 5.0)
    assert status == {"phase": "spawning workers (starting Python, importing torch and your script)",
                      "ranks_in_phase": "1/2", "elapsed_s": 5.0, "phase_elapsed_s": 4.0}
    assert startup_status(dict(run, state="PENDING"), [], 5.0)["phase"] == "preparing the run"
    assert startup_status(dict(run, rounds=1), [], 5.0) is None
    assert startup_status(dict(run, ended_at=4.0), [], 5.0) is None
