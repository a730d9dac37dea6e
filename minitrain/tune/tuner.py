"""`Tuner`: run a hyperparameter sweep of trials, each a process, and collect a `ResultGrid` (L3).

Ray's `ray.tune.Tuner` surface. A trainable is a function `f(config)` (calling `tune.report`, or
building a TorchTrainer and calling `fit()`: its reports are forwarded), or a `TorchTrainer` whose
`train_loop_config` is updated with the sampled `param_space["train_loop_config"]`.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import re
import threading
import uuid
from typing import Any, Callable, Optional

from minitrain.config import RunConfig as TrainRunConfig
from minitrain.dashboard.sweep import live_sweep_dashboard
from minitrain.driver.environment import driver_pythonpath
from minitrain.driver.logs import driver_logging
from minitrain.driver.trainer import DataParallelTrainer, count_required_parameters
from minitrain.errors import ConfigError
from minitrain.hosts.cluster import current_cluster
from minitrain.storage import sweep_state as tr
from minitrain.storage.user_key import KeyUnavailable
from minitrain.tune import restore_spec
from minitrain.tune.progress import ProgressReporter
from minitrain.tune.resources import ClusterRoom, trial_demand
from minitrain.tune.result_grid import ResultGrid, trial_error, trial_result
from minitrain.tune.run_config import CheckpointConfig, RunConfig
from minitrain.tune.callback import CallbackList
from minitrain.tune.schedulers import AsyncHyperBandScheduler, FIFOScheduler, HyperBandScheduler, MedianStoppingRule
from minitrain.tune.search import BasicVariantGenerator
from minitrain.tune.search_space import _unresolved_paths
from minitrain.tune.stopper import MissingStopKey
from minitrain.tune.sweep_loop import Retention, SweepLimits, SweepLoop, SweepSpec
from minitrain.tune.tune_config import TuneConfig, _WithParameters, _WithResources

logger = logging.getLogger("minitrain")


def trial_resources(trainable: Any) -> dict:
    """What one trial of `trainable` reserves in all: a TorchTrainer's workers x per-worker resources,
    `with_resources`' amounts, else 1 CPU (Ray's default for a function). Where: `trial_demand`."""
    if isinstance(trainable, _WithResources) and trainable.scaling_config is None:
        return dict(trainable.resources)
    return trial_demand(trainable).totals()


def _trainable_name(trainable: Any) -> str:
    if isinstance(trainable, DataParallelTrainer):
        return type(trainable).__name__  # TorchTrainer, XGBoostTrainer, LightGBMTrainer
    return re.sub(r"[^A-Za-z0-9_-]+", "_", getattr(trainable, "__name__", type(trainable).__name__)) or "trainable"


def _check_trainable(trainable: Any, param_space: dict) -> None:
    if isinstance(trainable, DataParallelTrainer):
        if trainable.scaling_config.local_mode:
            raise ConfigError("Tuner(TorchTrainer with ScalingConfig(num_workers=0)): local mode has no report "
                              "rounds to forward to the tuner. Use num_workers >= 1, or a function trainable that "
                              "calls tune.report().")
        extra = sorted(set(param_space) - {"train_loop_config"})
        if extra:
            raise ConfigError(f"Tuner(TorchTrainer, param_space=...): only 'train_loop_config' is tuned for a "
                              f"TorchTrainer, got {extra}. Put the values inside 'train_loop_config', or use a "
                              "function trainable that builds the TorchTrainer from its config.")
        if not isinstance(param_space.get("train_loop_config", {}), dict):
            raise ConfigError("Tuner(param_space={'train_loop_config': ...}) must be a dict of values/domains.")
        return
    if not callable(trainable):
        raise ConfigError(f"Tuner(trainable={trainable!r}) must be a function of the config or a TorchTrainer "
                          "(a class trainable is not supported by minitrain.tune).")
    if isinstance(trainable, type):
        raise ConfigError(f"Tuner(trainable={trainable.__name__}): class trainables (tune.Trainable) are not "
                          "supported; pass a function `def train(config): ... tune.report(...)`.")
    inner = trainable.trainable if isinstance(trainable, _WithResources) else trainable
    if isinstance(inner, _WithParameters):
        return  # with_parameters checked that it is called as trainable(config, **parameters)
    if count_required_parameters(inner) != 1:
        raise ConfigError(f"Tuner(trainable={getattr(inner, '__name__', inner)!r}) must take exactly one "
                          "argument, the trial's config dict.")


def _sweep_run_config(run_config: Any, trainable: Any) -> RunConfig:
    """The sweep's Tune `RunConfig` from what was passed (Tune's, Train's, or None: a TorchTrainer's own),
    with its name and storage path filled in."""
    is_trainer = isinstance(trainable, DataParallelTrainer)
    if run_config is None:
        run_config = RunConfig.from_train(trainable.run_config) if is_trainer else RunConfig()
        if is_trainer:  # the trainer's retention is its fit()'s own, not the sweep's
            run_config = dataclasses.replace(run_config, checkpoint_config=CheckpointConfig())
    elif isinstance(run_config, TrainRunConfig):
        run_config = RunConfig.from_train(run_config)
    elif not isinstance(run_config, RunConfig):
        raise ConfigError("Tuner(run_config=...) must be a minitrain.tune.RunConfig (or a minitrain.RunConfig).")
    if is_trainer and run_config.checkpoint_config != CheckpointConfig():
        raise ConfigError("Tuner(run_config=RunConfig(checkpoint_config=...)): set checkpoint retention on the "
                          "TorchTrainer's RunConfig; tune.RunConfig's checkpoint_config applies to function "
                          "trials.")
    if run_config.name:
        return run_config.with_default_name(_trainable_name(trainable))  # the user's name, kept as given
    named = run_config.with_default_name(_trainable_name(trainable))
    return dataclasses.replace(named, name=_unique_name(str(named.storage_path), named.name))


_names_lock = threading.Lock()
_names_taken: set = set()  # default experiment paths this process has handed out


def _unique_name(storage_path: str, base: str) -> str:
    """Ray's default `<trainable>_<date>` name `base`, made unique: `base`, else `base_2`, `base_3`, ...,
    the first whose directory does not exist under `storage_path` and that this process has not handed
    to another Tuner (two Tuners made in the same second both run). `fit()` then makes the directory
    atomically (`_claim_default_name`), so another process that chose the same name moves on too."""
    root = os.path.abspath(os.path.expanduser(storage_path))
    with _names_lock:
        for number in range(1, 10**6):
            name = base if number == 1 else f"{base}_{number}"
            path = os.path.join(root, name)
            if path not in _names_taken and not os.path.lexists(path):
                _names_taken.add(path)
                return name
    raise ConfigError(f"Tuner: no free default experiment name {base}_N under {root}; pass RunConfig(name=...).")


def _deep_merge(base: Any, override: Any) -> Any:
    """`override` laid over `base`, nested dicts merged key by key (Ray's `deep_update`, new keys allowed):
    a tuned {"opt": {"lr": x}} keeps the trainer's own {"opt": {"wd": ...}}."""
    if not (isinstance(base, dict) and isinstance(override, dict)):
        return copy.deepcopy(override)
    merged = dict(base)
    for key, value in override.items():
        merged[key] = _deep_merge(base[key], value) if key in base else value
    return merged


class _TrainerTrial:
    """What a trial of `Tuner(TorchTrainer)` runs: the trainer with the sampled `train_loop_config` merged
    into its own one level at a time, as Ray's trainers merge it (a shallow merge dropped the trainer's keys
    beside a tuned nested key, and the trial failed before any result), then `run_trainer` (the trial
    directory is its run directory). The trial's config, `result.config`, stays the sampled space alone."""

    def __init__(self, trainer: DataParallelTrainer):
        self.trainer = trainer
        self.__name__ = type(trainer).__name__

    def __call__(self, config: dict) -> Any:
        from minitrain.tune import session as tune_session
        from minitrain.tune.trial_process import run_trainer

        merged = _deep_merge(self.trainer.train_loop_config or {}, config.get("train_loop_config", {}))
        return run_trainer(self.trainer, {**config, "train_loop_config": merged}, tune_session.get_context())


def _format_vars(config: Any, param_space: dict) -> str:
    parts = []
    for path, _ in sorted(_unresolved_paths(param_space), key=lambda item: tuple(map(str, item[0]))):
        value = config
        try:
            for key in path:
                value = value[key]
        except (KeyError, IndexError, TypeError):
            continue
        text = f"{value:.4f}" if isinstance(value, float) else re.sub(r"[^a-zA-Z0-9_-]+", "_", str(value)).strip("_")
        parts.append(f"{path[-1]}={text}")
    return ",".join(parts)


class Tuner:
    """Tune `trainable` over `param_space` (Ray's Tuner). `fit()` runs the sweep and returns a
    `ResultGrid`; `Tuner.restore(path, trainable)` resumes an interrupted one."""

    def __init__(self, trainable: Any = None, *, param_space: Optional[dict] = None,
                 tune_config: Optional[TuneConfig] = None, run_config: Optional[RunConfig] = None,
                 _restored: Optional[tuple] = None):
        if trainable is None:
            raise ConfigError("Tuner(trainable=...) is required: a function of the config or a TorchTrainer.")
        self.param_space = copy.deepcopy(param_space) if param_space is not None else {}
        if not isinstance(self.param_space, dict):
            raise ConfigError(f"Tuner(param_space=...) must be a dict, got {type(param_space).__name__}.")
        _check_trainable(trainable, self.param_space)
        self.tune_config = tune_config if tune_config is not None else TuneConfig()
        if not isinstance(self.tune_config, TuneConfig):
            raise ConfigError("Tuner(tune_config=...) must be a minitrain.tune.TuneConfig.")
        given_name = getattr(run_config if run_config is not None else getattr(trainable, "run_config", None),
                             "name", None)
        run_config = _sweep_run_config(run_config, trainable)
        self._default_name = not given_name and _restored is None  # fit() claims it, or moves to a free one
        self.trainable, self.run_config = trainable, run_config
        self.experiment_path = os.path.join(os.path.abspath(os.path.expanduser(str(run_config.storage_path))),
                                            run_config.name)
        self._restored = _restored
        self._saved: Optional[tuple] = None  # a restored sweep's state as read, for get_results() before fit()
        self._results: Optional[ResultGrid] = None

    # ------------------------------------------------------------------ fit

    def fit(self) -> ResultGrid:
        """Run every trial to its end and return their results. A failing trial is retried per
        `run_config.failure_config.max_failures`, then recorded in the grid; it never ends the sweep.
        Ctrl-C stops the trials (their fit()s stop their workers), saves the state and raises
        KeyboardInterrupt: `Tuner.restore(path, trainable)` goes on from there."""
        if self.trainable is None:
            raise ConfigError(f"Tuner.restore({self.experiment_path!r}) without trainable= gives the sweep's "
                              "get_results() only; pass trainable= to go on with it.")
        with driver_logging(self.run_config.logging_config.log_level):
            return self._fit()

    def _fit(self) -> ResultGrid:
        config = self.tune_config
        # what Tuner.restore needs, taken before the searcher and scheduler change (a new sweep only)
        spec = restore_spec.capture(self.param_space, config, self.run_config) if self._restored is None else None
        room, demand = ClusterRoom(current_cluster()), trial_demand(self.trainable)
        unplaceable = room.never_fits(demand)
        if unplaceable and config.num_samples == -1:  # no set of trials to record it for: say it now
            raise ConfigError(f"Tuner: {unplaceable}")
        searcher = config.search_alg or BasicVariantGenerator()
        scheduler = config.scheduler or FIFOScheduler()
        if not searcher.set_search_properties(config.metric, config.mode, self.param_space):
            raise ConfigError(f"TuneConfig(metric={config.metric!r}, mode={config.mode!r}) differs from the metric/mode "
                              "set on the search_alg; set them in one place.")
        if not scheduler.set_search_properties(config.metric, config.mode):
            raise ConfigError(f"TuneConfig(metric={config.metric!r}, mode={config.mode!r}) differs from the metric/mode "
                              "set on the scheduler; set them in one place.")
        if isinstance(scheduler, (AsyncHyperBandScheduler, MedianStoppingRule, HyperBandScheduler)) and \
                not (scheduler.metric and scheduler.mode):
            raise ConfigError(f"{scheduler.describe()} needs a metric and a mode: pass them to it or to TuneConfig.")
        scheduler.check_sweep(self.trainable)
        num_samples = config.num_samples if config.num_samples > 0 else 10**9
        stopper = self.run_config.stopper()
        if self._restored is None:
            if self._default_name:
                self._claim_default_name()
            if os.path.exists(os.path.join(self.experiment_path, tr.STATE_FILE)):
                raise ConfigError(f"{self.experiment_path} already holds a tuning run. Resume it with "
                                  f"Tuner.restore({self.experiment_path!r}, trainable), or choose another "
                                  "RunConfig(name=...).")
            header = {"name": self.run_config.name, "trainable": _trainable_name(self.trainable),
                      "metric": config.metric, "mode": config.mode, "id_prefix": uuid.uuid4().hex[:5],
                      # what the trial tables show (the console's and the dashboard's)
                      "shown_metric": config.metric or scheduler.metric or searcher.metric,
                      "shown_mode": config.mode or scheduler.mode or searcher.mode,
                      "num_samples": num_samples, "total_trials": searcher.total_trials(num_samples),
                      "searcher_seed": getattr(searcher, "seed", None),
                      "constant_grid_search": getattr(searcher, "constant_grid_search", False)}
            trials: list = []
        else:
            header, trials = self._restored
            searcher.total_trials(header["num_samples"])  # the sweep's own count, whatever tune_config says
            _replay(searcher, scheduler, stopper, self.experiment_path, trials)
        tr.make_tune_dir(self.experiment_path)
        if spec is not None:
            tr.write_spec(self.experiment_path, spec)
        # The trial table, in the driver's live console (the status block if no other run holds it).
        reporter = ProgressReporter(config.metric or scheduler.metric or searcher.metric,
                                    verbose=int(self.run_config.show_table))
        try:
            loop = SweepLoop(self._spec(header, demand), trials, room=room, searcher=searcher, scheduler=scheduler,
                             reporter=reporter, stopper=stopper,
                             callbacks=CallbackList(self.run_config.callbacks or []))
            # The trial table as a web page while it runs; minitrain's log lines go through the console too.
            with live_sweep_dashboard(self.experiment_path), reporter.console.owning_log_handlers(logger):
                loop.run()
        finally:
            reporter.release()  # however the sweep ended, a later run's console may draw the status block
        self._results = ResultGrid([trial_result(self.experiment_path, t, loop.raised.get(t.trial_id))
                                    for t in loop.trials], self.experiment_path, config.metric, config.mode)
        failed = loop.fail_fast_error
        if failed is not None and self.run_config.failure_config.fail_fast == "raise":
            raise trial_error(failed[1], loop.raised.get(failed[0]))
        return self._results

    def _claim_default_name(self) -> None:
        """Make this sweep's directory under its default name, atomically; when another process made it
        first, take the next free name (`_unique_name`). A name the user gave is never changed."""
        storage = str(self.run_config.storage_path)
        os.makedirs(storage, exist_ok=True)
        base = re.sub(r"_\d+$", "", self.run_config.name)  # the date part ends "-SS": only our suffix goes
        while True:
            try:
                os.mkdir(self.experiment_path)
                self._default_name = False  # claimed: a second fit() of this Tuner finds its own run there
                return
            except FileExistsError:
                name = _unique_name(storage, base)
                self.run_config = dataclasses.replace(self.run_config, name=name)
                self.experiment_path = os.path.join(os.path.abspath(os.path.expanduser(storage)), name)

    def _spec(self, header: dict, demand: Any) -> SweepSpec:
        """The sweep as SweepLoop runs it: this Tuner's settings and the state file's `header`."""
        config = self.tune_config
        failure, keep = self.run_config.failure_config, self.run_config.checkpoint_config
        limits = SweepLimits(max_concurrent=config.max_concurrent_trials or 0, max_failures=failure.max_failures,
                             time_budget_s=config.time_budget_s, fail_fast=failure.fail_fast)
        retention = Retention(keep.num_to_keep, keep.checkpoint_score_attribute, keep.checkpoint_score_order)
        trainable = _TrainerTrial(self.trainable) if isinstance(self.trainable, DataParallelTrainer) else \
            self.trainable
        return SweepSpec(experiment_path=self.experiment_path, experiment_name=self.run_config.name, header=header,
                         trainable=trainable, trial_resources=trial_resources(self.trainable), demand=demand,
                         name_trial=self._namer(header["trainable"]), pythonpath=driver_pythonpath(), limits=limits,
                         retention=retention)

    def _namer(self, trainable_name: str) -> Callable[[tr.Trial], None]:
        config = self.tune_config

        def name(trial: tr.Trial) -> None:
            trial.trainable_name = trainable_name  # what Ray's trial_name_creator may read
            trial.name = str(config.trial_name_creator(trial)) if config.trial_name_creator else \
                f"{trainable_name}_{trial.trial_id}"
            if config.trial_dirname_creator:
                dirname = str(config.trial_dirname_creator(trial))
            else:
                tag = _format_vars(trial.config, self.param_space)
                dirname = f"{trainable_name}_{trial.trial_id}" + (f"_{trial.index}_{tag}" if tag else "")
            dirname = re.sub(r"[^A-Za-z0-9_.,=+-]+", "_", dirname)[:128]
            if not dirname or dirname.startswith("."):
                raise ConfigError(f"trial_dirname_creator gave {dirname!r}; a trial directory name must be a "
                                  "plain, non-hidden file name.")
            trial.dirname = dirname
            del trial.trainable_name
        return name

    def get_results(self) -> ResultGrid:
        """The ResultGrid of the last `fit()`; before one, of a `Tuner.restore`d sweep: its trials as its
        state file holds them (nothing runs, as Ray's); RuntimeError otherwise."""
        if self._results is None and self._saved is not None:
            header, trials = self._saved
            return ResultGrid([trial_result(self.experiment_path, t) for t in trials], self.experiment_path,
                              header["metric"], header["mode"])
        if self._results is None:
            raise RuntimeError("Tuner.get_results(): call fit() first.")
        return self._results

    # ------------------------------------------------------------------ restore

    @classmethod
    def can_restore(cls, path: str, storage_filesystem: Any = None) -> bool:
        """True when `path` (`<storage_path>/<name>`) holds a tuning run's state file."""
        if storage_filesystem is not None:
            raise ConfigError("Tuner.can_restore(storage_filesystem=...): minitrain.tune keeps sweeps on local paths.")
        return os.path.isfile(os.path.join(os.path.expanduser(str(path)), tr.STATE_FILE))

    @classmethod
    def restore(cls, path: str, trainable: Any = None, *, resume_unfinished: bool = True, resume_errored: bool = False,
                restart_errored: bool = False, param_space: Optional[dict] = None,
                tune_config: Optional[TuneConfig] = None, run_config: Optional[RunConfig] = None,
                storage_filesystem: Any = None) -> "Tuner":
        """A Tuner that goes on with the sweep in `path` when `fit()` is called: finished trials are
        kept, unfinished ones resume from their latest checkpoint, trials not created yet are created.

        As Ray, only the trainable must be passed again: the sweep's `param_space`, `tune_config` and
        `run_config` come from what it stored when it started (minitrain.tune.restore_spec: JSON, or a pickle
        sealed with the user's key, never an unauthenticated pickle). Passing one of them again replaces the
        stored one (e.g. a param space holding objects that cannot be pickled); a `param_space` passed again
        hands its objects (data sets, functions) to the trials that run again, their sampled values staying
        their own (Ray's semantics; `restore_spec.respecify`). `resume_errored` retries
        failed trials from their checkpoint, `restart_errored` from scratch; `resume_unfinished=False` ends
        unfinished trials as TERMINATED. Without `trainable` the Tuner only answers `get_results()` (the
        sweep as stored; nothing runs).
        """
        if not cls.can_restore(path, storage_filesystem):
            raise ConfigError(f"Tuner.restore({path!r}): no {tr.STATE_FILE} there, so there is no tuning run to "
                              "resume. The path is <storage_path>/<name> of the sweep.")
        path = os.path.abspath(os.path.expanduser(str(path)))
        try:
            header, trials = tr.read_state(path)
            tr.check_header(header, os.path.join(path, tr.STATE_FILE))
        except ValueError as exc:
            raise ConfigError(f"Tuner.restore({path!r}): {exc}") from None
        saved = (header, copy.deepcopy(trials))
        if trainable is None:
            return cls._stored_results(path, saved)
        try:
            stored = restore_spec.load(path)
        except ValueError as exc:
            raise ConfigError(f"Tuner.restore({path!r}): {exc}") from None
        _reopen_trials(path, trials, resume_unfinished, resume_errored, restart_errored)
        if param_space is None:
            param_space = stored.param_space
        else:  # re-specified: the trials that run again get its objects (data sets, functions), as Ray's
            _respecify_trials(trials, stored.param_space, param_space)
        if len(trials) < header["total_trials"] and param_space is None:
            raise ConfigError(f"Tuner.restore({path!r}): {header['total_trials'] - len(trials)} trial(s) were not "
                              f"created yet, and the sweep's param_space cannot be restored: "
                              f"{stored.why.get('param_space')}. Pass the same param_space= again.")
        tune_config = tune_config if tune_config is not None else stored.tune_config
        if tune_config is None and stored.present:
            raise ConfigError(f"Tuner.restore({path!r}): the sweep's tune_config cannot be restored: "
                              f"{stored.why.get('tune_config')}. Pass the same tune_config= again.")
        if tune_config is None:  # a sweep that stored no spec: the default searcher, as its header says
            tune_config = TuneConfig(metric=header["metric"], mode=header["mode"], search_alg=BasicVariantGenerator(
                random_state=header.get("searcher_seed"), constant_grid_search=header.get("constant_grid_search", False)))
        run_config = run_config if run_config is not None else stored.run_config
        if run_config is None and stored.present:
            raise ConfigError(f"Tuner.restore({path!r}): the sweep's run_config cannot be restored: "
                              f"{stored.why.get('run_config')}. Pass the same run_config= again.")
        parent, name = os.path.split(path)
        run_config = dataclasses.replace(run_config or RunConfig(), name=name, storage_path=parent)
        tuner = cls(trainable, param_space=param_space, tune_config=tune_config, run_config=run_config,
                    _restored=(header, trials))
        tuner._saved = saved
        return tuner

    @classmethod
    def _stored_results(cls, path: str, saved: tuple) -> "Tuner":
        """A Tuner of the sweep in `path` that has no trainable: `get_results()` only."""
        header, _ = saved
        parent, name = os.path.split(path)
        tuner = cls.__new__(cls)
        tuner.trainable, tuner.param_space = None, {}
        tuner.tune_config = TuneConfig(metric=header["metric"], mode=header["mode"])
        tuner.run_config = RunConfig(name=name, storage_path=parent)
        tuner.experiment_path, tuner._restored, tuner._saved, tuner._results = path, None, saved, None
        return tuner


def _reopen_trials(path: str, trials: list, resume_unfinished: bool, resume_errored: bool,
                   restart_errored: bool) -> None:
    """Make the trials that a restore runs again PENDING: unfinished ones (unless `resume_unfinished` is
    False: TERMINATED), and errored ones under `resume_errored` (from their checkpoint) or `restart_errored`
    (from scratch). A config that is not JSON comes back from its sealed copy."""
    for trial in trials:
        if trial.status == tr.TrialStatus.ERROR and (resume_errored or restart_errored):
            trial.status, trial.error, trial.num_failures = tr.TrialStatus.PENDING, None, 0
            if restart_errored:
                trial.checkpoint, trial.checkpoint_iteration = None, 0
        elif not trial.finished:
            if not resume_unfinished:
                trial.status, trial.stop_reason = tr.TrialStatus.TERMINATED, "not resumed (resume_unfinished=False)"
                continue
            trial.status = tr.TrialStatus.PENDING
        else:
            continue
        if not trial.config_is_json:
            trial.config = _unsealed_config(path, trial)


def _respecify_trials(trials: list, old_space: Optional[dict], new_space: dict) -> None:
    """Hand the objects of a param space passed again to `Tuner.restore` to every trial that runs again
    (PENDING after `_reopen_trials`): `restore_spec.respecify`. Such a config is sealed again, so a later
    restore without param_space= resumes with the new objects too."""
    for trial in trials:
        if trial.status != tr.TrialStatus.PENDING or not isinstance(trial.config, dict):
            continue
        config = restore_spec.respecify(trial.config, old_space, new_space)
        if all(a is b for a, b in _leaves(config, trial.config)):
            continue  # nothing replaced
        trial.config, trial.config_is_json = config, False  # it holds objects: the state file keeps its repr
        try:
            trial.config_sealed = restore_spec.seal_value(config)
        except Exception as exc:  # noqa: BLE001 - unpicklable, or no key: a later restore needs param_space= again
            trial.config_sealed = None
            logger.debug("trial %s: its re-specified config cannot be kept for a later restore: %s", trial.name, exc)


def _leaves(a: Any, b: Any) -> list:
    """Pairs of the leaves of two configs of the same shape (to see whether an object was replaced)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [pair for key in a for pair in _leaves(a[key], b.get(key))]
    if isinstance(a, list) and isinstance(b, list):
        return [pair for x, y in zip(a, b) for pair in _leaves(x, y)]
    return [(a, b)]


def _unsealed_config(path: str, trial: tr.Trial) -> Any:
    why = "it was not sealed (it could not be pickled, or there was no key)"
    if trial.config_sealed is not None:
        try:
            return restore_spec.unseal_value(trial.config_sealed)
        except (ValueError, KeyUnavailable) as exc:
            why = str(exc)
    raise ConfigError(f"Tuner.restore({path!r}): trial {trial.name} runs again, but its config is not JSON and its "
                      f"stored copy cannot be used: {why}. Keep configs to plain values, or restore as the user who "
                      "ran the sweep (with the same key).")


def _replay(searcher: Any, scheduler: Any, stopper: Any, experiment_path: str, trials: list) -> None:
    """Bring a fresh searcher, scheduler and stopper to where the interrupted sweep left them: the
    basic generator skips the configs already drawn, other searchers learn the finished trials, and
    the scheduler and the stopper see every kept result again (ASHA's rungs are rebuilt)."""
    if hasattr(searcher, "skip"):
        searcher.skip(len(trials))
    scheduler.set_controller(None)  # it rebuilds its state only; the sweep loop hands it its controller
    for trial in trials:
        history = tr.read_history(experiment_path, trial)
        if not trial.finished:
            history = history[:trial.checkpoint_iteration]
        scheduler.on_trial_add(trial.trial_id)
        for result in history:
            scheduler.on_trial_result(trial.trial_id, result)
            try:
                stopper(trial.trial_id, result)
            except MissingStopKey:
                pass  # the trial ended with this error already
        if trial.status == tr.TrialStatus.TERMINATED:
            scheduler.on_trial_complete(trial.trial_id, trial.last_result)
        if trial.finished:
            searcher.restore_finished(trial.trial_id, trial.config, trial.last_result, trial.status == tr.TrialStatus.ERROR)
