"""What the live monitor's App is made with besides its widgets: the messages its feed posts,
and start-up helpers."""

from __future__ import annotations

import gc
import sys
import threading
from typing import TYPE_CHECKING

from textual.message import Message

from gputop.diagnostics.findings import WHERE_IDS
from gputop.tui.monitor.auto_capture import STALL_IDS
from gputop.tui.textual_fixes.plain_text import PlainText  # noqa: F401  (the apps' NO_COLOR filter)
from gputop.tui.view.frames import Frame

if TYPE_CHECKING:
    from gputop.stacks.where import WhereFinder


def freeze_startup_objects() -> None:
    """Move what start-up built (Textual's DOM, styles, modules: ~90 000 objects) out of the
    garbage collector's sight: each full collection walked them all, ~25 ms every 15 s. A
    tick makes a few thousand short-lived containers: with the default threshold (700) that
    was ~3 young collections a second and a middle one every 4 s; now a tenth as many."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(7000, 10, 10)
    gc.enable()  # `gputop top` starts with it off (commands/top.py)
    threading.Thread(target=preload_views, name="preload-views", daemon=True).start()


# The screens the most used keys open (Enter, ?, k, e): imported on a thread once the first
# frames are up, so that the key's first press opens its screen without importing it first.
VIEWS = ("gputop.tui.screens.process_view", "gputop.tui.screens.help_screen",
         "gputop.tui.screens.confirm_signal", "gputop.tui.screens.env_screen")


def preload_views() -> None:
    import importlib

    for name in VIEWS:
        try:
            importlib.import_module(name)
        except Exception:  # the key imports it again and says what is wrong
            pass


def where_ids(auto_capture: bool) -> frozenset[str]:
    """The findings that get a "where" line (``where_finder``'s)."""
    return WHERE_IDS | STALL_IDS if auto_capture else WHERE_IDS


def where_finder(auto_capture: bool) -> WhereFinder | None:
    """The findings' "where" lines (py-spy), when py-spy is installed; with --auto-capture
    every stall on a process without the agent gets one (stacks stand in for a capture).
    Made by the feed at the first finding in ``where_ids``: the stacks modules load then."""
    from gputop.stacks.pyspy import find_py_spy
    from gputop.stacks.where import WhereFinder

    if find_py_spy() is None:
        return None
    return WhereFinder(ids_without_agent=STALL_IDS if auto_capture else ())


def showing_process(screen) -> bool:
    """Whether ``screen`` is a process's screen (Enter). Its module is
    imported on first use: before that no screen can be one."""
    module = sys.modules.get("gputop.tui.screens.process_view")
    return module is not None and isinstance(screen, module.ProcessScreen)


class FrameReady(Message):
    """A new frame from the sampler. A newer one waiting in the queue replaces it."""

    def __init__(self, frame: Frame) -> None:
        super().__init__()
        self.frame = frame

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, FrameReady)


class SamplerFailed(Message):
    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error

