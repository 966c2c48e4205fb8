"""Host CPU (total and per core), iowait, load, memory and swap, disk and network rates."""

from __future__ import annotations

from rich.text import Text

from gputop.core.format import bytes_h, num, pct, rate_h
from gputop.core.model import HostSample
from gputop.tui.widgets.gauges import bar, level_style, ratio
from gputop.tui.widgets.text_line import StripWidget

_COLUMN = " ▁▂▃▄▅▆▇█"


def per_core_text(cores: tuple[float, ...], width: int) -> Text:
    """One 8-level column per core; with more cores than room, neighbours share a column that
    shows the busiest of them."""
    text = Text()
    if width <= 0 or not cores:
        return text
    shown = list(cores)
    if len(shown) > width:
        step = len(shown) / width
        shown = [max(shown[int(i * step): int((i + 1) * step)] or [0.0]) for i in range(width)]
    for value in shown:
        level = min(8, max(1, round(value / 100 * 8)))
        text.append(_COLUMN[level], style=level_style(value / 100))
    return text


def host_lines(host: HostSample, width: int) -> Text:
    cpu_frac = ratio(host.cpu_percent, 100.0)
    line1 = Text("CPU ", style="bold")
    line1.append(f"{pct(host.cpu_percent):>4} ", style=level_style(cpu_frac))
    tail = (
        f" iowait {pct(host.iowait, 1)}  load {num(host.load_1, 2)} {num(host.load_5, 2)} "
        f"{num(host.load_15, 2)}"
    )
    if host.steal:
        tail += f"  steal {pct(host.steal, 1)}"
    if host.process_count is not None:
        tail += f"  procs {host.process_count}"
    room = max(0, width - line1.cell_len - len(tail) - 3)
    line1.append("[")
    line1.append_text(per_core_text(host.cpu_per_core, room))
    line1.append("]")
    line1.append(tail)

    mem_frac = ratio(host.memory_used, host.memory_total)
    line2 = Text("MEM ", style="bold")
    line2.append(bar(mem_frac, 8), style=level_style(mem_frac))
    line2.append(
        f" {bytes_h(host.memory_used)}/{bytes_h(host.memory_total)}  "
        f"swap {bytes_h(host.swap_used)}/{bytes_h(host.swap_total)}  "
        f"disk r {rate_h(host.disk_read_bps)} w {rate_h(host.disk_write_bps)}  "
        f"net rx {rate_h(host.net_rx_bps)} tx {rate_h(host.net_tx_bps)}"
    )
    line1.truncate(width)
    line2.truncate(width)
    return Text("\n").join([line1, line2])


class HostPanel(StripWidget):
    DEFAULT_CSS = """
    HostPanel { width: 1fr; height: 2; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._host: HostSample | None = None

    def update_host(self, host: HostSample) -> None:
        self._host = host
        self.rebuild()

    def rebuild(self) -> None:
        if self._host is not None and self.size.width > 0:
            self.show_text(host_lines(self._host, self.size.width))
