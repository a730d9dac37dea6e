"""Ray's import path `ray.tune.search.searcher.Searcher`: the same class as `minitrain.tune.search.Searcher`."""

from minitrain.tune.search import Searcher

__all__ = ["Searcher"]
