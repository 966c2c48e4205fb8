"""SIGTERM during a capture: export what was recorded, then die of it as the job would have."""

from __future__ import annotations

import os
import threading
from typing import Any


class SigtermExport:
    """Mixed into ``profiling.CaptureController``: it sets ``_sigterm_set``, ``_finishing`` and
    ``_terminated`` and provides ``finish_early``."""

    _sigterm_set: bool
    _finishing: bool
    _terminated: bool

    def finish_early(self, why: str) -> None:  # provided by the controller
        raise NotImplementedError

    # SIGTERM while recording (a launcher tearing the job down because another rank died):
    # when the job has no handler of its own, export the steps recorded so far, then die of
    # SIGTERM as the job would have. Only the main thread may set signal handlers.

    def _catch_sigterm(self) -> None:
        import signal

        try:
            if (threading.current_thread() is threading.main_thread()
                    and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL):
                signal.signal(signal.SIGTERM, self._on_sigterm)
                self._sigterm_set = True
        except (ValueError, OSError):
            pass

    def _restore_sigterm(self) -> None:
        import signal

        if not self._sigterm_set or self._finishing:
            return
        try:
            if (threading.current_thread() is threading.main_thread()
                    and signal.getsignal(signal.SIGTERM) == self._on_sigterm):
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                self._sigterm_set = False
        except (ValueError, OSError):
            pass

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self._terminated = True
        if self._finishing:
            return  # finish_early is exporting: it ends the process when done
        self.finish_early("the process got SIGTERM")
        self._die_if_terminated()

    def _die_if_terminated(self) -> None:
        import signal

        if not self._terminated:
            return
        self._terminated = False
        self._sigterm_set = False
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
