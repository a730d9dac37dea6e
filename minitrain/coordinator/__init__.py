"""The coordinator runtime (L2): runs inside the driver's `fit()`; never imports torch."""
