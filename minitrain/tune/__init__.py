"""minitrain.tune: Ray Tune's `Tuner` surface on top of `TorchTrainer` (placeholder during build)."""
