"""Enter on a process: its own SM share of its GPUs, its GPU memory, its CPU and its DataLoader
workers' CPU over the chosen window, from the history, each with its scale and its maximum in
the window, and the workers listed below."""

from __future__ import annotations

import math

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import Screen

from gputop.core.compile_health import compile_lines
from gputop.core.efficiency import long_lines
from gputop.core.format import bytes_h, pct, safe_text
from gputop.core.model import ProcSample, Snapshot
from gputop.core.process_info import tags
from gputop.tui.view.frames import WINDOW_NAMES, Frame
from gputop.tui.view.rows import groups, short_command
from gputop.tui.widgets.chart import BrailleChart
from gputop.tui.widgets.key_footer import KeyFooter
from gputop.tui.widgets.text_line import TextLine, WrappedText
from gputop.tui.widgets.time_axis import TimeAxis


def cpu_ceiling(values) -> float:
    """CPU charts top out at whole cores (100 % each), the fewest that hold the data."""
    peak = max((x for x in values if x == x), default=0.0)  # NaN: no sample
    return 100.0 * max(1, math.ceil(peak / 100.0))


def find_process(snapshot: Snapshot, pid: int) -> tuple[ProcSample | None, tuple[int, ...]]:
    for group in groups(snapshot):
        if group.proc.pid == pid:
            return group.proc, group.gpus
    return None, ()


_TITLES = {"gpu_sm": "GPU SM (this process)", "gpu_mem": "GPU memory", "cpu": "process CPU",
           "workers_cpu": "DataLoader workers CPU"}


def peak(values) -> float | None:
    """The largest value in a window (NaN: no sample)."""
    return max((x for x in values if x == x), default=None)


class ProcessScreen(Screen[None]):
    DEFAULT_CSS = """
    ProcessScreen { layout: vertical; }
    ProcessScreen #proc-title { height: auto; padding: 0 1; background: $panel; }
    ProcessScreen .chart-box { border: round $secondary; height: 1fr; min-height: 4; }
    ProcessScreen BrailleChart { height: 1fr; }
    ProcessScreen #proc-workers { height: auto; max-height: 10; padding: 0 1; }
    ProcessScreen #proc-efficiency { height: auto; padding: 0 1; }
    """
    BINDINGS = [Binding("escape", "close", "back")]

    def __init__(self, pid: int) -> None:
        super().__init__()
        self.pid = pid
        self.title_line = WrappedText(id="proc-title")  # the whole command, folded
        self.efficiency_line = TextLine(id="proc-efficiency")  # MFU, goodput, J/step (agent)
        self.efficiency_line.display = False
        self.charts = {name: BrailleChart(classes=f"chart chart-{name}")
                       for name in _TITLES}
        self.axes = {name: TimeAxis() for name in _TITLES}
        self.boxes: dict[str, Vertical] = {}
        self.worker_list = TextLine(id="proc-workers")

    def compose(self) -> ComposeResult:
        yield self.title_line
        yield self.efficiency_line
        for name, chart in self.charts.items():
            box = self.boxes[name] = Vertical(chart, self.axes[name], classes="chart-box")
            box.border_title = _TITLES[name]  # the numbers come with the process's series
            yield box
        yield self.worker_list
        yield KeyFooter()

    def on_mount(self) -> None:
        # At once from the frame on screen (its title, command, workers); the charts follow
        # with the next frame, which carries this process's series.
        frame = getattr(self.app, "frame", None)
        if frame is not None:
            self.update_frame(frame)

    def action_close(self) -> None:
        self.dismiss(None)

    def update_frame(self, frame: Frame) -> None:
        proc, gpus = find_process(frame.snapshot, self.pid)
        window = WINDOW_NAMES[frame.window]
        title = Text(f"pid {self.pid}", style="bold")
        if proc is None:
            title.append("  (ended)", style="bold red")
        else:
            gpu_text = ",".join(map(str, gpus)) or "-"
            title.append(f"  {proc.user or '?'}  GPU {gpu_text}  {proc.state or '-'}  ")
            # The whole command line here (the table shortens paths to names).
            title.append(safe_text(proc.cmdline) if proc.cmdline else short_command(proc))
            where = tags(proc)  # MIG device, the other pid, container / pod / Slurm job
            if where:
                title.append(f"  [{where}]", style="dim")
        self.title_line.set_text(title)
        efficiency = proc.efficiency if proc is not None else None
        compiled = proc.compiled if proc is not None else None
        self.efficiency_line.display = efficiency is not None or compiled is not None
        lines = (long_lines(efficiency) if efficiency is not None else []) + (
            compile_lines(compiled) if compiled is not None else [])  # torch.compile
        if lines:
            self.efficiency_line.set_text(Text("\n".join(safe_text(line) for line in lines)))
        series = frame.process
        if series is None or series.pid != self.pid:
            return
        cpu_top = cpu_ceiling(series.cpu[1])
        workers_top = cpu_ceiling(series.workers_cpu[1])
        mem_total = sum(
            g.mem_total or 0 for g in frame.snapshot.gpus if g.index in gpus
        ) or None
        now_cpu = pct(proc.cpu_percent) if proc else "n/a"
        now_workers = pct(proc.tree_cpu_percent - (proc.cpu_percent or 0)) if proc else "n/a"
        now_sm = pct(proc.sm_util) if proc else "n/a"

        def most(values, text) -> str:
            top = peak(values)
            return f", max {text(top)}" if top is not None else ""

        self.boxes["gpu_sm"].border_title = (
            f"GPU SM (this process) {now_sm}  (0-100 %{most(series.gpu_sm[1], pct)}, {window})")
        self.boxes["gpu_mem"].border_title = (
            f"GPU memory {bytes_h(proc.gpu_mem) if proc else 'n/a'}  "
            f"(0-{bytes_h(mem_total)}{most(series.gpu_mem[1], bytes_h)}, {window})")
        self.boxes["cpu"].border_title = (
            f"process CPU {now_cpu}  (0-{cpu_top:.0f} %{most(series.cpu[1], pct)}, {window})")
        self.boxes["workers_cpu"].border_title = (
            f"DataLoader workers CPU, total {now_workers}  "
            f"(0-{workers_top:.0f} %{most(series.workers_cpu[1], pct)}, {window})")
        for axis in self.axes.values():
            axis.set_span(frame.end - frame.start)
        self.charts["gpu_sm"].set_series(*series.gpu_sm, frame.start, frame.end, 100.0)
        self.charts["cpu"].set_series(*series.cpu, frame.start, frame.end, cpu_top)
        self.charts["workers_cpu"].set_series(*series.workers_cpu, frame.start, frame.end,
                                              workers_top)
        self.charts["gpu_mem"].set_series(*series.gpu_mem, frame.start, frame.end, mem_total)
        lines = Text()
        if proc is not None:
            if not proc.workers:
                lines.append("no DataLoader workers", style="dim")
            for i, w in enumerate(proc.workers):
                if i:
                    lines.append("\n")
                lines.append(f"{w.pid:>7}  {safe_text(w.name):<16} CPU {pct(w.cpu_percent):>5}  "
                             f"RSS {bytes_h(w.rss):>6}  {w.state}")
        self.worker_list.set_text(lines)
