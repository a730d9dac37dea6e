"""minitrain: Ray Train's TorchTrainer API without Ray, for bare-metal GPU hosts.

Port a Ray Train script by changing imports: `ray.train` -> `minitrain`, `ray.train.torch` ->
`minitrain.torch`. Names are loaded lazily, so a worker that calls `minitrain.report()` never imports
the coordinator, and `import minitrain` does not import torch.
"""

from __future__ import annotations

from minitrain._lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "ScalingConfig": "minitrain.config",
    "RunConfig": "minitrain.config",
    "CheckpointConfig": "minitrain.config",
    "FailureConfig": "minitrain.config",
    "DataConfig": "minitrain.config",
    "LoggingConfig": "minitrain.config",
    "MonitoringConfig": "minitrain.config",  # a minitrain extension (RunConfig.monitoring_config)
    "TrainContext": "minitrain.context",
    "report": "minitrain.train_api",
    "get_checkpoint": "minitrain.train_api",
    "set_progress_total": "minitrain.train_api",
    "get_context": "minitrain.train_api",
    "get_preemption_info": "minitrain.train_api",
    "get_dataset_shard": "minitrain.train_api",
    "get_all_reported_checkpoints": "minitrain.train_api",
    "Checkpoint": "minitrain.checkpoint",
    "UserCallback": "minitrain.callbacks.base",
    "CheckpointUploadMode": "minitrain.reporting",
    "CheckpointConsistencyMode": "minitrain.reporting",
    "ReportedCheckpoint": "minitrain.reporting",
    "ReportedCheckpointStatus": "minitrain.reporting",
    "StorageError": "minitrain.storage.filesystem",
    "init": "minitrain.hosts.cluster",
    "shutdown": "minitrain.hosts.cluster",
    "current_cluster": "minitrain.hosts.cluster",
    "LaunchError": "minitrain.errors",
    "Result": "minitrain.result",
    "TrainingFailedError": "minitrain.errors",
    "WorkerGroupError": "minitrain.errors",
    "ControllerError": "minitrain.errors",
    "ConfigError": "minitrain.errors",
    "RemoteWorkerError": "minitrain.errors",
    "WorkerProcessError": "minitrain.errors",
    "WorkerHangError": "minitrain.errors",
    "NodeLostError": "minitrain.errors",
    "PreemptionError": "minitrain.errors",
    "NoProgressError": "minitrain.errors",  # a minitrain extension (FailureConfig.max_attempts_without_progress)
    "FailedAttempt": "minitrain.records",  # a minitrain extension (WorkerGroupError.failed_attempts)
    "PreemptionInfo": "minitrain.records",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


# Subpackages reachable as attributes, as in `from ray import train; train.torch.prepare_model(...)`.
_SUBPACKAGES = {"torch", "data", "collective", "lightning", "huggingface", "callbacks", "tune"}


__getattr__, __dir__ = lazy_exports("minitrain", _EXPORTS, __all__, submodules=_SUBPACKAGES)
