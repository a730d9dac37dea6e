"""`DataParallelTrainer`, the base of `TorchTrainer`, `XGBoostTrainer`, `LightGBMTrainer`, `JaxTrainer` and
`TensorflowTrainer`: validate, run the coordinator in this process, return a `Result` or raise (L3). A subclass names only its backend
(`minitrain.worker.backend.Backend`): how each attempt's workers bring up their collective layer."""

from __future__ import annotations

import dataclasses
import inspect
import logging
import math
import os
import tempfile
import uuid
from typing import Any, Callable, Optional

import cloudpickle

from minitrain import __version__, _session, knobs

from minitrain.callbacks.base import TrainRunContext
from minitrain.callbacks.runner import CallbackRunner
from minitrain.checkpoint import Checkpoint
from minitrain.config import DataConfig, FailureConfig, RunConfig, ScalingConfig, TorchConfig
from minitrain.coordinator.controller import LaunchSettings, RunSpec
from minitrain.coordinator.facts.metrics_log import MetricsLog, read_metrics_history
from minitrain.coordinator.policy.elastic import Sizing
from minitrain.coordinator.policy.loop import Rules
from minitrain.coordinator.preemption_signals import preemption_deferred
from minitrain.coordinator.run import run_coordinator
from minitrain.dashboard import live_dashboard
from minitrain.dashboard.stacks import StackDesk
from minitrain.driver import code_pickle, messages as fit_notes, local_mode, resource_wait, run_directory
from minitrain.driver.console import LiveConsole
from minitrain.driver.environment import driver_pythonpath, sigterm_stops_like_ctrl_c, worker_env
from minitrain.hosts import hostinfo, slurm_env, slurm_requeue
from minitrain.monitoring.console_status import ConsoleStatus
from minitrain.monitoring.goodput import Goodput
from minitrain.monitoring.monitor import RunMonitor
from minitrain.monitoring.stragglers import StragglerRule
from minitrain.storage.checkpoint_manager import INDEX_NAME, CheckpointManager
from minitrain.errors import (
    ConfigError, ControllerError, LaunchError, NoProgressError, PreemptionError, WorkerGroupError, rebuild_exception,
)
from minitrain.driver.logs import LogSink, driver_logging
from minitrain.hosts.cluster import ClusterConfig, current_cluster
from minitrain.hosts.joining import JoinLauncher
from minitrain.hosts.launcher import ClusterLauncher
from minitrain.hosts.ssh import PreflightError, preflight
from minitrain.records import RunOutcome, RunPayload
from minitrain.result import CheckpointCommit, Resize, Result, Straggler
from minitrain.run_state import RunState, ray_status
from minitrain.storage.filesystem import VALIDATE_MARKER, Storage
from minitrain.storage.layout import LOGS_DIR
from minitrain.storage.mirror import lives_in_this_process, local_mirror
from minitrain.worker.backend import Backend, TorchBackend

logger = logging.getLogger("minitrain")



def count_required_parameters(fn: Callable) -> int:
    """Positional parameters without a default; `*args` counts as one (Ray's rule)."""
    count = 0
    for parameter in inspect.signature(fn).parameters.values():
        if parameter.kind is parameter.VAR_POSITIONAL:
            count += 1
        elif (parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD)
              and parameter.default is parameter.empty):
            count += 1
    return count


def _check_type(value: Any, expected: type, field: str, trainer: str = "TorchTrainer") -> None:
    if not isinstance(value, expected):
        raise ConfigError(f"{trainer}({field}=...) must be a minitrain.{expected.__name__}, got "
                          f"{type(value).__module__}.{type(value).__name__}. Import it from minitrain "
                          f"(a ray.train config object does not work here).")


class DataParallelTrainer:
    """Runs `train_loop_per_worker` on `scaling_config.num_workers` worker processes, each attempt's
    workers joined by the collective layer of `_backend()` (what a subclass defines, with
    `_BACKEND_CONFIG`, the class of its `backend_config`, and `_BACKEND_FIELD`, the argument's name).

    The function takes zero arguments or one (it is called with `train_loop_config or {}`). Every
    argument after it is keyword-only, as in Ray. Invalid arguments raise `ConfigError` (a ValueError)
    here or in `fit()`, before any process starts.
    """

    _BACKEND_CONFIG: type = type(None)
    _BACKEND_FIELD = "backend_config"

    def _backend(self) -> Backend:
        """The workers' backend for this run (read at each fit(), from `backend_config` and
        `scaling_config`)."""
        raise NotImplementedError(f"{type(self).__name__} does not name its backend")

    def __init__(self, train_loop_per_worker: Callable, *, train_loop_config: Optional[dict] = None,
                 backend_config: Any = None, scaling_config: Optional[ScalingConfig] = None,
                 run_config: Optional[RunConfig] = None, datasets: Optional[dict] = None,
                 dataset_config: Optional[DataConfig] = None, validation_config: Any = None,
                 metadata: Any = None, resume_from_checkpoint: Any = None):
        trainer = type(self).__name__
        if validation_config is not None:
            raise ConfigError(
                f"{trainer}(validation_config={validation_config!r}): Ray's (alpha) checkpoint validation is "
                "not supported by minitrain. Leave validation_config=None, evaluate in the training function "
                "and report the validation metrics with the checkpoint (CheckpointConfig's "
                "checkpoint_score_attribute can rank by them).")
        if metadata is not None:
            raise DeprecationWarning(f"{trainer}(metadata=...) was removed in Ray Train v2, which minitrain "
                                     "mirrors. Pass the values through train_loop_config instead.")
        if resume_from_checkpoint is not None:
            raise DeprecationWarning(
                f"{trainer}(resume_from_checkpoint=...) was removed in Ray Train v2, which minitrain mirrors. "
                "Pass the checkpoint path in train_loop_config and load it in the training function when "
                "minitrain.get_checkpoint() is None; re-running with the same RunConfig(name, storage_path) "
                "resumes a run.")
        if not callable(train_loop_per_worker):
            raise ConfigError(f"{trainer}(train_loop_per_worker=...) must be callable, got "
                              f"{type(train_loop_per_worker).__name__}. Pass your training function.")
        required = count_required_parameters(train_loop_per_worker)
        if required > 1:
            raise ConfigError(
                f"train_loop_per_worker should take in 0 or 1 required arguments, but "
                f"{getattr(train_loop_per_worker, '__name__', train_loop_per_worker)!r} takes {required}. "
                "Take a single `config` dict ({trainer} passes train_loop_config) or nothing.")
        if train_loop_config is not None and not isinstance(train_loop_config, dict):
            raise ConfigError(f"{trainer}(train_loop_config=...) must be a dict or None, got "
                              f"{type(train_loop_config).__name__}.")
        self.scaling_config = scaling_config if scaling_config is not None else ScalingConfig()
        self.run_config = run_config if run_config is not None else RunConfig()
        self.backend_config = backend_config if backend_config is not None else self._BACKEND_CONFIG()
        self.dataset_config = dataset_config if dataset_config is not None else DataConfig()
        _check_type(self.scaling_config, ScalingConfig, "scaling_config", trainer)
        _check_type(self.run_config, RunConfig, "run_config", trainer)
        _check_type(self.backend_config, self._BACKEND_CONFIG, self._BACKEND_FIELD, trainer)
        _check_type(self.dataset_config, DataConfig, "dataset_config", trainer)
        self.datasets = _validate_datasets(datasets, self.dataset_config)
        self.train_loop_per_worker = train_loop_per_worker
        self.train_loop_config = train_loop_config
        self._takes_config = required == 1 or _accepts_one_argument(train_loop_per_worker)

    # ------------------------------------------------------------------ fit

    def fit(self) -> Result:
        """Run training to the end. Returns a `Result`; raises `WorkerGroupError` when workers failed
        past `FailureConfig.max_failures` (its subclass `NoProgressError` when
        `FailureConfig.max_attempts_without_progress` attempts in a row failed without progress, whatever
        `max_failures` allows), `ControllerError` when the run could not be carried out,
        and KeyboardInterrupt after stopping the workers when interrupted. SIGTERM to the driver stops
        the run as Ctrl-C does, then the driver dies by SIGTERM (see `_sigterm_stops_like_ctrl_c`),
        except while the workers run when SIGTERM is one of `FailureConfig.preemption_signals` (the
        default): then, as any preemption signal to the driver or an agent, it stops the run at a round
        every rank agrees on and `fit()` raises `PreemptionError` (docs/preemption.md)."""
        signals = self.run_config.failure_config.preemption_signals if self.scaling_config.max_workers else ()
        with sigterm_stops_like_ctrl_c(), preemption_deferred(signals):
            with driver_logging(self.run_config.logging_config.log_level):  # fit()s at once share the logger
                try:
                    return self._fit()
                except KeyboardInterrupt as interrupt:
                    if not interrupt.args:
                        raise
                    logger.warning("%s", interrupt.args[0])
                    # Raised here, the traceback is the caller's line and this one, not 16 internal frames.
                    raise KeyboardInterrupt(interrupt.args[0]) from None

    def _fit(self) -> Result:
        if self.scaling_config.local_mode:
            return self._fit_local()
        knobs.check_all()  # a bad MINITRAIN_* value fails before anything is created
        relay = relays_workers()
        cluster = current_cluster()
        storage = run_directory.prepare_storage(self.run_config, cluster)
        created_here, self._attempted = not storage.exists(""), False
        try:
            with run_directory.locked(storage, self.run_config):  # one fit() per run directory
                run_directory.validate_writable(storage, self.run_config)
                if lives_in_this_process(storage):  # memory://: workers use a local copy, published at the end
                    with local_mirror(storage) as local:
                        return self._fit_on(cluster, local, published=storage, relay=relay)
                return self._fit_on(cluster, storage, published=storage, relay=relay)
        except BaseException:
            if created_here and not self._attempted:  # e.g. an unpicklable config: leave nothing behind
                run_directory.remove_unstarted_run(storage)
            raise

    def _fit_on(self, cluster: ClusterConfig, storage: Storage, published: Storage, relay: bool) -> Result:
        """Run on the run directory `storage`; the Result names checkpoints in `published` (the same
        storage, or the in-process storage that `storage` mirrors). `relay`: the workers' streams go
        through their agents' relays."""
        staging_areas: list = []  # large datasets staged for the workers; deleted however the run ends
        try:
            payload = self._payload(storage, self._dataset_specs(storage, cluster, staging_areas))
            return self._fit_with_payload(cluster, storage, published, payload, relay)
        finally:
            for area in staging_areas:
                area.cleanup()

    def _fit_with_payload(self, cluster: ClusterConfig, storage: Storage, published: Storage,
                          payload: bytes, relay: bool) -> Result:
        if cluster.all_local:
            self._check_gpus()
        elif cluster.launcher != "join":  # joiners cannot be reached before they join
            _preflight(cluster, storage, elastic=self.scaling_config.elasticity_enabled)
        checkpoints = run_directory.load_checkpoints(storage, self.run_config)
        metrics_log = MetricsLog(storage)
        metrics_log.repair()
        if checkpoints.resumed:
            logger.info("resuming run %r from %s (latest checkpoint: %s)", self.run_config.name, storage.url(),
                        checkpoints.latest.dir_name if checkpoints.latest else "none")
        else:
            checkpoints.save()  # the index marks the directory as a minitrain run from the start
        unknown = checkpoints.unknown_entries()
        if unknown:
            logger.info("leaving alone what minitrain did not create in %s: %s", storage.url(), ", ".join(unknown))
        backend = self._backend()
        spec = RunSpec(
            # A joined run's id is the one its joiners present (a stale joiner is refused by it).
            run_id=cluster.join.run_id if cluster.launcher == "join" else uuid.uuid4().hex,
            num_workers=self.scaling_config.max_workers,
            **_hosts_of(cluster),
            launch=LaunchSettings(
                experiment_name=self.run_config.name,
                run_path=storage.url(),
                payload=payload,
                backend=backend.name,
                dist_timeout_s=float(backend.timeout_s),
                cwd=self.run_config.worker_runtime_env.get("working_dir") or os.getcwd(),
                worker_env=worker_env(self.run_config, cluster),
                relay=relay,
                preemption_signals=self.run_config.failure_config.preemption_signals,
                memory_tier_bytes=_memory_tier_bytes(self.run_config.checkpoint_config),
                storage=cloudpickle.dumps(storage),
            ),
            failure_limits=self.run_config.failure_config,
            gpus_per_worker=self.scaling_config.num_gpus_per_worker,
            cpus_per_worker=self.scaling_config.num_cpus_per_worker,
            placement_strategy=self.scaling_config.placement_strategy,
            sizing=_sizing(self.scaling_config),
        )
        # The driver's record of the run (console, dashboard, Result.stragglers); kept for the dashboard.
        monitoring = self.run_config.monitoring_config
        self._monitor = RunMonitor(storage, kept_dir_names=lambda: checkpoints.committed_dir_names,
                                   rule=StragglerRule.of(monitoring))
        # The live status on the console; worker output and log lines are written through it.
        live = LiveConsole.for_driver()
        self._console_status = ConsoleStatus(self._monitor, live, line_every_s=monitoring.status_interval_s)
        logs_dir = storage.path(LOGS_DIR) if storage.is_local else tempfile.mkdtemp(prefix="minitrain_logs_")
        log_sink = LogSink(logs_dir, live=live, run_storage=storage if storage.is_local else None)
        stack_desk = StackDesk()  # the dashboard's "dump stacks" button
        self._attempted = True
        try:
            # The dashboard serves the monitor while the run goes on, and stops (thread and port) with it.
            with live_dashboard(self._monitor, dump_stacks=stack_desk.dump), live.owning_log_handlers(logger), \
                    resource_wait.holding(cluster, self.scaling_config, self.run_config.name, live, self._monitor,
                                          driver_pythonpath(), monitoring.status_interval_s) as held:
                # Waited for (or claimed at once) in the hosts' ledgers: the run gets only what it holds.
                spec = dataclasses.replace(spec, **_hosts_of(held.cluster))
                launcher = ClusterLauncher(held.cluster, pythonpath=driver_pythonpath(), agent_env=held.agent_env)
                if held.cluster.launcher == "join":
                    launcher = JoinLauncher(held.cluster, launcher)
                    spec = dataclasses.replace(spec, agent_start_timeout_s=held.cluster.join.timeout_s)
                outcome = run_coordinator(spec, launcher, log_sink,
                                          checkpoints, metrics_log,
                                          observers=[*self._run_observers(spec, storage), stack_desk])
        except LaunchError as exc:
            raise ControllerError(exc) from None
        except KeyboardInterrupt:  # the workers are stopped; fit() shows this line and raises again
            raise KeyboardInterrupt(fit_notes.interrupted(self.run_config.name, checkpoints)) from None
        finally:
            live.release()  # however the run ended, a later run's console may draw the status block
            log_sink.close()
            if not storage.is_local:
                run_directory.upload_logs(storage, logs_dir)
        # The goodput ledger's line: how the run's worker-seconds were spent, whatever the outcome.
        goodput = Goodput.from_dict(self._monitor.goodput())
        logger.info("%s", goodput.line())
        if checkpoints.resumed and outcome.state is RunState.SUCCEEDED and outcome.last_metrics is None:
            logger.warning("%s", fit_notes.nothing_left_to_do(self.run_config.name, published, checkpoints))
        if published is not storage:  # name the files where they will be, not in the mirror
            outcome = dataclasses.replace(outcome, error_message=outcome.error_message.replace(
                storage.url(), published.url()))
        if outcome.preemption is not None:
            slurm = cluster.launcher == "srun"
            error = _preemption_error(outcome, checkpoints, self.run_config.failure_config,
                                      earlier_requeues=slurm_env.restart_count(os.environ) if slurm else 0)
            if slurm and slurm_requeue.wants_requeue(error):  # its script runs again and resumes (docs/slurm.md)
                slurm_requeue.requeue_after_preemption(cluster.slurm_job_id)
            raise error
        return _result_or_raise(outcome, storage, checkpoints, published,
                                stragglers=self._monitor.straggler_history(), resizes=self._monitor.resizes(),
                                commits=self._monitor.checkpoints(), goodput=goodput)

    def _run_observers(self, spec: RunSpec, storage: Storage) -> list:
        """The driver-side observers of this run (minitrain.coordinator.observers.RunObserver), in the
        order they are told of each event: the run monitor first (always on), then the console status,
        the tuning trial's forwarding when this process runs one (minitrain.tune), the callbacks."""
        trial = _session.current_trial()
        return [self._monitor, self._console_status, *([trial.run_observer(self.run_config.callbacks or ())] if trial is not None else []),
                *self._callback_runners(spec, storage)]

    def _callback_runners(self, spec: RunSpec, storage: Storage) -> list:
        """RunConfig.callbacks, called on a thread of their own (minitrain.callbacks.runner)."""
        if not self.run_config.callbacks:
            return []
        context = TrainRunContext(run_id=spec.run_id, run_config=self.run_config,
                                  train_loop_config=self.train_loop_config, scaling_config=self.scaling_config,
                                  backend_config=self.backend_config, datasets=dict(self.datasets or {}),
                                  dataset_config=self.dataset_config, storage=storage)
        return [CallbackRunner(self.run_config.callbacks, context)]

    # ------------------------------------------------------------------ restore (the seeds' API)

    @classmethod
    def can_restore(cls, path: str, storage_filesystem: Any = None) -> bool:
        """True when `path` (a run directory `<storage_path>/<name>`) holds a checkpoint index."""
        storage = run_directory.storage_at(path, storage_filesystem)
        return storage.exists(INDEX_NAME)

    @classmethod
    def restore(cls, path: str, train_loop_per_worker: Optional[Callable] = None,
                train_loop_config: Optional[dict] = None, storage_filesystem: Any = None,
                **trainer_kwargs: Any) -> "TorchTrainer":
        """A trainer that resumes the run in `path` when `fit()` is called.

        The run's name and storage path come from `path`; pass the training function again (minitrain
        never unpickles a trainer from storage). Other keyword arguments are TorchTrainer's; a given
        `run_config` keeps its other fields. Equivalent to re-running with the same RunConfig(name,
        storage_path).
        """
        if train_loop_per_worker is None:
            raise ConfigError("TorchTrainer.restore(path, train_loop_per_worker=...) needs the training "
                              "function: minitrain does not store a pickled trainer in the run directory.")
        if not cls.can_restore(path, storage_filesystem):
            raise ConfigError(f"TorchTrainer.restore({path!r}): no {INDEX_NAME} there, so there is no run to "
                              "resume. Check the path (it is <storage_path>/<name>).")
        parent, name = path.rstrip("/").rsplit("/", 1) if "/" in path.rstrip("/") else (".", path)
        base = trainer_kwargs.pop("run_config", None) or RunConfig(name=name)
        run_config = dataclasses.replace(base, name=name, storage_path=parent,
                                         storage_filesystem=storage_filesystem or base.storage_filesystem)
        return cls(train_loop_per_worker, train_loop_config=train_loop_config, run_config=run_config,
                   **trainer_kwargs)

    def _dataset_specs(self, storage: Storage, cluster: ClusterConfig, staging_areas: list) -> Optional[dict]:
        """The datasets as workers receive them (minitrain.data.staging); large tables are staged once."""
        if not self.datasets:
            return None
        from minitrain.data.staging import StagingArea, plan_datasets

        def staging() -> StagingArea:
            staging_areas.append(StagingArea.for_run(storage, cluster.all_local))
            return staging_areas[-1]

        return plan_datasets(self.datasets, self.dataset_config, num_workers=self.scaling_config.max_workers,
                             staging=staging)

    def _payload(self, storage: Storage, datasets: Optional[dict] = None) -> bytes:
        try:
            cloudpickle.dumps(self.train_loop_per_worker)
        except Exception as exc:
            raise ConfigError(
                f"train_loop_per_worker cannot be pickled ({type(exc).__name__}: {exc}); it is sent to every "
                "worker. Create unpicklable objects (locks, open files, sockets) inside the function.") from exc
        for name, spec in (datasets or {}).items():
            try:
                cloudpickle.dumps(spec)
            except Exception as exc:
                raise ConfigError(
                    f"TorchTrainer(datasets={{{name!r}: ...}}) cannot be pickled ({type(exc).__name__}: {exc}); it "
                    "is sent to every worker. Pass a zero-argument function that builds it instead (it is "
                    "called in each worker).") from exc
        try:
            # code_pickle: the workers' tracebacks name the user's file and print its lines
            return code_pickle.dumps(RunPayload(self.train_loop_per_worker, self.train_loop_config or {},
                                                self._takes_config, storage, datasets, backend=self._backend()))
        except Exception as exc:
            raise ConfigError(
                f"train_loop_config cannot be pickled ({type(exc).__name__}: {exc}); it is sent to every "
                "worker. Keep it to plain values (numbers, strings, lists, dicts) and build other objects "
                "inside the training function.") from exc

    def _check_gpus(self) -> None:
        # An elastic run needs GPUs for its min workers only: it starts with as many as fit.
        needed = math.ceil(self.scaling_config.min_workers * self.scaling_config.num_gpus_per_worker - 1e-9)
        if needed <= 0:
            return
        have = len(hostinfo.gpu_ids())
        if have < needed:
            raise ConfigError(
                f"ScalingConfig(use_gpu=True, num_workers={self.scaling_config.num_workers!r}) needs {needed} "
                f"GPU(s), but this machine has {have} (none listed by CUDA_VISIBLE_DEVICES, "
                "/proc/driver/nvidia/gpus or nvidia-smi). Set use_gpu=False to train on CPUs, or lower "
                "num_workers.")

    def _fit_local(self) -> Result:
        """`num_workers=0`: run the function in this process, as Ray's local mode does."""
        return local_mode.fit(self.train_loop_per_worker, self._takes_config, self.train_loop_config,
                              self.run_config, self.datasets, self.dataset_config)

    # ------------------------------------------------------------------ removed APIs

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({getattr(self.train_loop_per_worker, '__name__', '?')}, "
                f"scaling_config={self.scaling_config!r})")


class TorchTrainer(DataParallelTrainer):
    """Runs `train_loop_per_worker` on `scaling_config.num_workers` worker processes with DDP:
    torch.distributed's process group is up on every worker before the function is called
    (`torch_config`, a `TorchConfig`: its backend, "nccl" with GPUs and "gloo" otherwise by default,
    and its timeout). The other arguments are `DataParallelTrainer`'s, as in Ray."""

    _BACKEND_CONFIG = TorchConfig
    _BACKEND_FIELD = "torch_config"

    def __init__(self, train_loop_per_worker: Callable, *, train_loop_config: Optional[dict] = None,
                 torch_config: Optional[TorchConfig] = None, scaling_config: Optional[ScalingConfig] = None,
                 run_config: Optional[RunConfig] = None, datasets: Optional[dict] = None,
                 dataset_config: Optional[DataConfig] = None, validation_config: Any = None,
                 metadata: Any = None, resume_from_checkpoint: Any = None):
        super().__init__(train_loop_per_worker, train_loop_config=train_loop_config, backend_config=torch_config,
                         scaling_config=scaling_config, run_config=run_config, datasets=datasets,
                         dataset_config=dataset_config, validation_config=validation_config, metadata=metadata,
                         resume_from_checkpoint=resume_from_checkpoint)

    @property
    def torch_config(self) -> TorchConfig:
        """The `TorchConfig` (the trainer's `backend_config`)."""
        return self.backend_config

    @torch_config.setter
    def torch_config(self, value: TorchConfig) -> None:
        self.backend_config = value

    def _backend(self) -> Backend:
        return TorchBackend(name=self.torch_config.resolved_backend(self.scaling_config.use_gpu),
                            timeout_s=float(self.torch_config.timeout_s))


def _validate_datasets(datasets: Any, data_config: DataConfig) -> dict:
    """`datasets` as {name: minitrain.data.Dataset}; ConfigError for what no rows can be read from."""
    if datasets is None and data_config.datasets_to_split == "all":
        return {}  # nothing to check, and minitrain.data (numpy) stays unimported
    from minitrain.data.staging import validate_datasets

    return validate_datasets(datasets, data_config)


def _accepts_one_argument(fn: Callable) -> bool:
    """True when fn can be called with one positional argument (e.g. `def f(config=None)`)."""
    try:
        inspect.signature(fn).bind(None)
        return True
    except TypeError:
        return False


# Relayed, the workers' streams reach the coordinator through their agents: one connection and batched
# messages per host instead of one per worker, and no report of a killed worker is lost
# (docs/benchmarks/scale.md, "Workers' streams relayed by their agent").
def relays_workers() -> bool:
    """Whether the run's workers relay their streams through the node agents, as ``MINITRAIN_RELAY``
    says (`minitrain.knobs.RELAY`: on unless set to 0, whatever the run's size); ConfigError names a
    value it does not know. Decided once per fit() and carried to the coordinator in
    `LaunchSettings.relay` (coordinator/facts/worker_group.py), which every agent's start is told."""
    choice = knobs.RELAY.get()
    return True if choice is None else choice


def _preemption_error(outcome: RunOutcome, checkpoints: CheckpointManager, failure: FailureConfig,
                      earlier_requeues: int = 0) -> PreemptionError:
    """The error of a preempted run: resumable while the run's preemptions (this one counted) stay within
    the preemption budget (`Rules.allows_resume`). `earlier_requeues`: how many times the scheduler
    already requeued the job (Slurm's SLURM_RESTART_COUNT): each was a preemption too, also one the run
    directory never saw (a node failure, a requeue before the first commit)."""
    preemptions = max(checkpoints.preemptions, earlier_requeues + 1)
    resumable = Rules.from_config(failure).allows_resume(preemptions)
    return fit_notes.preemption_error(outcome, checkpoints, preemptions, resumable, failure.max_preemption_failures)


def _sizing(scaling: ScalingConfig) -> Optional[Sizing]:
    """An elastic run's `Sizing` (ScalingConfig(num_workers=(min, max)), its resize interval and
    knobs.ELASTIC_START_WAIT_S); None for a fixed size."""
    if not scaling.elasticity_enabled:
        return None
    return Sizing(min_workers=scaling.min_workers, resize_interval_s=scaling.elastic_resize_monitor_interval_s,
                  start_wait_s=knobs.ELASTIC_START_WAIT_S.get())


def _hosts_of(cluster: ClusterConfig) -> dict:
    """The RunSpec fields that name the run's hosts."""
    return dict(node_ids=tuple(host.name for host in cluster.hosts),
                node_slots={host.name: host.slots for host in cluster.hosts},
                local_node_ids=cluster.replaced_at_once())


def _preflight(cluster: ClusterConfig, storage: Storage, elastic: bool = False) -> None:
    """Check every host at once before anything starts; one error lists every host that is not ready.
    An elastic run starts without the hosts that do not answer (its agents there fail, and the hosts are
    probed again each resize interval), as long as some host answers and none is misconfigured."""
    probe = None
    if storage.is_local:  # a shared (NFS) path: each host must read the marker the driver just wrote
        content = uuid.uuid4().hex
        storage.write_text_atomic(VALIDATE_MARKER, content)
        probe = (storage.path(VALIDATE_MARKER), content)
    try:
        preflight(cluster, storage_probe=probe, expected_version=__version__, pythonpath=driver_pythonpath())
    except PreflightError as error:
        if not (elastic and error.unreachable_only() and len(error.failures) < len(cluster.hosts)):
            raise
        logger.warning("elastic run: starting without the host(s) that do not answer, tried again each resize "
                       "interval: %s", "; ".join(f"{host}: {', '.join(reasons)}"
                                                  for host, reasons in error.failures.items()))


def _memory_tier_bytes(config) -> int:
    """The capacity each node's memory tier gets (`StartWorkers.memory_tier_bytes`): -1 for the host's
    default (`CheckpointConfig.memory_tier_bytes=None`), 0 for none."""
    return -1 if config.memory_tier_bytes is None else config.memory_tier_bytes


def _result_or_raise(outcome: RunOutcome, storage: Storage, checkpoints: CheckpointManager,
                     published: Storage, stragglers: Optional[list] = None,
                     resizes: Optional[list] = None, commits: Optional[list] = None,
                     goodput: Optional[Goodput] = None) -> Result:
    """The run's Result (read from `storage`; checkpoints and paths named in `published`), or the
    error it ended with. `stragglers`: the monitor's straggler episodes (RunMonitor.straggler_history);
    `resizes`: an elastic run's resizes (RunMonitor.resizes); `commits`: the checkpoints this fit()
    committed (RunMonitor.checkpoints); `goodput`: the run's goodput ledger (RunMonitor.goodput)."""
    if outcome.state is not RunState.SUCCEEDED:
        if not outcome.failures:
            raise ControllerError(LaunchError(outcome.error_message or f"the run ended {ray_status(outcome.state)}"))
        exceptions = {f.rank: rebuild_exception(f, outcome.exceptions.get(f.rank)) for f in outcome.failures}
        if outcome.no_progress:
            raise NoProgressError(outcome.error_message, exceptions, outcome.failed_attempts, outcome.no_progress)
        raise WorkerGroupError(outcome.error_message, exceptions, outcome.failed_attempts)

    def checkpoint(record) -> Checkpoint:
        return Checkpoint(published.path(record.dir_name), filesystem=published.checkpoint_fs)

    latest = checkpoints.latest
    history = [entry["metrics"] for entry in read_metrics_history(storage)]
    metrics = outcome.last_metrics
    if metrics is None:  # a resumed run that reported nothing new: the latest committed metrics, as Ray
        metrics = history[-1] if history else (latest.metrics if latest is not None else None)
    return Result(
        metrics=metrics,
        checkpoint=checkpoint(latest) if latest is not None else None,
        error=None,
        path=published.path(),
        best_checkpoints=[(checkpoint(r), r.metrics) for r in checkpoints.best()],
        _storage_filesystem=published.public_fs,
        return_value=cloudpickle.loads(outcome.return_value) if outcome.return_value else None,
        _metrics_history=history,
        stragglers=[Straggler.from_dict(episode) for episode in stragglers or ()],
        resizes=[Resize.from_dict(entry) for entry in resizes or ()],
        checkpoint_commits=[CheckpointCommit.from_dict(entry) for entry in commits or ()],
        failed_attempts=list(outcome.failed_attempts),
        goodput=goodput,
    )
