"""`minitrain.air`: the older `ray.air` import paths Ray still ships, for the names minitrain has.

Only `minitrain.air.integrations.keras.ReportCheckpointCallback` (Ray: `ray.air.integrations.keras`) is
here; it is `minitrain.tensorflow.keras.ReportCheckpointCallback`. Ray AIR's MLflow and Weights & Biases
callbacks are `minitrain.callbacks.MLflowLoggerCallback` and `WandbLoggerCallback`.
"""
