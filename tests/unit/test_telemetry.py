"""Per-rank telemetry in the worker: what minitrain.waits counts, how a sample is built from it, the
GPU probe with and without NVML, and the sample's trip through the worker's and the coordinator's
conversions."""

from __future__ import annotations

import dataclasses
import time
from types import SimpleNamespace

import pytest

from minitrain import waits
from minitrain.data.iterator import DataIterator
from minitrain.records import GpuSample, TelemetrySample
from minitrain.rpc import convert
from minitrain.rpc._gen import minitrain_pb2 as pb
from minitrain.worker import telemetry


@pytest.fixture(autouse=True)
def _fresh_recorder(monkeypatch):
    monkeypatch.setattr(waits, "ENABLED", True)
    waits.reset()
    yield
    waits.reset()


def test_the_switch_reads_the_environment():
    assert waits.telemetry_enabled({}) and waits.telemetry_enabled({"MINITRAIN_TELEMETRY": "1"})
    for off in ("0", "false", "No", " off "):
        assert not waits.telemetry_enabled({"MINITRAIN_TELEMETRY": off})


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    """minitrain.waits' recorder on a clock the test moves."""
    fake = FakeClock()
    monkeypatch.setattr(waits, "_recorder", waits._Recorder(fake))
    return fake


def test_steps_and_waits_are_counted_and_nothing_when_off(monkeypatch, clock):
    with waits.reporting():
        clock.now += 0.25
    with waits.blocked(waits.COLLECTIVE):
        clock.now += 0.01
    totals = waits.totals()
    assert totals.reports == 1 and totals.last_report_at == 100.25
    assert totals.report_s == pytest.approx(0.25) and totals.collective_s == pytest.approx(0.01)
    assert totals.at_last_report == waits.Waits(report_s=pytest.approx(0.25), collective_s=0.0, data_s=None)
    assert totals.data_s is None  # no data iterator used: not measured, not zero
    with pytest.raises(KeyError):
        with waits.reporting():  # a report() that raises: its time was waited, but no step ended
            clock.now += 1.0
            raise KeyError("x")
    assert waits.totals().reports == 1 and waits.totals().report_s == pytest.approx(1.25)
    totals = waits.totals()
    monkeypatch.setattr(waits, "ENABLED", False)
    with waits.reporting():
        clock.now += 1
    waits.add(waits.DATA, 5.0)
    assert waits.totals() == dataclasses.replace(totals, at=clock.now)


def test_a_wait_counts_while_it_lasts_also_on_several_threads(clock):
    with waits.blocked(waits.COLLECTIVE):
        clock.now += 1.5
        assert waits.totals().collective_s == pytest.approx(1.5)  # still blocked: already counted
        with waits.blocked(waits.COLLECTIVE):  # a second thread blocked meanwhile counts as well
            clock.now += 1.0
            assert waits.totals().collective_s == pytest.approx(2.5 + 1.0)
        clock.now += 0.5
    assert waits.totals().collective_s == pytest.approx(3.0 + 1.0)
    clock.now += 7.0
    assert waits.totals().collective_s == pytest.approx(4.0)  # nothing open: nothing grows


def test_a_dataset_shard_counts_the_time_inside_next_as_data_wait():
    class SlowTable:
        """A dataset whose rows take 20 ms each to resolve (the wait a loader would cause)."""

        def _resolve(self):
            time.sleep(0.02)
            return SimpleNamespace(num_rows=3, row=lambda i: i), False, None

    rows = list(DataIterator(SlowTable()).iter_rows())
    assert rows == [0, 1, 2]
    assert waits.totals().data_s >= 0.02


def test_a_sample_has_step_time_and_waits_per_step(clock):
    sampler = telemetry.Sampler(telemetry.GpuProbe([]), clock=clock)
    first = sampler.sample()
    assert first.step_time_s is None and first.data_wait_s is None
    # Four steps of 0.5 s ending at 100.5 .. 102.0, each 0.1 s in report() and 0.3 s waiting for data.
    for _ in range(4):
        with waits.blocked(waits.DATA):
            clock.now += 0.3
        clock.now += 0.1
        with waits.reporting():
            clock.now += 0.1
    sample = sampler.sample()
    assert sample.reports == 4
    assert sample.step_time_s == pytest.approx(0.5)  # the first step measured from the window start
    assert sample.report_wait_s == pytest.approx(0.1) and sample.data_wait_s == pytest.approx(0.3)
    assert sample.collective_wait_s == 0.0
    assert sample.cpu_percent is not None and sample.rss_bytes > 0  # psutil, this process
    assert sample.gpus == ()
    # No step ended for 3 s: the open step is already longer than the last one, so it shows.
    clock.now = 105.0
    sample = sampler.sample()
    assert sample.step_time_s == pytest.approx(3.0) and sample.report_wait_s == 0.0
    # A step of 0.25 s, then a pause shorter than it: the last steps' figures again.
    clock.now = 105.2
    with waits.reporting():
        clock.now += 0.05
    sampler.sample()
    clock.now += 0.2
    with waits.reporting():
        clock.now += 0.05
    assert sampler.sample().step_time_s == pytest.approx(0.25)
    clock.now += 0.1
    sample = sampler.sample()
    assert sample.step_time_s == pytest.approx(0.25) and sample.report_wait_s == pytest.approx(0.05)


def test_a_rank_blocked_at_a_checkpoint_round_shows_the_wait_in_every_sample(clock):
    """The reviewer's case: a fast rank (0.05 s of work a step) waits 3 s in a checkpoint report() for
    the round's commit (i.e. for a slow peer). Before, its samples showed a step time of 1.8 s, 2.8 s
    with a report wait of 0 (the wait was counted only when report() returned): work of 1.8 s."""
    sampler = telemetry.Sampler(telemetry.GpuProbe([]), clock=clock)

    def step(report_s=0.0):
        clock.now += 0.05  # the work
        with waits.reporting():
            clock.now += report_s

    for _ in range(4):
        step()
    clock.now = 101.0
    sample = sampler.sample()
    assert sample.step_time_s == pytest.approx(0.05) and sample.report_wait_s == pytest.approx(0.0)
    # The checkpoint round: work from 100.2, then report() from 100.25 until 103.25.
    clock.now = 100.25
    with waits.reporting():
        for now, step_time, wait in ((102.0, 1.8, 1.75), (103.0, 2.8, 2.75)):
            clock.now = now
            sample = sampler.sample()
            assert sample.step_time_s == pytest.approx(step_time)
            assert sample.report_wait_s == pytest.approx(wait)  # counted while it lasts
        clock.now = 103.25
    step()  # ends at 103.3
    clock.now = 104.0
    sample = sampler.sample()
    # Two steps ended in this window (100.2 -> 103.25 -> 103.3): the wait that straddled three sample
    # boundaries is all there, in the step it belongs to, neither lost nor counted twice.
    assert sample.step_time_s == pytest.approx(3.1 / 2)
    assert sample.report_wait_s == pytest.approx(3.0 / 2)
    assert sample.step_time_s - sample.report_wait_s == pytest.approx(0.05)


def test_without_gpus_or_without_nvml_there_are_no_gpu_samples():
    assert telemetry.GpuProbe([]).read() == []
    # The real pynvml on a machine without an NVIDIA driver: nvmlInit fails, no error escapes.
    assert telemetry.GpuProbe([0]).read() == []

    class Broken:
        def nvmlInit(self):
            raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    assert telemetry.GpuProbe([0, 1], nvml=Broken()).read() == []


class NvmlStandIn:
    """pynvml's calls as the probe makes them, for two devices (no NVIDIA driver on this machine)."""

    def __init__(self):
        self.devices = {"0": "h0", "1": "h1", "GPU-abc": "h1"}

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByIndex(self, index):
        return self.devices[str(index)]

    def nvmlDeviceGetHandleByUUID(self, uuid):
        return self.devices[uuid]

    def nvmlDeviceGetIndex(self, handle):
        return int(handle[1])

    def nvmlDeviceGetUtilizationRates(self, handle):
        if handle == "h0":
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")
        return SimpleNamespace(gpu=87, memory=40)

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(used=3 << 30, total=80 << 30, free=77 << 30)


def test_gpu_samples_map_cuda_indices_through_visible_devices():
    probe = telemetry.GpuProbe([1], nvml=NvmlStandIn(), visible_devices="0,GPU-abc")
    [gpu] = probe.read()
    assert (gpu.index, gpu.util_percent, gpu.memory_used_bytes, gpu.memory_total_bytes) == (
        1, 87.0, 3 << 30, 80 << 30)
    # A GPU that stops answering is left out of the sample, the others stay.
    assert [g.index for g in telemetry.GpuProbe([0, 1], nvml=NvmlStandIn(), visible_devices="").read()] == [1]


def test_the_thread_sends_samples_until_stopped():
    sent = []
    thread = telemetry.TelemetryThread(telemetry.Sampler(telemetry.GpuProbe([])),
                                       sent.append, interval_s=0.0)
    thread._interval_s = 0.01  # the floor of one a second is for real workers; the loop is what is tested
    thread.start()
    deadline = time.monotonic() + 30
    while len(sent) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    thread.stop()
    thread._thread.join(30)
    assert len(sent) >= 3 and not thread._thread.is_alive()
    assert telemetry.TelemetryThread(None, None, interval_s=0.1)._interval_s == telemetry.INTERVAL_S


def test_a_run_of_more_ranks_than_the_budget_samples_less_often_within_the_budget(monkeypatch):
    for world in (1, 8, telemetry.RUN_SAMPLES_PER_S):
        assert telemetry.interval_s(world) == telemetry.INTERVAL_S
    for world in (telemetry.RUN_SAMPLES_PER_S + 1, 16384, 100_000):
        assert telemetry.interval_s(world) > telemetry.INTERVAL_S
        assert world / telemetry.interval_s(world) == pytest.approx(telemetry.RUN_SAMPLES_PER_S)  # the whole run's rate
    assert telemetry.interval_s(16384) == 4.0
    monkeypatch.setattr(telemetry.TelemetryThread, "start", lambda self: None)  # no thread: the interval is what is tested
    monkeypatch.setattr(telemetry.waits, "ENABLED", True)
    assert telemetry.start([], print, attempt=0, rank=3, world_size=16384)._interval_s == 4.0
    assert telemetry.start([], print, attempt=0, rank=3, world_size=2)._interval_s == telemetry.INTERVAL_S


def test_the_coordinator_reads_absent_fields_as_not_measured():
    message = pb.Telemetry(sampled_at=5.0, reports=7, step_time_s=0.25, cpu_percent=0.0, rss_bytes=10,
                           gpus=[pb.GpuSample(index=2, util_percent=50, memory_used_bytes=1, memory_total_bytes=2)])
    sample = convert.telemetry_from_message(3, 1, message)
    assert (sample.attempt, sample.rank, sample.reports, sample.step_time_s) == (3, 1, 7, 0.25)
    assert sample.cpu_percent == 0.0 and sample.data_wait_s is None and sample.total is None
    assert sample.gpus[0].index == 2 and sample.gpus[0].util_percent == 50


def test_a_sample_is_a_record_of_its_rank_that_crosses_the_wire_unchanged(clock):
    """The sampler makes the L0 record; the worker's stream converts it (minitrain.rpc.convert) and the
    coordinator reads back the same record, figures not measured still None."""
    waits.set_total(12)  # on the test clock's own recorder
    sampler = telemetry.Sampler(telemetry.GpuProbe([1], nvml=NvmlStandIn(), visible_devices="0,GPU-abc"),
                                clock=clock, attempt=3, rank=5)
    first = sampler.sample()
    assert isinstance(first, TelemetrySample) and (first.attempt, first.rank, first.reports, first.total) == (3, 5, 0, 12)
    assert first.gpus == (GpuSample(index=1, util_percent=87.0, memory_used_bytes=3 << 30,
                                    memory_total_bytes=80 << 30),)
    with waits.reporting():
        clock.now += 0.1
    second = sampler.sample()
    for sample in (first, second):
        assert convert.telemetry_from_message(3, 5, convert.telemetry_message(sample)) == sample
    bare = TelemetrySample(attempt=0, rank=2, time=1.5, reports=0)
    message = convert.telemetry_message(bare)
    assert not message.HasField("step_time_s") and not message.HasField("rss_bytes") and message.total == 0
    assert convert.telemetry_from_message(0, 2, message) == bare


def test_the_thread_sends_nothing_while_recording_is_switched_off(monkeypatch):
    """`waits.ENABLED` is read at each tick: switched off while the rank runs (the ddp benchmark's
    alternating blocks), no sample goes out; switched on again, samples resume."""
    ticks, sent = [], []

    class CountingSampler:
        def sample(self):
            ticks.append(waits.ENABLED)
            return TelemetrySample(attempt=0, rank=0, time=0.0, reports=0)

    thread = telemetry.TelemetryThread(CountingSampler(), sent.append)
    thread._interval_s = 0.005
    monkeypatch.setattr(waits, "ENABLED", False)
    thread.start()
    try:
        # Wait for several ticks to pass with recording off: the thread's Event wait is the clock.
        ticking = time.monotonic()
        while time.monotonic() - ticking < 0.2:
            time.sleep(0.01)
        assert sent == [] and ticks == []
        monkeypatch.setattr(waits, "ENABLED", True)
        deadline = time.monotonic() + 30
        while len(sent) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(sent) >= 2 and all(ticks)
    finally:
        thread.stop()
        thread._thread.join(30)
