"""What the live monitor's App is made with besides its widgets: the messages its feed posts,
the NO_COLOR line filter, and start-up helpers."""

from __future__ import annotations

import gc
import sys
from typing import TYPE_CHECKING

from rich.segment import Segment
from textual.filter import LineFilter
from textual.message import Message

from gputop.diagnostics.findings import WHERE_IDS
from gputop.tui.auto_capture import STALL_IDS
from gputop.tui.frames import Frame

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
    module = sys.modules.get("gputop.tui.widgets.process_view")
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


class PlainText(LineFilter):
    """NO_COLOR: drop every style, not just the colours. Textual's own filter keeps grey
    tones, and any attribute (bold, reverse) makes terminals emit colour resets too."""

    def apply(self, segments: list[Segment], background) -> list[Segment]:
        return [Segment(text, None, control) for text, _, control in segments]
