"""`k` in the live monitor: a signal (TERM, INT or KILL) to the selected process or to the
tagged ones, once chosen and confirmed, sent off the event loop."""

from __future__ import annotations

import signal
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gputop.tui.view.rows import groups

if TYPE_CHECKING:
    from textual.app import App


def ask_and_signal(app: App[Any], row: Any, tagged: Sequence[Any] = ()) -> None:
    """Ask which signal, then send it to ``row``'s process, or to every row of ``tagged``
    when some are (a thread worker)."""
    targets = [r for r in tagged if r is not None] or ([row] if row is not None else [])
    if not targets:
        app.notify("no process selected", severity="warning", timeout=3)
        return
    hidden = [r.pid for r in targets if not r.visible]
    if hidden:
        app.notify(f"pid {hidden[0]} is not visible from here (another pid namespace)",
                   severity="warning")
        return
    cells = targets[0].cells
    description = f"{cells['command']}  (user {cells['user'] or '?'}, GPU {cells['gpu']})"
    if len(targets) > 1:
        description = "pids " + ", ".join(str(r.pid) for r in targets[:12]) + (
            ", …" if len(targets) > 12 else "") + "; first: " + description
    create_times = {r.pid: _create_time(app, r.pid) for r in targets}

    def answered(name: str | None) -> None:
        if name:
            signum = signal.Signals[name]
            for pid, created in create_times.items():
                app.run_worker(lambda pid=pid, created=created: _send_signal(
                    app, pid, created, signum), thread=True, group="actions",
                    exit_on_error=False)

    # Imported on `k`: its buttons bring in widget modules the start-up does not need.
    from gputop.tui.screens.confirm_signal import ConfirmSignalScreen

    app.push_screen(ConfirmSignalScreen(targets[0].pid, description, count=len(targets)),
                    callback=answered)


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
