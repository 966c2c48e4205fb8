"""Textual's import without the modules the monitor never runs (its RSS).

Importing ``textual.app`` loads, at import time, modules that serve features the monitor turns
off or never reaches. ``lean_imports`` sets stand-ins in ``sys.modules`` for the length of
that import, then takes them out, so a later ``import`` anywhere gets the real module:

- ``ssl`` (asyncio's TLS streams: libcrypto, ~3.3 MiB of RSS): blocked; asyncio takes an ssl
  that cannot be imported as "no TLS", its own fallback. The monitor opens no TLS stream.
- ``textual.command`` (the command palette, with the Input, OptionList, Select, Tree and
  DirectoryTree widgets it and ``textual.types`` bring: ~1.1 MiB traced): the monitor's apps
  set ``ENABLE_COMMAND_PALETTE = False``. ``textual.app`` and ``textual.theme`` bind its names
  at import; those stand-ins build the real classes if anything ever calls them.
- ``platformdirs`` (~0.7 MiB with what it imports): ``textual.app`` binds
  ``user_downloads_path``, called only to save a screenshot; the stand-in calls the real one.
- ``difflib`` (~0.14 MiB): ``get_close_matches``, for "did you mean" in a CSS error.
- ``platform`` (~0.1 MiB): ``uuid`` asks it for the system's name at import.

Traced sizes are tracemalloc's, importing ``textual.app`` with and without each stand-in.
Anything else asked of a stand-in loads the real module and answers from it.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import types
from collections.abc import Iterator
from typing import Any


def real_module(name: str) -> types.ModuleType:
    """The real module ``name``, imported now if it is not yet (its stand-in set aside)."""
    if isinstance(sys.modules.get(name), StandIn):
        del sys.modules[name]
    return importlib.import_module(name)


class StandIn(types.ModuleType):
    """A module whose names bound at Textual's import are defined here; any other name loads
    the real module."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(real_module(self.__name__), name)


def _calls_real(module: str, name: str) -> Any:
    """A function that calls the real ``module.name``."""
    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(real_module(module), name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    return call


def _builds_real(module: str, name: str) -> type:
    """A class whose instances are the real ``module.name``'s."""
    def __new__(cls: type, *args: Any, **kwargs: Any) -> Any:
        return getattr(real_module(module), name)(*args, **kwargs)

    return type(name, (), {"__new__": __new__, "__module__": module,
                           "__doc__": f"stands in for {module}.{name} (gputop.tui.textual_fixes.lean_imports)"})


def _command_palette() -> StandIn:
    module = StandIn("textual.command")
    for name in ("CommandPalette", "SimpleProvider", "Hit", "DiscoveryHit"):
        setattr(module, name, _builds_real("textual.command", name))
    module.CommandPalette.is_open = classmethod(  # type: ignore[attr-defined]
        lambda cls, app: real_module("textual.command").CommandPalette.is_open(app))
    # Subclassed at import (textual.theme's ThemeProvider); used only by the palette.
    module.Provider = type("Provider", (), {"__module__": "textual.command"})  # type: ignore[attr-defined]
    module.Hits = module.CommandListItem = object  # type: ignore[attr-defined]  # type aliases
    return module


def _stand_ins() -> dict[str, types.ModuleType | None]:
    platformdirs = StandIn("platformdirs")
    platformdirs.user_downloads_path = _calls_real(  # type: ignore[attr-defined]
        "platformdirs", "user_downloads_path")
    difflib = StandIn("difflib")
    difflib.get_close_matches = _calls_real("difflib", "get_close_matches")  # type: ignore[attr-defined]
    platform = StandIn("platform")
    platform.system = lambda: os.uname().sysname  # type: ignore[attr-defined]
    return {"ssl": None, "textual.command": _command_palette(), "platformdirs": platformdirs,
            "difflib": difflib, "platform": platform}


@contextlib.contextmanager
def lean_imports() -> Iterator[None]:
    """Import the interface inside this block: the modules above that are not loaded yet get
    their stand-in, taken out of ``sys.modules`` again at the end."""
    placed = {name: module for name, module in _stand_ins().items() if name not in sys.modules}
    sys.modules.update(placed)  # type: ignore[arg-type]  # None: import raises ImportError
    try:
        yield
    finally:
        for name, module in placed.items():
            if name in sys.modules and sys.modules[name] is module:
                del sys.modules[name]
