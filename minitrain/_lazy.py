"""Lazy package exports (L0): the `__getattr__` and `__dir__` a package uses to load its public names on first use.

A package lists `public name -> defining module` and gets back the pair of module-level functions Python calls
(PEP 562). A name is imported when first read and then stored in the package, so later reads skip `__getattr__`.
This is what keeps `import minitrain` (and `minitrain.torch`, `.tune`, ...) free of torch, the coordinator and
optional libraries until a name that needs them is used.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable, Collection, Mapping


def lazy_exports(package: str, exports: Mapping[str, str], public: Collection[str], *,
                 submodules: Collection[str] = (), aliases: Mapping[str, str] | None = None,
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """Return `(__getattr__, __dir__)` for `package`.

    `exports` maps each lazy public name to the module that defines it; `aliases` maps a public name to the
    attribute's name in that module where they differ (tune's `Result` is `TrialResult`); `submodules` are
    subpackages reached as attributes (`minitrain.tune.schedulers`). `__dir__` lists `public` and whatever the
    package has already loaded. An unknown name raises AttributeError as a plain module would.
    """
    renamed = dict(aliases or {})

    def __getattr__(name: str) -> Any:
        if name in submodules:
            return importlib.import_module(f"{package}.{name}")
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), renamed.get(name, name))
        setattr(sys.modules[package], name, value)  # later reads skip __getattr__
        return value

    def __dir__() -> list[str]:
        return sorted(set(public) | set(vars(sys.modules[package])))

    return __getattr__, __dir__
