"""Ray's import path `ray.tune.search.sample`: the search space's domains and sampling functions, the same
objects as `minitrain.tune.search_space`'s (and `minitrain.tune.uniform`, ...)."""

from minitrain.tune.search_space import (Domain, choice, grid_search, lograndint, loguniform, qlograndint,
                                         qloguniform, qrandint, qrandn, quniform, randint, randn, sample_from,
                                         uniform)

__all__ = ["Domain", "choice", "grid_search", "lograndint", "loguniform", "qlograndint", "qloguniform", "qrandint",
           "qrandn", "quniform", "randint", "randn", "sample_from", "uniform"]
