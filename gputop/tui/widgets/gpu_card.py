"""One GPU as a card: gauges with numbers beside live charts of utilization, memory, power and
PCIe, then temperature and clocks, and throttling or GPM activity. Renders what it is given."""

from __future__ import annotations

from collections.abc import Mapping

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical

from gputop.format import mbs_h, num, pct
from gputop.model import GpuSample
from gputop.tui.frames import CHART_FIELDS, Points
from gputop.tui.widgets.chart import BrailleChart
from gputop.tui.widgets.gauges import (
    bar,
    gauge_line,
    level_style,
    mem_text,
    pcie_link_max_mbs,
    pcie_text,
    power_text,
    ratio,
    temp_text,
    throttle_reasons,
)
from gputop.tui.widgets.text_line import TextLine

GAUGE_WIDTH = 15
# Temperatures are shown against this: data-centre GPUs slow down around 85-90 C.
TEMP_SCALE_C = 95.0
_LABELS = {"util_gpu": "util", "mem_used": "mem", "power_w": "pwr", "pcie_rx_mbs": "pcie"}


class Gauge(TextLine):
    DEFAULT_CSS = """
    Gauge { width: 15; height: 2; margin-right: 1; }
    """


def chart_limit(gpu: GpuSample, field: str) -> float | None:
    """The fixed top of each chart, so one glance compares GPUs."""
    return {
        "util_gpu": 100.0,
        "mem_used": float(gpu.mem_total) if gpu.mem_total else None,
        "power_w": gpu.power_limit_w,
        "pcie_rx_mbs": pcie_link_max_mbs(gpu),
    }[field]


def gauge_text(gpu: GpuSample, field: str, width: int = GAUGE_WIDTH) -> Text:
    label = _LABELS[field]
    if gpu.lost:
        return gauge_line(label, "lost", None, width, "dim")
    if field == "util_gpu":
        return gauge_line(label, pct(gpu.util_gpu), ratio(gpu.util_gpu, 100.0), width)
    if field == "mem_used":
        return gauge_line(label, mem_text(gpu), ratio(gpu.mem_used, gpu.mem_total), width)
    if field == "power_w":
        return gauge_line(label, power_text(gpu), ratio(gpu.power_w, gpu.power_limit_w), width)
    rx = f"rx {mbs_h(gpu.pcie_rx_mbs)}" if gpu.pcie_rx_mbs is not None else "n/a"
    return gauge_line(label, rx, ratio(gpu.pcie_rx_mbs, pcie_link_max_mbs(gpu)), width)


def info_text(gpu: GpuSample) -> Text:
    """Temperature gauge and SM clock against its maximum."""
    text = Text("temp ")
    frac = ratio(gpu.temperature_c, TEMP_SCALE_C)
    text.append(bar(frac, 5), style=level_style(frac, 0.8, 0.9))
    text.append(f" {temp_text(gpu):>5}  SM {num(gpu.sm_clock_mhz)}/{num(gpu.sm_clock_max_mhz)} MHz")
    return text


def status_text(gpu: GpuSample) -> Text:
    """Throttling first (a warning), then PCIe TX and GPM activity where the GPU has it."""
    if gpu.lost:
        return Text("LOST: the GPU fell off the bus", style="bold red")
    text = Text()
    reasons = throttle_reasons(gpu)
    if reasons:
        text.append("⚠ " + ", ".join(reasons), style="bold yellow")
        text.append("  ")
    parts = []
    if gpu.pcie_tx_mbs is not None:
        parts.append(f"tx {mbs_h(gpu.pcie_tx_mbs)}")
    if gpu.sm_active is not None:
        parts.append(f"SM act {pct(gpu.sm_active)}")
    if gpu.tensor_active is not None:
        parts.append(f"tensor {pct(gpu.tensor_active)}")
    if gpu.pstate is not None:
        parts.append(f"P{gpu.pstate}")
    text.append("  ".join(parts), style="dim" if not reasons else "")
    return text


class GpuCard(Vertical):
    DEFAULT_CSS = """
    GpuCard { border: round $secondary; padding: 0 0 0 1; height: 1fr; }
    GpuCard .metric { height: 1fr; min-height: 2; }
    GpuCard BrailleChart { height: 1fr; }
    """

    def __init__(self, index: int) -> None:
        super().__init__(id=f"gpu-card-{index}", classes="gpu-card")
        self.index = index
        self.gauges = {f: Gauge(classes=f"gauge-{f}") for f in CHART_FIELDS}
        self.charts = {f: BrailleChart(classes=f"chart chart-{f}") for f in CHART_FIELDS}
        self.info = TextLine(classes="gpu-info")
        self.status = TextLine(classes="gpu-status")
        self._title = ""
        # The last known chart tops: a lost GPU no longer reports its limits.
        self._limits: dict[str, float | None] = {}

    def compose(self) -> ComposeResult:
        for field in CHART_FIELDS:
            with Horizontal(classes="metric"):
                yield self.gauges[field]
                yield self.charts[field]
        yield self.info
        yield self.status

    def update_gpu(self, gpu: GpuSample, series: Mapping[str, Points], start: float,
                   end: float) -> None:
        title = f" {gpu.index} · {gpu.name or '?'} "
        if title != self._title:
            self._title = self.border_title = title
        self.set_class(gpu.lost, "-lost")
        self.set_class(bool(throttle_reasons(gpu)), "-throttled")
        for field in CHART_FIELDS:
            self.gauges[field].set_text(gauge_text(gpu, field))
            limit = chart_limit(gpu, field) or self._limits.get(field)
            self._limits[field] = limit
            t, v = series.get(field, (None, None))
            if t is not None:
                self.charts[field].set_series(t, v, start, end, limit)
        self.info.set_text(info_text(gpu) if not gpu.lost else Text(""))
        self.status.set_text(status_text(gpu))

    # Kept for findings (a later issue marks the card of the GPU a finding is about).
    def mark(self, severity: str | None) -> None:
        for level in ("info", "warning", "critical"):
            self.set_class(severity == level, f"-finding-{level}")


__all__ = ["GpuCard", "chart_limit", "pcie_text"]
