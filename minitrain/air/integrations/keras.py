"""`ReportCheckpointCallback` at Ray's older path `ray.air.integrations.keras` (L3; imports tensorflow).

The same class as `minitrain.tensorflow.keras.ReportCheckpointCallback`, so scripts written against
either Ray path port by changing `ray` to `minitrain` in the import.
"""

from __future__ import annotations

from minitrain.tensorflow.keras import ReportCheckpointCallback

__all__ = ["ReportCheckpointCallback"]
