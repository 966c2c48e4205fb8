"""`gputop --prometheus URL`: the jobs of the fleet, wasters first; Enter on a job: its nodes;
Enter on a node: its GPUs with charts from ``query_range``.

The ``PromFleetMonitor`` reads Prometheus on its own thread and posts ``PromChanged``; the
handler redraws from its immutable state. While the server does not answer, the last data
stays on screen, dimmed, with its age and the time of the next try. `p` on a node falls back
to the ssh capture of `--hosts` when the node runs gputop and --hosts names it.
"""

from __future__ import annotations

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen

from gputop.core.format import safe_text
from gputop.fleet.prometheus.client import PromClient
from gputop.fleet.prometheus.monitor import PromFleetMonitor
from gputop.fleet.prometheus.sources import Filters
from gputop.tui.textual_fixes.plain_text import PlainText
from gputop.tui.textual_fixes.terminal import HangupSafeDriver
from gputop.tui.view.prom_rows import (
    finding_lines,
    gpu_rows,
    job_header,
    job_rows,
    job_title,
    node_rows,
    note_rows,
    summary_text,
)
from gputop.tui.widgets.fleet_table import FleetTable
from gputop.tui.widgets.key_footer import KeyFooter
from gputop.tui.widgets.text_line import TextLine


class PromChanged(Message):
    def can_replace(self, message: Message) -> bool:
        return isinstance(message, PromChanged)


class _Level(Screen[None]):
    """A job's nodes, or a node's GPUs: a title, rows, and back with q/Escape."""

    DEFAULT_CSS = """
    _Level { layout: vertical; }
    _Level #level-title { height: 1; background: $panel; }
    """
    BINDINGS = [Binding("escape,q", "close", "Back"), Binding("p", "capture", "Capture")]

    def __init__(self, kind: str, key: str) -> None:
        super().__init__()
        self.kind, self.key = kind, key
        self.title_line = TextLine(id="level-title")
        self.table = FleetTable(id="level-rows")

    def compose(self) -> ComposeResult:
        yield self.title_line
        yield self.table
        yield KeyFooter()

    def on_mount(self) -> None:
        self.table.focus()
        self.app.call_after_refresh(self.app.render_fleet)  # type: ignore[attr-defined]

    def action_close(self) -> None:
        self.app.pop_screen()

    def action_capture(self) -> None:
        row = self.table.selected()
        instance = self.key if self.kind == "node" else (row.host if row is not None else "")
        self.app.capture_node(instance)  # type: ignore[attr-defined]

    def on_fleet_table_chosen(self, message: FleetTable.Chosen) -> None:
        message.stop()
        if self.kind == "job" and message.row.host:
            self.app.push_screen(_Level("node", message.row.host))


class PromFleetApp(App[int]):
    TITLE = "gputop fleet (prometheus)"
    ENABLE_COMMAND_PALETTE = False
    CSS = """
    Screen { layout: vertical; }
    #prom-summary { height: 1; background: $panel; }
    #prom-header { height: 1; }
    """
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True),
    ]

    def __init__(self, client: PromClient, filters: Filters, interval: float = 1.0,
                 ssh=None) -> None:
        super().__init__(driver_class=HangupSafeDriver)
        self.client = client
        self.ssh = ssh  # (hosts, SshSettings) from --hosts, for `p`
        self.monitor = PromFleetMonitor(client, filters, interval, on_change=self._changed)
        self.summary = TextLine(id="prom-summary")
        self.header = TextLine(id="prom-header")
        self.table = FleetTable(id="prom-jobs")
        self._leaving = False

    def compose(self) -> ComposeResult:
        yield self.summary
        yield self.header
        yield self.table
        yield KeyFooter()

    def get_line_filters(self):
        if self.no_color:
            return [PlainText()]
        return super().get_line_filters()

    def on_mount(self) -> None:
        self.table.focus()
        self.monitor.start()
        self.render_fleet()
        self.set_interval(1.0, self.render_fleet)  # the age of the data moves on its own

    def _changed(self) -> None:
        if not self._leaving:
            self.post_message(PromChanged())

    def on_prom_changed(self, _message: PromChanged) -> None:
        self.render_fleet()

    def render_fleet(self) -> None:
        if self._leaving:
            return
        state = self.monitor.state()
        width = max(40, self.size.width) - 1
        dim = not state.ok and state.data_time is not None
        self.summary.set_text(summary_text(state, self.client.shown, width))
        self.header.set_text(job_header(width))
        self.table.update_rows(job_rows(state.jobs, width, dim))
        screen = self.screen
        if not isinstance(screen, _Level):
            return
        if screen.kind == "job":
            job = next((j for j in state.jobs if j.key == screen.key), None)
            if job is None:
                return
            screen.title_line.set_text(job_title(job, width))
            rows = node_rows(job, state.nodes, width, dim)
            if job.straggler:
                from rich.text import Text

                from gputop.tui.view.fleet_rows import FleetRow

                rows.append(FleetRow(("straggler", None), "", None,
                                     Text(f"straggler: {job.straggler}", style="yellow")))
            rows += finding_lines(job.findings, width)
            screen.table.update_rows(rows)
        else:
            node = state.nodes.get(screen.key)
            if node is None:
                return
            from rich.text import Text

            title = Text(f" {node.host} · {node.source} · {len(node.gpus)} GPUs · "
                         f"{node.instance} · utilization charts: the last 30 min",
                         style="bold")
            title.truncate(width)
            screen.title_line.set_text(title)
            if screen.key not in self.monitor.charts:
                self.monitor.want_chart(screen.key)
            rows = gpu_rows(node, self.monitor.charts.get(screen.key, {}), width, dim)
            rows += finding_lines(node.findings, width) + note_rows(node.notes, width)
            screen.table.update_rows(rows)

    def on_fleet_table_chosen(self, message: FleetTable.Chosen) -> None:
        if message.row.host:
            self.push_screen(_Level("job", message.row.host))

    def capture_node(self, instance: str) -> None:
        """`p` on a node: the ssh capture of `--hosts`, when it can reach gputop there."""
        node = self.monitor.state().nodes.get(instance)
        if node is None:
            return
        if node.source != "gputop":
            self.notify(f"{node.host} runs dcgm-exporter only: no gputop there to capture "
                        "with", severity="warning", timeout=6)
            return
        hosts = self.ssh[0] if self.ssh else []
        if node.host not in hosts:
            self.notify(f"{node.host}: a capture goes over ssh; add --hosts {node.host} "
                        "(gputop --prometheus URL --hosts ...) to capture from here",
                        severity="warning", timeout=8)
            return
        row = self.screen.table.selected() if isinstance(self.screen, _Level) else None
        gpu = row.gpu if row is not None and row.host == instance else None
        self.notify(f"asking {node.host} (ssh) which process holds the GPU, then capturing "
                    "3 steps", timeout=6)
        self._capture(node.host, gpu)

    @work(thread=True, group="capture", exit_on_error=False)
    def _capture(self, host: str, gpu: int | None) -> None:
        from gputop.fleet.capture import RemoteCaptureError
        from gputop.fleet.prometheus.capture import capture_node

        try:
            result = capture_node(self.ssh[1], host, gpu)
        except RemoteCaptureError as exc:
            self.call_from_thread(self.notify, safe_text(str(exc)), severity="error",
                                  timeout=10)
            return
        except Exception as exc:  # one line, never a traceback on screen
            self.call_from_thread(self.notify, safe_text(f"{type(exc).__name__}: {exc}"),
                                  severity="error", timeout=10)
            return
        from gputop.tui.screens.remote_diagnosis import RemoteDiagnosisScreen

        self.call_from_thread(self.push_screen, RemoteDiagnosisScreen(result))

    def action_quit(self) -> None:  # type: ignore[override]
        self._leaving = True
        self.monitor.stop(timeout=0)
        self.exit(0)

    def on_unmount(self) -> None:
        self._leaving = True
        self.monitor.stop(timeout=0)
