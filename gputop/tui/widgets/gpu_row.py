"""One GPU on one line for compact mode: numbers with inline sparklines, fitted to the width."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from rich.text import Text

from gputop.format import mbs_h, pct
from gputop.model import GpuSample
from gputop.tui.frames import Points
from gputop.tui.widgets.chart import spark_series
from gputop.tui.widgets.gauges import level_style, mem_text, power_text, ratio, temp_text
from gputop.tui.widgets.gpu_card import chart_limit
from gputop.tui.widgets.text_line import StripWidget

SPARK_MIN = 5
SPARK_MAX = 24
NAME_WIDTH = 22
_EMPTY = (np.zeros(0), np.zeros(0))
# Throttle reasons in a word each: one line has no room for the card's phrases.
SHORT_REASONS = {
    "sw_power_cap": "PWR",
    "hw_power_brake": "BRAKE",
    "sw_thermal": "THERM",
    "hw_thermal": "HWTHERM",
    "hw_slowdown": "HWSLOW",
}


def compact_line(gpu: GpuSample, series: Mapping[str, Points], start: float, end: float,
                 width: int) -> Text:
    """Fields by priority: index and name, utilization, memory, power, temperature, PCIe; each
    chart field gets a sparkline from the space left over."""
    name = (gpu.name or "?")[:NAME_WIDTH]
    head = Text(f"{gpu.index:>2} {name:<{NAME_WIDTH}}", style="bold")
    if gpu.lost:
        head.append("  LOST: the GPU fell off the bus", style="bold red")
        return head
    fields: list[tuple[str, str, str | None, str]] = [  # (field, value text, chart, style)
        ("util_gpu", f" {pct(gpu.util_gpu):>4}", "util_gpu",
         level_style(ratio(gpu.util_gpu, 100.0))),
        ("mem_used", f" {mem_text(gpu):>10}", "mem_used",
         level_style(ratio(gpu.mem_used, gpu.mem_total))),
        ("power_w", f" {power_text(gpu):>9}", "power_w",
         level_style(ratio(gpu.power_w, gpu.power_limit_w))),
        ("temp", f" {temp_text(gpu):>5}", None, level_style(ratio(gpu.temperature_c, 95.0),
                                                          0.8, 0.9)),
        ("pcie_rx_mbs", f" rx {mbs_h(gpu.pcie_rx_mbs):>5}", "pcie_rx_mbs", ""),
    ]
    reasons = [e for e in gpu.clock_events if e in SHORT_REASONS]
    warn = ""
    if reasons:
        warn = " ⚠" + SHORT_REASONS[reasons[0]] + (f"+{len(reasons) - 1}" if len(reasons) > 1
                                                    else "")
    used = head.cell_len + len(warn)
    chosen = []
    for field in fields:
        cost = len(field[1]) + (1 + SPARK_MIN if field[2] else 0)
        if used + cost > width:
            break
        chosen.append(field)
        used += cost
    n_sparks = sum(1 for f in chosen if f[2])
    extra = (width - used) // n_sparks if n_sparks else 0
    spark_w = min(SPARK_MAX, SPARK_MIN + extra)
    for _, value, chart, style in chosen:
        head.append(value, style=style)
        if chart:
            t, v = series.get(chart, _EMPTY)
            head.append(" ")
            head.append(spark_series(t, v, start, end, chart_limit(gpu, chart) or 0.0, spark_w),
                        style="cyan")
    if warn:
        head.append(warn, style="bold yellow")
    return head


class CompactGpuRow(StripWidget):
    DEFAULT_CSS = """
    CompactGpuRow { width: 1fr; height: 1; }
    """

    def __init__(self, index: int) -> None:
        super().__init__(id=f"gpu-row-{index}", classes="gpu-row")
        self.index = index
        self._args: tuple | None = None

    def update_gpu(self, gpu: GpuSample, series: Mapping[str, Points], start: float,
                   end: float) -> None:
        self._args = (gpu, series, start, end)
        self.set_class(gpu.lost, "-lost")
        self.rebuild()

    def rebuild(self) -> None:
        if self._args is not None and self.size.width > 0:
            self.show_text(compact_line(*self._args, width=self.size.width))

    def mark(self, severity: str | None) -> None:
        for level in ("info", "warning", "critical"):
            self.set_class(severity == level, f"-finding-{level}")
