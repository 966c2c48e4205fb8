"""The first sample drawn as plain text, before the interface has loaded.

Importing Textual and building the app costs a few tenths of a second of CPU before it can draw
anything (a minimal Textual app's first frame is ~2x nvitop's: measured in
benchmarks/bench_tui.py). The driver opens and the first sample is taken on the early sampler's
thread meanwhile (early_start.py), so the GPUs and their processes are known first: this module
writes them to the terminal's alternate screen at once, as a plain table, and the interface
paints over it when it is ready (it enters the same alternate screen). Nothing here imports
Textual; the table is `gputop snapshot`'s (snapshot_text.py), which escapes what comes from
processes.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from gputop.core.snapshot_text import format_snapshot

if TYPE_CHECKING:
    from gputop.core.model import Snapshot

ENTER = "\x1b[?1049h\x1b[?25l\x1b[H\x1b[2J"  # alternate screen, cursor hidden, cleared
LEAVE = "\x1b[?25h\x1b[?1049l"
# First on the frame's first line (it fits 80 columns): what tells this frame from the interface.
MARK = "gputop: loading the interface..."


def lines(snap: Snapshot, width: int, height: int) -> list[str]:
    """The screen's lines (at most ``height``, each at most ``width`` cells): the mark, then
    the sample as `gputop snapshot` prints it (the host, every GPU, their processes)."""
    text = [MARK, *format_snapshot(snap, width).splitlines()]
    return [line[:width] for line in text[:height]]


class PlainFirstFrame:
    """Paints the first sample once, unless the interface has taken the terminal already."""

    def __init__(self, fd: int, size: Callable[[], os.terminal_size] | None = None) -> None:
        self.fd = fd
        self._size = size or (lambda: os.get_terminal_size(fd))
        self._lock = threading.Lock()
        self._open = True
        self.painted = False

    def paint(self, snap: Snapshot) -> None:
        """From the sampler's thread, with the first sample."""
        with self._lock:
            if not self._open or self.painted:
                return
            try:
                size = self._size()
                text = "\r\n".join(lines(snap, size.columns, size.lines))
                data = (ENTER + text).encode("utf-8", "replace")
                while data:  # a terminal may take it in parts
                    data = data[os.write(self.fd, data):]
                self.painted = True
            except OSError:  # no terminal size, a closed terminal: the interface draws anyway
                self._open = False

    def close(self) -> None:
        """Before the interface starts writing: no paint after this returns."""
        with self._lock:
            self._open = False

    def leave(self) -> None:
        """The interface never started: give the shell its screen back."""
        with self._lock:
            self._open = False
            if self.painted:
                self.painted = False
                try:
                    os.write(self.fd, LEAVE.encode())
                except OSError:
                    pass
