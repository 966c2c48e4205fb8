"""`Enter` on the fleet screen: one node in full, from its stream: its GPUs (one line each, with
charts of the samples seen since the fleet started), host, processes and findings. The charts
come from a small History kept only while this screen is open."""

from __future__ import annotations

import time

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.screen import Screen

from gputop.core.history import History
from gputop.core.model import Snapshot
from gputop.fleet.monitor import NodeView
from gputop.tui.view.fleet_rows import fleet_findings, state_text
from gputop.tui.view.frames import build_frame
from gputop.tui.view.layout import CARD_MIN_HEIGHT, Plan
from gputop.tui.view.severity import worst_severity
from gputop.tui.widgets.findings import FindingsPanel
from gputop.tui.widgets.gpu_panel import GpuPanel
from gputop.tui.widgets.host_panel import HostPanel
from gputop.tui.widgets.key_footer import KeyFooter
from gputop.tui.widgets.process_table import ProcessTable
from gputop.tui.widgets.text_line import TextLine

CHART_WINDOW_S = 60.0


def node_title(view: NodeView, width: int) -> Text:
    text = Text(f" {view.host}", style="bold")
    snap = view.snapshot
    if view.remote_hostname and view.remote_hostname != view.host:
        text.append(f" ({view.remote_hostname})")
    if snap is not None:
        d = snap.driver
        drv = (f"driver {d.driver_version or 'n/a'}  CUDA {d.cuda_version or 'n/a'}" if d.available
               else f"no GPU driver: {d.error}")
        if d.simulated:
            drv += f"  (simulated: {d.simulated})"
        text.append(f"  {drv}")
    if view.remote_version:
        text.append(f"  gputop {view.remote_version}", style="dim")
    if view.live and snap is not None:
        text.append(f"  {time.strftime('%H:%M:%S', time.localtime(snap.time))}")
        if view.state != "up":
            text.append(f"  {state_text(view, time.monotonic())}", style="yellow")
    else:
        text.append(f"  {state_text(view, time.monotonic())}", style="bold red")
    text.truncate(width)
    return text


class NodeScreen(Screen[None]):
    DEFAULT_CSS = """
    NodeScreen { layout: vertical; }
    NodeScreen #node-title { height: 1; background: $panel; }
    NodeScreen #node-gpus { height: auto; max-height: 12; }
    NodeScreen #node-host { padding: 0 1; background: $boost; }
    NodeScreen #node-lower { height: 1fr; }
    NodeScreen #node-processes { width: 1fr; height: 1fr; }
    NodeScreen #node-findings { width: 56; height: 1fr; }
    """
    BINDINGS = [
        Binding("escape,q", "close", "Back"),
        Binding("p", "capture", "Capture"),
    ]

    def __init__(self, host: str, recent: list[Snapshot]) -> None:
        super().__init__()
        self.host = host
        self.history = History(raw_capacity=int(CHART_WINDOW_S * 4))
        for snap in recent:
            self.history.record(snap)
        self.seq = -1
        self.view: NodeView | None = None
        self.title_line = TextLine(id="node-title")
        self.gpu_panel = GpuPanel(id="node-gpus")  # one line per GPU, as the compact monitor
        self.host_panel = HostPanel(id="node-host")
        self.table = ProcessTable(id="node-processes")
        self.findings = FindingsPanel(id="node-findings")
        self.gpu_count = -1
        self.mounted = False

    def compose(self) -> ComposeResult:
        yield self.title_line
        yield self.gpu_panel
        yield self.host_panel
        with Horizontal(id="node-lower"):
            yield self.table
            yield self.findings
        yield KeyFooter()

    def on_mount(self) -> None:
        self.mounted = True
        self.table.focus()

    def show_view(self, view: NodeView) -> None:
        """The node's newest state (called by the fleet app on every change)."""
        self.view = view
        if not self.mounted:  # the screen is not mounted yet: show it once it is
            self.call_after_refresh(self._show_latest)
            return
        self.title_line.set_text(node_title(view, max(20, self.size.width)))
        snap = view.snapshot
        if snap is None or view.seq == self.seq:
            return
        self.seq = view.seq
        self.history.record(snap)
        n = len(snap.gpus)
        if n != self.gpu_count:
            self.gpu_count = n
            lines = min(12, max(1, n))
            self.gpu_panel.styles.height = lines
            self.gpu_panel.set_plan(Plan(True, 1, CARD_MIN_HEIGHT, lines, False))
        frame = build_frame(self.history, snap, CHART_WINDOW_S, view.seq)
        findings = fleet_findings([view]) if view.live else []
        self.gpu_panel.show(snap.gpus, frame.gpu_series, frame.start, frame.end)
        self.gpu_panel.set_marks(worst_severity(findings, lambda f: f.gpu))
        self.host_panel.update_host(snap.host)
        self.table.update_snapshot(snap)
        self.table.set_marks(worst_severity(findings, lambda f: f.pid))
        self.findings.update_findings(findings)

    def _show_latest(self) -> None:
        if self.view is not None and self.is_attached:
            self.show_view(self.view)

    def selected_pid(self) -> int | None:
        row = self.table.selected_row()
        if row is None:
            return None
        return row.parent if row.parent is not None else row.pid

    def action_capture(self) -> None:
        pid = self.selected_pid()
        if pid is None:
            self.app.notify("no process selected", severity="warning", timeout=3)
            return
        self.app.start_remote_capture(self.host, pid)

    def action_close(self) -> None:
        self.dismiss(None)
