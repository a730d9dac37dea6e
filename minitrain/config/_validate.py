"""Validation helpers of the configs (L0: stdlib only): each returns the normalised value or raises
`ConfigError` naming the owner's field, the value and the fix; and `ReadOnlyDict`, the form configs
store their mappings in."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import numbers
from typing import Any, Optional, TypeVar

from minitrain.errors import ConfigError


class ReadOnlyDict(dict):
    """A dict that refuses changes; configs store their mappings as these.

    Unlike `types.MappingProxyType` it pickles (configs travel to workers) and compares and serialises
    as a plain dict. `dict(d)` or `d.copy()` gives a mutable copy.
    """

    __slots__ = ()

    def _refuse(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("this mapping belongs to a frozen minitrain config and cannot be changed; "
                        "build a new config with dataclasses.replace(config, field=new_value)")

    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(frozenset(self.items()))

    def __reduce__(self):
        return (type(self), (dict(self),))


class UnknownFieldError(ConfigError, TypeError):
    """A config was given a keyword it has no field for. A TypeError, as Python's own error for an
    unexpected keyword argument is, and a ConfigError, so it is reported like every other config
    mistake; the message names the field that was probably meant."""


_Config = TypeVar("_Config", bound=type)


def _suggests_fields(cls: _Config) -> _Config:
    """Class decorator (above `@dataclass`): an unknown keyword raises `UnknownFieldError` naming the
    closest field (`ScalingConfig(num_worker=2)`: "did you mean 'num_workers'?") instead of Python's
    bare "unexpected keyword argument". Fields Ray removed are still fields, so their own
    DeprecationWarning keeps being raised by `__post_init__`."""
    names = [f.name for f in dataclasses.fields(cls)]
    # What to suggest: the fields a user sets (not the ones Ray removed: they are kept, hidden, to refuse them).
    public = [f.name for f in dataclasses.fields(cls) if f.repr and not f.name.startswith("_")]
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        for name in kwargs:
            if name not in names:
                raise _unknown_field(cls.__name__, name, kwargs[name], public)
        init(self, *args, **kwargs)

    cls.__init__ = __init__
    return cls


def _unknown_field(owner: str, name: str, value: Any, fields: list[str]) -> UnknownFieldError:
    close = difflib.get_close_matches(name, fields, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}?" if close else f"its fields are {', '.join(fields)}."
    # Python's own words close the message, so code matching them keeps working.
    return UnknownFieldError(f"{owner}({name}={value!r}): {owner} has no field {name!r}; {hint} "
                             f"(Python: {owner}.__init__() got an unexpected keyword argument {name!r})")


def _fail(owner: str, name: str, requirement: str, value: Any, fix: str) -> ConfigError:
    return ConfigError(f"{owner}.{name} must be {requirement}, got {value!r}. {fix}")


def _int(value: Any, owner: str, name: str, minimum: int, fix: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise _fail(owner, name, f"an int >= {minimum}", value, fix)
    return int(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _number(value: Any, owner: str, name: str, *, above: float = -math.inf, at_least: float = -math.inf,
            fix: str) -> Any:
    if not _is_number(value) or not (value > above and value >= at_least):
        bound = f"> {above:g}" if above > -math.inf else f">= {at_least:g}"
        raise _fail(owner, name, f"a finite number {bound}", value, fix)
    return int(value) if isinstance(value, numbers.Integral) else float(value)


def _choice(value: Any, owner: str, name: str, choices: tuple[str, ...], fix: str = "") -> str:
    if not isinstance(value, str) or value not in choices:
        listed = ", ".join(repr(c) for c in choices)
        raise _fail(owner, name, f"one of {listed} (exact case)", value, fix or f"Use one of {listed}.")
    return value


def _optional_str(value: Any, owner: str, name: str, fix: str) -> Optional[str]:
    if value is not None and (not isinstance(value, str) or not value):
        raise _fail(owner, name, "None or a non-empty str", value, fix)
    return value
