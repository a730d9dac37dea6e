"""Ray's import path `ray.tune.search.concurrency_limiter.ConcurrencyLimiter`: the same class as `minitrain.tune.search.ConcurrencyLimiter`."""

from minitrain.tune.search import ConcurrencyLimiter

__all__ = ["ConcurrencyLimiter"]
