"""Ray's `ray.tune.integration` package: `ray_train.TuneReportCallback` (Train v2 inside a Tune trial)."""
