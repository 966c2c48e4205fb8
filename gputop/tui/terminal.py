"""Terminal life: survive the terminal going away (an SSH drop) and leave cleanly.

When the terminal hangs up, writes to it fail with EIO. Textual's output thread would die on
the first such error and its queue would fill, so the app hangs while shutting down. This driver
swallows output errors once the terminal is gone and turns an input error into a clean exit.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from textual.message import Message

try:
    from textual.drivers.linux_driver import LinuxDriver
except ImportError:  # not a Unix system: Textual picks its own driver
    LinuxDriver = None  # type: ignore[assignment,misc]

# After a hangup, give the normal shutdown this long before leaving without it.
HANGUP_GRACE_S = 3.0


class TerminalLost(Message):
    """The terminal stopped answering (read or write failed)."""


class _TerminalOut:
    """The terminal as a file that stops writing, instead of raising, once it has gone."""

    def __init__(self, file: Any) -> None:
        self._file = file
        self.gone = False

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                self._file.write(text)
            except OSError:
                self.gone = True
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self._file.flush()
            except OSError:
                self.gone = True

    def fileno(self) -> int:
        return self._file.fileno()

    def isatty(self) -> bool:
        return True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)


if LinuxDriver is not None:

    class HangupSafeDriver(LinuxDriver):
        def __init__(self, app, **kwargs) -> None:
            super().__init__(app, **kwargs)
            self._file = _TerminalOut(self._file)

        def run_input_thread(self) -> None:
            try:
                super().run_input_thread()
            except OSError:
                self._app.post_message(TerminalLost())

else:  # pragma: no cover - Unix only in practice
    HangupSafeDriver = None  # type: ignore[assignment,misc]


def exit_soon_anyway(code: int, grace: float = HANGUP_GRACE_S) -> None:
    """A last resort after a hangup: if the orderly exit has not finished within ``grace``
    seconds, leave without it (demo stand-ins die with us through PR_SET_PDEATHSIG)."""
    timer = threading.Timer(grace, os._exit, (code,))
    timer.daemon = True
    timer.start()
