"""Ray's import path `ray.tune.search.basic_variant.BasicVariantGenerator`: the same class as `minitrain.tune.search.BasicVariantGenerator`."""

from minitrain.tune.search import BasicVariantGenerator

__all__ = ["BasicVariantGenerator"]
