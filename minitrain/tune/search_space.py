"""Search spaces: Ray Tune's sampling primitives and how a `param_space` becomes trial configs (L3).

`uniform`, `quniform`, `loguniform`, `qloguniform`, `randn`, `qrandn`, `randint`, `qrandint`,
`lograndint`, `qlograndint`, `choice` and `sample_from` return a `Domain`; `grid_search(values)`
returns Ray's `{"grid_search": values}` marker. `generate_variants` resolves a param space as Ray's
`BasicVariantGenerator` does:

- grid values are combined as a cartesian product; grid variables are ordered by their path in the
  config and the first one varies fastest;
- for each grid combination every other domain is sampled once, in the order the dict lists them;
- `num_samples` repeats the whole grid (num_samples x grid trials);
- `sample_from(fn)` gets the config sampled so far (both `spec.config.x` and `config["x"]` work); a
  function that reads a value not sampled yet is retried after the others (at most 20 passes);
- dicts and lists nest to any depth; everything else is a constant, copied into each config.

Sampling uses numpy with the same draws as Ray (`Generator.uniform`, `.integers`, `.normal`,
`.choice` over indices), so one seed gives one sequence of configs, run after run.
"""

from __future__ import annotations

import copy
import inspect
import math
from typing import Any, Callable, Iterator, Optional, Sequence, Union

import numpy as np

_MAX_RESOLUTION_PASSES = 20

RandomState = Union[None, int, np.random.Generator, np.random.RandomState]


def make_rng(random_state: RandomState) -> Any:
    """A numpy generator from a seed, a Generator or RandomState (kept), or None (numpy's global one)."""
    if random_state is None:
        return np.random
    if isinstance(random_state, (np.random.Generator, np.random.RandomState)):
        return random_state
    if isinstance(random_state, bool) or not isinstance(random_state, (int, np.integer)):
        raise TypeError(f"random_state must be None, an int seed or a numpy Generator/RandomState, got "
                        f"{random_state!r}.")
    return np.random.default_rng(int(random_state))


def _integers(rng: Any, low: int, high: int) -> int:
    if isinstance(rng, np.random.Generator):
        return rng.integers(low, high)
    return rng.randint(low, high)


class Domain:
    """A parameter to sample: `sample(rng)` draws one value. `kind` names the sampler
    ("uniform", "loguniform", "normal", "randint", "lograndint", "choice", "function"); `q` quantizes."""

    def __init__(self, kind: str, lower: Any = None, upper: Any = None, *, categories: Sequence = (),
                 mean: float = 0.0, sd: float = 1.0, q: Optional[float] = None,
                 func: Optional[Callable] = None):
        self.kind, self.lower, self.upper, self.q = kind, lower, upper, q
        self.categories = list(categories)
        self.mean, self.sd, self.func = mean, sd, func

    @property
    def is_integer(self) -> bool:
        """True for the integer samplers (randint, lograndint and their quantised forms)."""
        return self.kind in ("randint", "lograndint")

    def cast(self, value: Any) -> Any:
        """`value` (e.g. a searcher's suggestion) as this domain's type: float or int."""
        if self.kind in ("uniform", "loguniform", "normal"):
            return float(value)
        if self.is_integer:
            return int(value)
        return value

    def sample(self, rng: Any = None, config: Any = None) -> Any:
        """One value drawn with the numpy generator `rng` (numpy's global one when None)."""
        rng = np.random if rng is None else rng
        if self.kind == "function":
            return _call_sample_from(self.func, config)
        if self.kind == "choice":
            return self.categories[int(rng.choice(np.arange(0, len(self.categories)), size=1)[0])]
        lower, upper = self.lower, self.upper
        if self.q is not None and self.q != 1 and self.kind != "normal":  # Ray samples the quantized range
            lower, upper = np.ceil(lower / self.q) * self.q, np.floor(upper / self.q) * self.q
        if self.kind == "uniform":
            value = rng.uniform(lower, upper, size=1)[0]
        elif self.kind == "loguniform":
            value = np.exp(rng.uniform(np.log(lower), np.log(upper), size=1))[0]
        elif self.kind == "normal":
            value = rng.normal(self.mean, self.sd, size=1)[0]
        elif self.kind == "randint":
            value = _integers(rng, int(lower), int(upper))
        elif self.kind == "lograndint":
            value = np.floor(np.exp(rng.uniform(np.log(lower), np.log(upper), size=1))).astype(int)[0]
        else:
            raise ValueError(f"unknown domain kind {self.kind!r}")
        if self.q is not None and self.q != 1:
            value = np.round(np.divide(value, self.q)) * self.q
        return self.cast(value)

    def is_valid(self, value: Any) -> bool:
        """True when `value` lies in the domain (always True for `sample_from`)."""
        if self.kind == "function":
            return True
        if self.kind == "choice":
            return value in self.categories
        if self.kind == "normal":
            return isinstance(value, (int, float))
        return self.lower <= value <= self.upper

    def __repr__(self) -> str:
        if self.kind == "choice":
            return f"choice({self.categories!r})"
        if self.kind == "function":
            return f"sample_from({getattr(self.func, '__name__', self.func)})"
        if self.kind == "normal":
            return f"randn({self.mean}, {self.sd}{', q=' + str(self.q) if self.q else ''})"
        return f"{self.kind}({self.lower}, {self.upper}{', q=' + str(self.q) if self.q else ''})"


def _number(name: str, field: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) or not math.isfinite(value):
        raise ValueError(f"tune.{name}({field}={value!r}): {field} must be a finite number.")
    return value


def _bounds(name: str, lower: Any, upper: Any, *, positive: bool = False) -> None:
    _number(name, "lower", lower)
    _number(name, "upper", upper)
    if positive and not lower > 0:
        raise ValueError(f"tune.{name}: LogUniform requires a lower bound greater than 0. Got: {lower}. Did you "
                         "pass a variable that has been log-transformed? If so, pass the non-transformed value "
                         "instead.")
    if not lower < upper:
        raise ValueError(f"tune.{name}({lower}, {upper}): lower must be smaller than upper.")


def _quantum(name: str, q: Any, lower: Any = None, upper: Any = None) -> Any:
    _number(name, "q", q)
    if q <= 0:
        raise ValueError(f"tune.{name}(q={q!r}): q must be > 0.")
    for field, bound in (("lower", lower), ("upper", upper)):
        if bound is not None and not math.isclose(bound / q, round(bound / q)):
            raise ValueError(f"Your {field} variable bound {bound} is not divisible by quantization factor {q}.")
    return q


def uniform(lower: float, upper: float) -> Domain:
    """A float drawn uniformly from [lower, upper)."""
    _bounds("uniform", lower, upper)
    return Domain("uniform", lower, upper)


def quniform(lower: float, upper: float, q: float) -> Domain:
    """A uniform float rounded to a multiple of `q` (the upper bound becomes inclusive)."""
    _bounds("quniform", lower, upper)
    return Domain("uniform", lower, upper, q=_quantum("quniform", q, lower, upper))


def loguniform(lower: float, upper: float) -> Domain:
    """A float whose logarithm is uniform between log(lower) and log(upper); both bounds > 0."""
    _bounds("loguniform", lower, upper, positive=True)
    return Domain("loguniform", lower, upper)


def qloguniform(lower: float, upper: float, q: float) -> Domain:
    """A log-uniform float rounded to a multiple of `q`."""
    _bounds("qloguniform", lower, upper, positive=True)
    return Domain("loguniform", lower, upper, q=_quantum("qloguniform", q, lower, upper))


def randn(mean: float = 0.0, sd: float = 1.0) -> Domain:
    """A float drawn from the normal distribution N(mean, sd); sd > 0."""
    _number("randn", "mean", mean)
    if not _number("randn", "sd", sd) > 0:
        raise ValueError(f"tune.randn(sd={sd!r}): SD has to be strictly greater than 0.")
    return Domain("normal", mean=mean, sd=sd)


def qrandn(mean: float, sd: float, q: float) -> Domain:
    """A normal float rounded to a multiple of `q`."""
    domain = randn(mean, sd)
    domain.q = _quantum("qrandn", q)
    return domain


def _integer_bounds(name: str, lower: Any, upper: Any, positive: bool = False) -> None:
    for field, value in (("lower", lower), ("upper", upper)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ValueError(f"tune.{name}({field}={value!r}): {field} must be an int.")
    _bounds(name, lower, upper, positive=positive)


def randint(lower: int, upper: int) -> Domain:
    """An int drawn uniformly from [lower, upper): the upper bound is exclusive, as numpy's."""
    _integer_bounds("randint", lower, upper)
    return Domain("randint", lower, upper)


def qrandint(lower: int, upper: int, q: int = 1) -> Domain:
    """An int from [lower, upper] rounded to a multiple of `q` (Ray: upper inclusive once q > 1;
    with q=1 it is `randint`, upper exclusive, as in Ray)."""
    _integer_bounds("qrandint", lower, upper)
    return Domain("randint", lower, upper, q=_quantum("qrandint", q))


def lograndint(lower: int, upper: int) -> Domain:
    """An int whose logarithm is uniform in [log(lower), log(upper)); lower > 0."""
    _integer_bounds("lograndint", lower, upper, positive=True)
    return Domain("lograndint", lower, upper)


def qlograndint(lower: int, upper: int, q: int) -> Domain:
    """A log-uniform int rounded to a multiple of `q`."""
    _integer_bounds("qlograndint", lower, upper, positive=True)
    return Domain("lograndint", lower, upper, q=_quantum("qlograndint", q))


def choice(categories: Sequence) -> Domain:
    """One of `categories`, each equally likely (values keep their types)."""
    if isinstance(categories, (str, bytes)) or not isinstance(categories, Sequence) or not categories:
        raise ValueError(f"tune.choice(categories={categories!r}): pass a non-empty list of values.")
    return Domain("choice", categories=categories)


def sample_from(func: Callable) -> Domain:
    """A value computed by `func(spec)` (reads `spec.config.<name>`, the config sampled so far),
    `func(config)` or `func()`; use it for conditional spaces."""
    if not callable(func):
        raise ValueError(f"tune.sample_from(func={func!r}): pass a function of 0 or 1 arguments.")
    try:
        inspect.signature(func).bind({})
    except TypeError:
        try:
            inspect.signature(func).bind()
        except TypeError:
            raise ValueError("The function passed to tune.sample_from must be callable with either 0 or 1 "
                             "parameters.") from None
    except ValueError:  # builtins without a signature: called with the spec
        pass
    return Domain("function", func=func)


def grid_search(values: Sequence) -> dict:
    """Every one of `values` (Ray's `{"grid_search": values}`); several grids form their product."""
    if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__iter__"):
        raise ValueError(f"tune.grid_search(values={values!r}): pass a list of values.")
    return {"grid_search": list(values)}


# ---------------------------------------------------------------------------------- resolution


class _Unresolved(Exception):
    """A `sample_from` function read a value that is not sampled yet."""


class _Guard(dict):
    """The config as a `sample_from` function sees it: attribute access, nested dicts wrapped, and
    reading a value still unsampled raises `_Unresolved` (the function is retried later)."""

    def __getitem__(self, key: Any) -> Any:
        value = dict.__getitem__(self, key)
        if _is_unresolved(value):
            raise _Unresolved(key)
        return _Guard(value) if isinstance(value, dict) else value

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def _call_sample_from(func: Callable, config: Any) -> Any:
    try:
        inspect.signature(func).bind({})
    except TypeError:
        return func()
    except ValueError:
        pass
    try:
        return func(_Guard({"config": config}))  # Ray's form: spec.config.a
    except (AttributeError, KeyError):
        return func(_Guard(config))  # the config itself: config["a"]


def _is_grid(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and "grid_search" in value


def _is_unresolved(value: Any) -> bool:
    return isinstance(value, Domain) or _is_grid(value)


def _children(node: Any) -> Iterator[tuple[Any, Any]]:
    if isinstance(node, dict):
        return iter(node.items())
    if isinstance(node, list):
        return iter(enumerate(node))
    return iter(())


def _unresolved_paths(node: Any, prefix: tuple = ()) -> list[tuple[tuple, Any]]:
    found = []
    for key, value in _children(node):
        if _is_unresolved(value):
            found.append((prefix + (key,), value))
        elif isinstance(value, (dict, list)):
            found.extend(_unresolved_paths(value, prefix + (key,)))
    return found


def _assign(node: Any, path: tuple, value: Any) -> None:
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


def _grid_order(path: tuple) -> tuple:
    return tuple((0, key) if isinstance(key, int) else (1, str(key)) for key in path)


def count_variants(param_space: dict, num_samples: int) -> int:
    """How many configs `generate_variants` yields: num_samples x the product of the grid sizes."""
    total = num_samples
    for _, value in _unresolved_paths(param_space):
        if _is_grid(value):
            total *= len(value["grid_search"])
    return total


def generate_variants(param_space: dict, num_samples: int = 1, rng: Any = None,
                      constant_grid_search: bool = False) -> Iterator[dict]:
    """Yield `num_samples` x grid configs resolved from `param_space`, as Ray's BasicVariantGenerator.

    `rng` is a numpy generator (see `make_rng`). With `constant_grid_search=True` the random values of
    one sample are drawn once and kept for every grid combination.
    """
    if not isinstance(param_space, dict):
        raise ValueError(f"param_space must be a dict, got {type(param_space).__name__}.")
    for _ in range(num_samples):
        yield from _resolve(copy.deepcopy(param_space), rng, constant_grid_search)


def _resolve(space: Any, rng: Any, constant_grid_search: bool) -> Iterator[dict]:
    unresolved = _unresolved_paths(space)
    if not unresolved:
        yield space
        return
    grids = sorted(((p, v["grid_search"]) for p, v in unresolved if _is_grid(v)), key=lambda g: _grid_order(g[0]))
    domains = [(p, v) for p, v in unresolved if not _is_grid(v)]
    if constant_grid_search and domains:
        _sample_domains(space, domains, rng, allow_unresolved=True)
        domains = [(p, v) for p, v in domains if _is_unresolved(_get(space, p))]
    for combination in _grid_combinations(grids):
        variant = copy.deepcopy(space)
        for path, value in combination:
            _assign(variant, path, value)
        _sample_domains(variant, domains, rng, allow_unresolved=False)
        yield from _resolve(variant, rng, constant_grid_search)  # values that were themselves domains


def _get(node: Any, path: tuple) -> Any:
    for key in path:
        node = node[key]
    return node


def _grid_combinations(grids: list) -> Iterator[list]:
    if not grids:
        yield []
        return
    indices = [0] * len(grids)
    while True:
        yield [(path, values[indices[i]]) for i, (path, values) in enumerate(grids)]
        position = 0  # the first grid variable varies fastest (Ray's order)
        while position < len(grids):
            indices[position] += 1
            if indices[position] < len(grids[position][1]):
                break
            indices[position] = 0
            position += 1
        if position == len(grids):
            return


def _sample_domains(config: dict, domains: list, rng: Any, allow_unresolved: bool) -> None:
    pending = list(domains)
    for _ in range(_MAX_RESOLUTION_PASSES):
        waiting = []
        for path, domain in pending:
            try:
                value = domain.sample(rng, config)
            except _Unresolved:
                waiting.append((path, domain))
                continue
            _assign(config, path, value)
        if not waiting:
            return
        pending = waiting
    if not allow_unresolved:
        names = ", ".join("/".join(map(str, path)) for path, _ in pending)
        raise ValueError(f"tune.sample_from: could not resolve {names}: each reads a value that is never "
                         "sampled (a circular dependency?). Consider simplifying your configuration.")
