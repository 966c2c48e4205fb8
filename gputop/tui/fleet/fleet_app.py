"""The fleet screen: every node of a job on one screen, over ssh.

The ``FleetMonitor`` (gputop.fleet.monitor) keeps one `ssh NODE gputop stream` per node on its
own I/O thread and posts ``FleetChanged`` when a node has news; consecutive ones collapse, and
the handler rebuilds the rows and the ranked findings from immutable node views. Nothing on the
event loop reads a pipe or waits on ssh: a remote capture (`p`) runs in a thread worker.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Sequence

from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.worker import get_current_worker

from gputop.core.format import safe_text
from gputop.fleet.monitor import FleetMonitor
from gputop.fleet.ssh import SshSettings
from gputop.tui.screens.node_screen import NodeScreen
from gputop.tui.screens.remote_diagnosis import RemoteDiagnosisScreen
from gputop.tui.textual_fixes.plain_text import PlainText
from gputop.tui.textual_fixes.terminal import HangupSafeDriver, TerminalLost, exit_soon_anyway
from gputop.tui.view.fleet_rows import (
    FindingRows,
    RowCache,
    fleet_findings,
    header_text,
    host_width,
    summary_text,
)
from gputop.tui.widgets.fleet_table import FleetTable
from gputop.tui.widgets.key_footer import KeyFooter
from gputop.tui.widgets.text_line import TextLine

CAPTURE_STEPS = 3
FINDINGS_MIN = 8
# Nodes' samples arrive spread over each interval: draw at most this often (a finding waits
# at most this long), not once per node.
RENDER_MIN_S = 0.2
# Findings whose numbers alone changed are redrawn this often (their evidence is a 10 s
# window); a finding that raises, clears or changes severity shows at the next frame.
FINDINGS_PERIOD = 4.9


class FleetChanged(Message):
    """A node has news. A newer one waiting in the queue replaces it."""

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, FleetChanged)


class FleetApp(App[int]):
    TITLE = "gputop fleet"
    ENABLE_COMMAND_PALETTE = False
    CSS = """
    Screen { layout: vertical; }
    #fleet-summary { height: 1; background: $panel; }
    #fleet-header { height: 1; }
    #fleet-findings { height: 1fr; min-height: 6; border: round $secondary; }
    #fleet-status { display: none; height: 1; padding: 0 1; background: $boost; }
    """
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True),
        Binding("p", "capture", "Capture"),
        Binding("r", "retry", "Retry node"),
        Binding("tab", "focus_next", "Nodes/findings"),
    ]

    def __init__(self, hosts: Sequence[str], settings: SshSettings, interval: float = 1.0,
                 frame_log: str | None = None) -> None:
        super().__init__(driver_class=HangupSafeDriver)
        self.hosts = list(hosts)
        self.settings = settings
        self.interval = interval
        self.monitor = FleetMonitor(self.hosts, settings, interval, on_change=self._changed)
        self.summary = TextLine(id="fleet-summary")
        self.header = TextLine(id="fleet-header")
        self.table = FleetTable(id="fleet-nodes")
        self.findings = FleetTable(id="fleet-findings")
        self.status = TextLine(id="fleet-status")
        self.captures: dict[tuple[str, int], float] = {}
        self.renders = 0
        self.frame_log = frame_log  # benchmarks: when each finding was first drawn
        self._findings_seen: set[tuple] = set()
        self._findings_key: tuple | None = None
        self._findings_evidence: tuple | None = None
        self._findings_drawn = 0.0
        self._last_render = 0.0
        self._render_timer = None
        self.row_cache = RowCache()
        self.finding_rows = FindingRows()
        self._status_timer = None
        self._table_height = -1
        self._leaving = False

    def compose(self) -> ComposeResult:
        yield self.summary
        yield self.header
        yield self.table
        yield self.status
        yield self.findings
        yield KeyFooter()

    def get_line_filters(self):
        if self.no_color:
            return [PlainText()]
        return super().get_line_filters()

    def on_resize(self, _event) -> None:
        # The App stores its new size after this handler: lay out once it has.
        self._table_height = -1
        self.call_after_refresh(self.render_fleet)

    def on_mount(self) -> None:
        self.findings.border_title = "findings of every node"
        self.table.focus()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGHUP, signal.SIGTERM):
            try:
                loop.add_signal_handler(signum, self._on_terminal_signal, signum)
            except (RuntimeError, ValueError, NotImplementedError):
                pass
        self.monitor.start()
        self.render_fleet()
        # Countdowns ("retry in 4 s", "no data for 12 s") move without news from the nodes.
        self.set_interval(1.0, self.render_fleet)

    def _changed(self) -> None:
        """On the monitor's thread: only post (thread-safe); the UI thread does the rest."""
        if not self._leaving:
            self.post_message(FleetChanged())

    def on_fleet_changed(self, _message: FleetChanged) -> None:
        if self._render_timer is not None:
            return  # a frame is already due
        wait = self._last_render + RENDER_MIN_S - time.monotonic()
        if wait <= 0:
            self.render_fleet()
        else:
            self._render_timer = self.set_timer(wait, self._due_render)

    def _due_render(self) -> None:
        self._render_timer = None
        self.render_fleet()

    def render_fleet(self) -> None:
        if self._leaving:
            return
        now = time.monotonic()
        self._last_render = now
        views = self.monitor.views()
        width = max(40, self.size.width)
        self.renders += 1
        self.summary.set_text(summary_text(views, self.interval, width))
        self.header.set_text(header_text(width - 1, host_width(self.hosts)))
        rows = self.row_cache.rows(views, width - 1, now)
        self._fit_table(len(rows))
        self.table.update_rows(rows)
        findings = fleet_findings(views)
        key = tuple((f.host, f.id, f.gpu, f.pid, f.severity) for f in findings)
        evidence = tuple(f.evidence for f in findings)
        if key != self._findings_key or (evidence != self._findings_evidence
                                         and now - self._findings_drawn >= FINDINGS_PERIOD):
            self._findings_key, self._findings_evidence = key, evidence
            self._findings_drawn = now
            self.findings.update_rows(self.finding_rows.rows(findings, max(20, width - 4)))
            self.findings.border_title = (f"findings of every node ({len(findings)})"
                                          if findings else "findings of every node")
            if self.frame_log:
                self.call_after_refresh(self._log_findings, findings)
        if isinstance(self.screen, NodeScreen):
            view = self.monitor.view(self.screen.host)
            if view is not None:
                self.screen.show_view(view)

    def _fit_table(self, n_rows: int) -> None:
        """As tall as its rows, leaving the findings at least FINDINGS_MIN lines; a change of
        height re-lays out the screen, so only when the number of rows changes."""
        room = self.size.height - 4 - FINDINGS_MIN  # summary, header, status, footer
        height = max(3, min(n_rows, room))
        if height != self._table_height:
            self._table_height = height
            self.table.styles.height = height

    def _log_findings(self, findings) -> None:
        """Benchmarks: the wall time each finding was first on screen (after the refresh)."""
        now = time.time()
        new = [f for f in findings if (f.host, f.id, f.gpu) not in self._findings_seen]
        if not new:
            return
        with open(self.frame_log, "a", encoding="utf-8") as out:
            for f in new:
                self._findings_seen.add((f.host, f.id, f.gpu))
                out.write(f"{now:.3f} {f.host} {f.id} {f.gpu}\n")

    # -- keys --------------------------------------------------------------------------------

    def on_fleet_table_chosen(self, message: FleetTable.Chosen) -> None:
        """Enter on a node's row, or on a finding: that node's screen."""
        host = message.row.host
        if not host:
            return
        screen = NodeScreen(host, self.monitor.recent(host))
        self.push_screen(screen)
        view = self.monitor.view(host)
        if view is not None:
            self.call_after_refresh(screen.show_view, view)

    def _focused_row(self):
        """The row under the cursor of the focused list (nodes or findings)."""
        table = self.findings if self.findings.has_focus else self.table
        row = table.selected()
        return row if row is not None and row.host else None

    def action_retry(self) -> None:
        row = self._focused_row()
        if row is not None:
            self.monitor.retry_now(row.host)
            self.notify(f"{row.host}: trying again now", timeout=2)

    def action_capture(self) -> None:
        """`p` on a GPU row: capture the training process on that GPU (the one with the gputop
        agent if there is one)."""
        row = self._focused_row()
        if row is None:
            return
        view = self.monitor.view(row.host)
        snap = view.snapshot if view is not None and view.live else None
        if snap is None:
            self.notify(f"{row.host} is not streaming", severity="warning", timeout=4)
            return
        procs = [p for g in snap.gpus if row.gpu is None or g.index == row.gpu
                 for p in g.processes if p.visible]
        if row.gpu is None:  # a node without GPUs: its training processes with an agent
            procs += list(snap.other_processes)
        if not procs:
            where = f"GPU {row.gpu} of {row.host}" if row.gpu is not None else row.host
            self.notify(f"no process on {where}", severity="warning", timeout=4)
            return
        chosen = max(procs, key=lambda p: (p.agent is not None, p.gpu_mem or 0))
        self.start_remote_capture(row.host, chosen.pid)

    def start_remote_capture(self, host: str, pid: int) -> None:
        if (host, pid) in self.captures:
            self.notify(f"a capture of pid {pid} on {host} is already running",
                        severity="warning", timeout=4)
            return
        self.captures[(host, pid)] = time.monotonic()
        self.notify(f"asking {host} to capture {CAPTURE_STEPS} steps of pid {pid}", timeout=4)
        self._show_status()
        self._remote_capture(host, pid)

    def _show_status(self) -> None:
        """The line above the findings while captures run, with the elapsed seconds."""
        if not self.captures:
            self.status.display = False
            if self._status_timer is not None:
                self._status_timer.stop()
                self._status_timer = None
            return
        now = time.monotonic()
        parts = [f"capture of pid {pid} on {host}: {now - t:.0f} s"
                 for (host, pid), t in self.captures.items()]
        self.status.set_text(Text("◷ " + "   ".join(parts), style="bold"))
        self.status.display = True
        if self._status_timer is None:
            self._status_timer = self.set_interval(1.0, self._show_status)

    @work(thread=True, group="capture", exit_on_error=False)
    def _remote_capture(self, host: str, pid: int) -> None:
        from gputop.fleet.capture import RemoteCaptureError, run_remote_capture

        worker = get_current_worker()
        try:
            result = run_remote_capture(self.settings, host, pid, CAPTURE_STEPS,
                                        should_stop=lambda: worker.is_cancelled)
        except RemoteCaptureError as exc:
            if not worker.is_cancelled:
                self.call_from_thread(self._capture_failed, host, pid, str(exc))
            return
        except Exception as exc:  # one line, never a traceback on screen
            if not worker.is_cancelled:
                self.call_from_thread(self._capture_failed, host, pid,
                                      f"{type(exc).__name__}: {exc}")
            return
        if not worker.is_cancelled:
            self.call_from_thread(self._capture_done, host, pid, result)

    def _capture_failed(self, host: str, pid: int, message: str) -> None:
        self.captures.pop((host, pid), None)
        self._show_status()
        self.notify(safe_text(" ".join(message.split())), severity="error", timeout=10)

    def _capture_done(self, host: str, pid: int, result) -> None:
        self.captures.pop((host, pid), None)
        self._show_status()
        self.push_screen(RemoteDiagnosisScreen(result))

    # -- leaving -----------------------------------------------------------------------------

    def action_quit(self) -> None:
        self._leaving = True
        self.monitor.stop(timeout=0)  # the ssh processes end on the I/O thread
        self.exit(0)

    def _on_terminal_signal(self, signum: int) -> None:
        self._leaving = True
        self.monitor.stop(timeout=0)
        exit_soon_anyway(128 + signum)
        self.exit(128 + signum)

    def on_terminal_lost(self, _message: TerminalLost) -> None:
        self._on_terminal_signal(signal.SIGHUP)

    def on_unmount(self) -> None:
        self._leaving = True
        self.monitor.stop(timeout=0)
