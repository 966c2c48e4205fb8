"""Enter on a process: its CPU, its DataLoader workers' CPU and its GPU memory over the chosen
window, from the history, with the workers listed below."""

from __future__ import annotations

import math

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import Screen

from gputop.compile_health import compile_lines
from gputop.efficiency import long_lines
from gputop.format import bytes_h, pct, safe_text
from gputop.model import ProcSample, Snapshot
from gputop.process_info import tags
from gputop.tui.frames import WINDOW_NAMES, Frame
from gputop.tui.rows import groups, short_command
from gputop.tui.widgets.chart import BrailleChart
from gputop.tui.widgets.key_footer import KeyFooter
from gputop.tui.widgets.text_line import TextLine


def cpu_ceiling(values) -> float:
    """CPU charts top out at whole cores (100 % each), the fewest that hold the data."""
    peak = max((x for x in values if x == x), default=0.0)  # NaN: no sample
    return 100.0 * max(1, math.ceil(peak / 100.0))


def find_process(snapshot: Snapshot, pid: int) -> tuple[ProcSample | None, tuple[int, ...]]:
    for group in groups(snapshot):
        if group.proc.pid == pid:
            return group.proc, group.gpus
    return None, ()


class ProcessScreen(Screen[None]):
    DEFAULT_CSS = """
    ProcessScreen { layout: vertical; }
    ProcessScreen #proc-title { height: auto; padding: 0 1; background: $panel; }
    ProcessScreen .chart-box { border: round $secondary; height: 1fr; min-height: 3; }
    ProcessScreen BrailleChart { height: 1fr; }
    ProcessScreen #proc-workers { height: auto; max-height: 10; padding: 0 1; }
    ProcessScreen #proc-efficiency { height: auto; padding: 0 1; }
    """
    BINDINGS = [Binding("escape", "close", "back")]

    def __init__(self, pid: int) -> None:
        super().__init__()
        self.pid = pid
        self.title_line = TextLine(id="proc-title")
        self.efficiency_line = TextLine(id="proc-efficiency")  # MFU, goodput, J/step (agent)
        self.efficiency_line.display = False
        self.charts = {name: BrailleChart(classes=f"chart chart-{name}")
                       for name in ("cpu", "workers_cpu", "gpu_mem")}
        self.boxes: dict[str, Vertical] = {}
        self.worker_list = TextLine(id="proc-workers")

    def compose(self) -> ComposeResult:
        yield self.title_line
        yield self.efficiency_line
        for name, chart in self.charts.items():
            box = self.boxes[name] = Vertical(chart, classes="chart-box")
            yield box
        yield self.worker_list
        yield KeyFooter()

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
            compile_lines(compiled) if compiled is not None else [])  # torch.compile (issue 41)
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
        self.boxes["cpu"].border_title = (
            f"process CPU {now_cpu}  (0-{cpu_top:.0f} %, {window})")
        self.boxes["workers_cpu"].border_title = (
            f"DataLoader workers CPU, total {now_workers}  (0-{workers_top:.0f} %, {window})")
        self.boxes["gpu_mem"].border_title = (
            f"GPU memory {bytes_h(proc.gpu_mem) if proc else 'n/a'}  "
            f"(0-{bytes_h(mem_total)}, {window})")
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
