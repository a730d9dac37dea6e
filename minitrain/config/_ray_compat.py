"""Ray Train arguments minitrain refuses (L0: stdlib only): those Ray Train V2 removed (raised as a
`DeprecationWarning` exception, as Ray does, with the minitrain way to the same effect) and those it
accepts at their default only (any other value raises `ConfigError` saying what to do instead); and
`_ray_words`, Ray's wording appended to a message so that a test matching Ray's message still passes."""

from __future__ import annotations

import enum
import numbers
from dataclasses import field
from typing import Any

from minitrain.config._validate import _is_number
from minitrain.errors import ConfigError


class _Deprecated(enum.Enum):
    """Default of removed arguments, so 'not passed' differs from any value (None included).

    An enum member pickles by name, so the identity check survives pickling and `dataclasses.replace`.
    """

    DEPRECATED = "DEPRECATED"


_DEPRECATED = _Deprecated.DEPRECATED


def _deprecated_field() -> Any:
    return field(default=_DEPRECATED, repr=False, compare=False)


def _default_only(value: Any, owner: str, name: str, default: Any, why: str, fix: str) -> Any:
    """`value` when it is `default` (None, or an int such as -1), else a ConfigError saying why minitrain
    does not support the field and what to do instead."""
    if default is None:
        unsupported = value is not None
    else:  # an int default: True == 1 and -1.0 == -1 must not pass for it
        unsupported = isinstance(value, bool) or not isinstance(value, numbers.Integral) or value != default
    if unsupported:
        raise ConfigError(f"{owner}.{name} must be {default!r} (the default), got {value!r}: {why}. {fix}")
    return default


def _ray_only(value: Any, owner: str, name: str, default: Any, why: str, fix: str) -> Any:
    """`default` when `value` equals it (and has its type), else a ConfigError: a Ray argument that minitrain
    accepts at its default only, because the feature behind it does not exist in minitrain yet."""
    same_type = type(value) is type(default) or (_is_number(value) and _is_number(default)
                                                 and not isinstance(default, bool))
    if not same_type or value != default:
        raise ConfigError(f"{owner}.{name}={value!r} is not supported by minitrain yet ({why}); only the "
                          f"default {default!r} is accepted. {fix}")
    return default


def _ray_words(text: str) -> str:
    """Ray's wording of the same error, appended so that a test matching Ray's message still passes."""
    return f' (Ray: "{text}")'


def _reject_deprecated(owner: str, passed: dict[str, Any], hints: dict[str, str]) -> None:
    for arg, value in passed.items():
        if value is not _DEPRECATED:
            raise DeprecationWarning(f"{owner}({arg}={value!r}) was removed in Ray Train V2, which minitrain "
                                     f"mirrors. {hints[arg]}")
