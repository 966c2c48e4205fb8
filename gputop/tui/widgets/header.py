"""The top line: host, driver and CUDA versions, interval, chart window, live or paused, time.

The time is the snapshot's, not the wall clock's, so a paused screen shows when it was taken and
snapshot tests are deterministic.
"""

from __future__ import annotations

import time

from rich.text import Text

from gputop.core.model import Snapshot
from gputop.tui.view.frames import WINDOW_NAMES
from gputop.tui.widgets.text_line import StripWidget

SHORT_WINDOW = {60.0: "1m", 600.0: "10m", 3600.0: "1h", None: "run"}


def _parts(snap: Snapshot | None, interval: float, window: float | None, status: str,
           short: bool) -> list[str]:
    parts: list[str] = []
    if snap is not None:
        d = snap.driver
        parts.append(snap.host.hostname)
        if d.available:
            parts.append(f"{'drv' if short else 'driver'} {d.driver_version or 'n/a'}")
            parts.append(f"CUDA {d.cuda_version or 'n/a'}")
        else:
            parts.append("no GPU driver")
        if d.simulated:
            parts.append(f"demo: {d.simulated}")
    elif status:
        parts.append(status)
    if short:
        parts.append(f"{interval:g}s  {SHORT_WINDOW[window]}")
    else:
        parts.append(f"every {interval:g}s")
        parts.append(f"window {WINDOW_NAMES[window]}")
    return parts


def header_text(snap: Snapshot | None, interval: float, window: float | None, paused: bool,
                width: int, status: str = "", replay: str | None = None) -> Text:
    """The long form when it fits, else a short one, cut at the end as a last resort.
    ``replay``: a recording's position ("12/300") shows instead of LIVE."""
    if replay is not None:
        state = Text(f" {'PAUSED' if paused else 'REPLAY'} {replay} ",
                     style="bold reverse yellow" if paused else "bold reverse cyan")
    elif paused:
        state = Text(" PAUSED ", style="bold reverse yellow")
    else:
        state = Text(" LIVE ", style="bold green")
    stamp = time.strftime("%H:%M:%S", time.localtime(snap.time)) if snap else "--:--:--"
    text = Text("gputop ", style="bold")
    room = width - text.cell_len - state.cell_len - len(stamp) - 2
    body = "  ".join(_parts(snap, interval, window, status, short=False))
    if len(body) > room:
        body = "  ".join(_parts(snap, interval, window, status, short=True))
    if len(body) > room:
        body = body[: max(0, room - 1)] + "…"
    text.append(body)
    text.append(" " * max(1, room - len(body) + 1))
    text.append_text(state)
    text.append(" " + stamp)
    return text


class StatusHeader(StripWidget):
    DEFAULT_CSS = """
    StatusHeader { width: 1fr; height: 1; background: $panel; }
    """

    def __init__(self, interval: float, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.interval = interval
        self.snapshot: Snapshot | None = None
        self.window: float | None = 60.0
        self.paused = False
        self.status = "starting…"
        self.replay_position: str | None = None  # a recording played back: "12/300"

    def show(self, snapshot: Snapshot | None, window: float | None, paused: bool) -> None:
        self.snapshot = snapshot or self.snapshot
        self.window = window
        self.paused = paused
        self.rebuild()

    def rebuild(self) -> None:
        if self.size.width > 0:
            self.show_text(header_text(self.snapshot, self.interval, self.window, self.paused,
                                       self.size.width, self.status, self.replay_position))
