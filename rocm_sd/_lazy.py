"""Package attributes imported at their first use (PEP 562), for the packages `python -m rocm_sd` and
`python -m rocm_sd.tune` import before they parse a single argument: their `__init__` must import no torch, so
that --help and argument errors answer at once."""
from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import Callable


def lazy_attributes(package: str, sources: dict[str, str]) -> tuple[Callable[[str], object], Callable[[], list]]:
    """`__getattr__` and `__dir__` for `package`: `sources` maps each public name to the module holding it
    (relative: '.pipeline'). Any other submodule is imported when asked for as an attribute, as it was reachable
    when the package's __init__ imported everything."""
    def __getattr__(name: str):
        if name in sources:
            value = getattr(importlib.import_module(sources[name], package), name)
        elif not name.startswith("__") and importlib.util.find_spec(f"{package}.{name}") is not None:
            value = importlib.import_module(f"{package}.{name}")
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(sys.modules[package], name, value)  # asked once
        return value

    def __dir__() -> list:
        return sorted(set(vars(sys.modules[package])) | set(sources))

    return __getattr__, __dir__
