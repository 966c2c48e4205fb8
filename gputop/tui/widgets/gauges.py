"""Text gauges shared by the GPU card, the compact GPU row and the host panel."""

from __future__ import annotations

from rich.text import Text

from gputop.core.format import bytes_h, mbs_h, num, pct
from gputop.core.model import GpuSample
from gputop.core.pcie import capacity_mbs

_PARTIAL = " ▏▎▍▌▋▊▉"
# NVML clock-event reasons that hold the clock down, with the words shown for them.
THROTTLE_WORDS = {
    "sw_power_cap": "power cap",
    "hw_power_brake": "power brake",
    "sw_thermal": "thermal",
    "hw_thermal": "HW thermal",
    "hw_slowdown": "HW slowdown",
}


def bar(fraction: float | None, width: int) -> str:
    """A horizontal bar in eighths of a cell; the unfilled part is shaded so it reads without
    colour."""
    if width <= 0:
        return ""
    if fraction is None:
        return "·" * width
    eighths = round(max(0.0, min(1.0, fraction)) * width * 8)
    full, part = divmod(eighths, 8)
    text = "█" * full + (_PARTIAL[part] if part else "")
    return text + "░" * (width - len(text))


def level_style(fraction: float | None, warn: float = 0.8, crit: float = 0.95) -> str:
    if fraction is None:
        return "dim"
    if fraction >= crit:
        return "red"
    if fraction >= warn:
        return "yellow"
    return "green"


# Gauges of work done: a GPU near 100 % busy, near its power limit or its link's rate is
# healthy and working. They are drawn in one colour ("busy") at every level; red and yellow
# are kept for what is a problem near its limit (memory, temperature) and for findings.
BUSY_FIELDS = frozenset({"util_gpu", "power_w", "pcie_rx_mbs"})


def field_style(field: str, fraction: float | None) -> str:
    """The gauge style of a card's or compact row's ``field``."""
    if fraction is None:
        return "dim"
    return "busy" if field in BUSY_FIELDS else level_style(fraction)


def ratio(value: float | None, limit: float | None) -> float | None:
    if value is None or not limit:
        return None
    return value / limit


def pcie_link_max_mbs(gpu: GpuSample) -> float | None:
    """The link's maximum rate in MB/s each way, from its maximum generation and width."""
    gen = gpu.pcie_gen_max or gpu.pcie_gen
    width = gpu.pcie_width_max or gpu.pcie_width
    if not gen or not width:
        return None
    return capacity_mbs(gen, width)


def throttle_reasons(gpu: GpuSample) -> list[str]:
    return [THROTTLE_WORDS[e] for e in gpu.clock_events if e in THROTTLE_WORDS]


def short_name(name: str | None) -> str:
    return (name or "?").removeprefix("NVIDIA ")


def mem_text(gpu: GpuSample) -> str:
    if gpu.mem_used is None:
        return "n/a"
    return f"{gpu.mem_used / 2**30:.1f}/{bytes_h(gpu.mem_total, 'G')}"


def power_text(gpu: GpuSample) -> str:
    if gpu.power_w is None:
        return "n/a"
    return f"{num(gpu.power_w)}/{num(gpu.power_limit_w)}W"


def pcie_text(gpu: GpuSample) -> str:
    if gpu.pcie_rx_mbs is None and gpu.pcie_tx_mbs is None:
        return "n/a"
    return f"rx {mbs_h(gpu.pcie_rx_mbs)} tx {mbs_h(gpu.pcie_tx_mbs)}"


def temp_text(gpu: GpuSample) -> str:
    return num(gpu.temperature_c, 0, "°C")


def gauge_line(label: str, value: str, fraction: float | None, width: int,
               style: str | None = None) -> Text:
    """``label value`` on the first line and a bar on the second, ``width`` cells wide."""
    head = f"{label} {value:>{max(0, width - len(label) - 1)}}"[:width]
    text = Text(head + "\n")
    text.append(bar(fraction, width), style=style or level_style(fraction))
    return text


__all__ = ["BUSY_FIELDS", "bar", "field_style", "gauge_line", "level_style", "mem_text", "pct", "pcie_link_max_mbs",
           "pcie_text", "power_text", "ratio", "short_name", "temp_text", "throttle_reasons"]
