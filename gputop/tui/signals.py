"""`k` in the live monitor: SIGTERM to the selected process, once confirmed, off the event loop."""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING, Any

from gputop.tui.rows import groups

if TYPE_CHECKING:
    from textual.app import App


def ask_and_signal(app: App[Any], row: Any) -> None:
    """Ask to confirm, then send SIGTERM to ``row``'s process (a thread worker)."""
    if row is None:
        app.notify("no process selected", severity="warning", timeout=3)
        return
    if not row.visible:
        app.notify(f"pid {row.pid} is not visible from here (another pid namespace)",
                   severity="warning")
        return
    cells = row.cells
    description = f"{cells['command']}  (user {cells['user'] or '?'}, GPU {cells['gpu']})"
    create_time = _create_time(app, row.pid)

    def answered(send: bool | None) -> None:
        if send:
            app.run_worker(lambda: _send_signal(app, row.pid, create_time, signal.SIGTERM),
                           thread=True, group="actions", exit_on_error=False)

    # Imported on `k`: its buttons bring in widget modules the start-up does not need.
    from gputop.tui.widgets.confirm_signal import ConfirmSignalScreen

    app.push_screen(ConfirmSignalScreen(row.pid, description), callback=answered)


def _create_time(app: Any, pid: int) -> float | None:
    frame = getattr(app, "frame", None)
    if frame is None:
        return None
    for group in groups(frame.snapshot):
        if group.proc.pid == pid:
            return group.proc.create_time
    return None


def _send_signal(app: App[Any], pid: int, create_time: float | None, signum: int) -> None:
    import psutil

    name = signal.Signals(signum).name
    try:
        proc = psutil.Process(pid)
        # The pid may have been reused since the row was drawn: check it is the same one.
        if create_time is not None and abs(proc.create_time() - create_time) > 0.01:
            raise psutil.NoSuchProcess(pid)
        proc.send_signal(signum)
    except psutil.NoSuchProcess:
        app.call_from_thread(app.notify, f"pid {pid} has already ended", severity="warning")
    except (psutil.AccessDenied, PermissionError):
        app.call_from_thread(app.notify, f"not allowed to signal pid {pid}", severity="error")
    else:
        app.call_from_thread(app.notify, f"sent {name} to pid {pid}")
