"""The sweep loop's PAUSE (HyperBand's pause/unpause, PBT's exploit) and its tune.Callback hooks, driven
with in-process fake trials: each "process" is a thread speaking the real report-pipe protocol through a
real TrialSession (the loop's `_spawn` seam), so no interpreter starts. Ray's references:
ray/tune/tests/test_trial_scheduler.py (HyperbandSuite), test_trial_scheduler_pbt.py, test_callbacks.py."""

from __future__ import annotations

import os
import struct
import threading

import cloudpickle
import pytest

from minitrain.checkpoint import Checkpoint
from minitrain.errors import ConfigError
from minitrain.hosts.cluster import ClusterConfig
from minitrain.hosts.host_list import HostSpec
from minitrain.storage import sweep_state as tr
from minitrain.tune import messages
from minitrain.tune.callback import Callback, CallbackList
from minitrain.tune.placement import Demand
from minitrain.tune.resources import ClusterRoom
from minitrain.tune.run_config import RunConfig
from minitrain.tune.schedulers import FIFOScheduler, HyperBandScheduler, PopulationBasedTraining
from minitrain.tune.search import BasicVariantGenerator
from minitrain.tune.session import TrialSession
from minitrain.tune.sweep_loop import SweepLoop, SweepSpec


class _Reporter:
    def update(self, trials): pass
    def trial_changed(self, trial): pass
    def finish(self, trials): pass


class _FakeProc:
    """A trial "process": a thread reading the payload, running `trainable(config, session, checkpoint)`."""

    def __init__(self):
        report_r, report_w = os.pipe()
        stdin_r, stdin_w = os.pipe()
        self.read_fd = report_r
        self.stdin = os.fdopen(stdin_w, "wb")
        self.returncode = None
        self._thread = threading.Thread(target=self._run, args=(stdin_r, report_w), daemon=True)
        self._thread.start()

    def _run(self, stdin_r, report_w):
        with os.fdopen(stdin_r, "rb") as stdin, os.fdopen(report_w, "w", buffering=1) as out:
            size = struct.unpack(">Q", stdin.read(8))[0]
            payload = cloudpickle.loads(stdin.read(size))
            session = TrialSession(payload.context, out, stdin, payload.checkpoint, payload.iteration)
            try:
                payload.trainable(payload.config, session, payload.checkpoint)
            except _Stopped:
                pass
            session.send(messages.TrialFinished(stopped=session.stop_requested))
        self.returncode = 0

    def wait(self, timeout=None):
        self._thread.join(timeout)
        return self.returncode

    def send_signal(self, sig): pass

    def kill(self):  # as a killed process's: its stdin closes, so the trial's next report reads STOP
        try:
            self.stdin.close()
        except OSError:
            pass


class _Stopped(Exception):
    pass


def report(session, metrics, checkpoint_dir=None):
    """tune.report for a fake trial: optionally a checkpoint directory holding `metrics`."""
    path = None
    if checkpoint_dir is not None:
        path = os.path.join(session.context.trial_dir, checkpoint_dir)
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "state.txt"), "w") as f:
            f.write(repr(metrics))
    if session.report(metrics, path) is messages.Decision.STOP:
        raise _Stopped


class _FakeLoop(SweepLoop):
    def _spawn(self, trial, env):
        proc = _FakeProc()
        return proc, proc.read_fd


def run_sweep(tmp_path, trainable, space, num_samples, scheduler=None, callbacks=(), slots=8):
    path = str(tmp_path / "exp")
    os.makedirs(path)
    searcher = BasicVariantGenerator()
    scheduler = scheduler or FIFOScheduler()
    assert scheduler.set_search_properties(None, None)
    searcher.set_search_properties(None, None, space)
    total = searcher.total_trials(num_samples)
    header = {"name": "exp", "trainable": "fake", "metric": None, "mode": None, "id_prefix": "abcde",
              "num_samples": num_samples, "total_trials": total}

    def name(trial):
        trial.name = trial.dirname = f"fake_{trial.trial_id}"

    spec = SweepSpec(experiment_path=path, experiment_name="exp", header=header, trainable=trainable,
                     trial_resources={"CPU": 1}, demand=Demand(1, 1.0, 0.0, restricts_slots=False), name_trial=name,
                     pythonpath=())
    room = ClusterRoom(ClusterConfig(hosts=(HostSpec("localhost", slots, local=True),)), environ={})
    loop = _FakeLoop(spec, [], room=room, searcher=searcher, scheduler=scheduler, reporter=_Reporter(),
                     callbacks=CallbackList(list(callbacks)))
    loop.run()
    return loop


# ---------------------------------------------------------------------------------- callbacks


class Recorder(Callback):
    def __init__(self):
        self.calls = []

    def setup(self, stop=None, num_samples=None, total_num_samples=None, **info):
        self.calls.append(("setup", num_samples, total_num_samples))

    def on_step_begin(self, iteration, trials, **info):
        assert isinstance(iteration, int) and isinstance(trials, list)

    def on_trial_start(self, iteration, trials, trial, **info):
        self.calls.append(("start", trial.trial_id))

    def on_trial_restore(self, iteration, trials, trial, **info):
        self.calls.append(("restore", trial.trial_id))

    def on_checkpoint(self, iteration, trials, trial, checkpoint, **info):
        assert isinstance(checkpoint, Checkpoint) and os.path.isdir(checkpoint.path)
        self.calls.append(("checkpoint", trial.trial_id))

    def on_trial_save(self, iteration, trials, trial, **info):
        self.calls.append(("save", trial.trial_id))

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.calls.append(("result", trial.trial_id, result["training_iteration"], result["score"]))

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.calls.append(("complete", trial.trial_id, str(trial.status)))

    def on_experiment_end(self, trials, **info):
        self.calls.append(("end", len(trials)))


def two_steps(config, session, checkpoint):
    report(session, {"score": 1}, checkpoint_dir="checkpoint_000000")
    report(session, {"score": 2})


def test_callbacks_are_called_in_rays_order_with_rays_arguments(tmp_path):
    recorder = Recorder()
    run_sweep(tmp_path, two_steps, {}, 1, callbacks=[recorder])
    t = "abcde_00000"
    assert recorder.calls == [("setup", 1, 1), ("start", t), ("checkpoint", t), ("save", t), ("result", t, 1, 1),
                              ("result", t, 2, 2), ("complete", t, "TERMINATED"), ("end", 1)]


def test_an_exception_in_a_callback_ends_the_sweep_and_propagates(tmp_path):
    class Boom(Callback):
        def on_trial_result(self, iteration, trials, trial, result, **info):
            raise RuntimeError("callback failed")

    with pytest.raises(RuntimeError, match="callback failed"):
        run_sweep(tmp_path, two_steps, {}, 1, callbacks=[Boom()])


def test_run_config_accepts_only_tune_callbacks():
    assert isinstance(RunConfig(callbacks=[Recorder()]).callbacks[0], Recorder)
    with pytest.raises(ConfigError, match=r"RunConfig\(callbacks=...\): entry 0 .*is a class"):
        RunConfig(callbacks=[Recorder])
    with pytest.raises(ConfigError, match="must be a list"):
        RunConfig(callbacks=Recorder())


# ---------------------------------------------------------------------------------- HyperBand


def test_hyperband_brackets_are_rays():
    scheduler = HyperBandScheduler(metric="m", mode="max")  # max_t=81, eta=3: 5 brackets in a band
    for i in range(5 + 8 + 15 + 34 + 81):
        scheduler.on_trial_add(f"t{i}")
    band = scheduler.brackets()[0]
    assert [(n, r) for n, r, _ in band] == [(5, 81), (8, 27), (15, 9), (34, 3), (81, 1)]
    small = HyperBandScheduler(metric="m", mode="max", max_t=4, reduction_factor=2)  # s_max+1 = 3
    assert [small.n0(s) for s in range(3)] == [3, 3, 4] and [small.r0(s) for s in range(3)] == [4, 2, 1]


def counting(config, session, checkpoint):
    """Reports `score` = config["x"] each iteration, checkpointing each; resumes after its checkpoint."""
    start = 0 if checkpoint is None else int(os.path.basename(checkpoint).split("_")[1])
    for i in range(start + 1, 100):
        report(session, {"score": config["x"], "resumed_from": start}, checkpoint_dir=f"checkpoint_{i:06d}")


def test_hyperband_pauses_at_the_milestone_resumes_from_its_checkpoint_and_stops_the_worse(tmp_path):
    from minitrain.tune.search_space import grid_search

    recorder = Recorder()
    scheduler = HyperBandScheduler(metric="score", mode="max", max_t=9, reduction_factor=3)
    for pad in ("pad0", "pad1", "pad2"):  # fill bracket s=0 (3 trials, milestone 9)
        scheduler.on_trial_add(pad)
    # bracket s=1: 5 trials run to 3, two at a time (paused there), then the best ceil(5/3)=2 go on to 6
    loop = run_sweep(tmp_path, counting, {"x": grid_search([1, 2, 3, 4, 5])}, 1, scheduler=scheduler,
                     callbacks=[recorder], slots=2)
    done = {t.config["x"]: t for t in loop.trials}
    assert all(t.status == tr.TrialStatus.TERMINATED for t in done.values())
    assert [done[x].last_result["training_iteration"] for x in (1, 2, 3, 4, 5)] == [3, 3, 3, 6, 6]
    assert all("HyperBandScheduler" in done[x].stop_reason for x in (1, 2, 3))
    resumed = [x for x in (4, 5) if done[x].last_result["resumed_from"] == 3]
    assert resumed  # a paused good trial started again from its own checkpoint, with its own id
    restored = {c[1] for c in recorder.calls if c[0] == "restore"}
    assert {done[x].trial_id for x in resumed} <= restored


# ---------------------------------------------------------------------------------- PBT


def pbt_trainable(config, session, checkpoint):
    """score grows by config["lr"] per step; the checkpoint holds the running score."""
    score = 0.0
    if checkpoint is not None:
        with open(os.path.join(checkpoint, "score.txt")) as f:
            score = float(f.read())
    for _ in range(8):
        score += config["lr"]
        path = os.path.join(session.context.trial_dir, f"ck_{session.iteration + 1:06d}")
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "score.txt"), "w") as f:
            f.write(str(score))
        if session.report({"score": score, "lr": config["lr"]}, path) is messages.Decision.STOP:
            raise _Stopped


def test_pbt_bottom_trial_exploits_the_top_trials_checkpoint_and_explores_its_config(tmp_path):
    from minitrain.tune.search_space import grid_search

    pbt = PopulationBasedTraining(time_attr="training_iteration", metric="score", mode="max",
                                  perturbation_interval=2, hyperparam_mutations={"lr": [0.1, 1.0, 10.0]},
                                  resample_probability=0.0, quantile_fraction=0.5)
    loop = run_sweep(tmp_path, pbt_trainable, {"lr": grid_search([0.1, 10.0])}, 1, scheduler=pbt, slots=2)
    low, high = loop.trials
    assert pbt.num_perturbations >= 1
    assert low.trial_id == "abcde_00000" and low.config["lr"] in (1.0, 10.0)  # shifted from the donor's 10.0
    assert low.status == high.status == tr.TrialStatus.TERMINATED
    assert any(os.path.basename(p).startswith("pbt_checkpoint_") for p, _ in low.checkpoints)
    assert low.last_result["score"] > 8 * 0.1 + 1  # it went on from the donor's score, not its own
    with open(os.path.join(loop.spec.experiment_path, "pbt_global.txt")) as f:
        assert f"\"{low.trial_id}\", \"{high.trial_id}\"" in f.readline()


def test_pbt_refuses_to_exploit_a_trial_without_a_checkpoint(tmp_path):
    from minitrain.tune.search_space import grid_search

    def no_checkpoints(config, session, checkpoint):
        for _ in range(6):
            report(session, {"score": config["lr"]})

    pbt = PopulationBasedTraining(time_attr="training_iteration", metric="score", mode="max",
                                  perturbation_interval=2, hyperparam_mutations={"lr": [0.1, 10.0]},
                                  quantile_fraction=0.5)
    with pytest.raises(ConfigError, match="has reported no checkpoint.*perturbation_interval=2"):
        run_sweep(tmp_path, no_checkpoints, {"lr": grid_search([0.1, 10.0])}, 1, scheduler=pbt, slots=2)
