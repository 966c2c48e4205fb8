"""The GPU cards as lines of (text, role) pieces, fitted to a width: pure, so the panel only
compares lines and paints the ones that changed, and tests read them without a screen.

A role names a style the panel resolves from the theme ("border", "warning", "error",
"title", a chart field, a gauge level colour, "dim", "bold"); None is the panel's own style.
Every line is exactly the width it is given (in cells): nothing is clipped by the terminal.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from rich.cells import cell_len, set_cell_size

from gputop.core.format import mbs_h, num, pct
from gputop.core.model import GpuSample
from gputop.tui.widgets.gauges import (
    bar,
    field_style,
    level_style,
    mem_text,
    pcie_link_max_mbs,
    power_text,
    ratio,
    temp_text,
    throttle_reasons,
)

Piece = tuple[str, str | None]
Line = tuple[Piece, ...]

CHART_FIELDS = ("util_gpu", "mem_used", "power_w", "pcie_rx_mbs")
GAUGE_WIDTH = 15
TEMP_SCALE_C = 95.0  # data-centre GPUs slow down around 85-90 C
_LABELS = {"util_gpu": "util", "mem_used": "mem", "power_w": "pwr", "pcie_rx_mbs": "pcie"}
ROUND = "╭─╮│╰╯"
HEAVY = "┏━┓┃┗┛"


def chart_limit(gpu: GpuSample, field: str) -> float | None:
    """The fixed top of each chart, so one glance compares GPUs."""
    if field == "util_gpu":
        return 100.0
    if field == "mem_used":
        return float(gpu.mem_total) if gpu.mem_total else None
    if field == "power_w":
        return gpu.power_limit_w
    if field == "pcie_rx_mbs":
        return pcie_link_max_mbs(gpu)
    raise KeyError(field)


def fit(pieces: Iterable[Piece], width: int) -> Line:
    """The pieces cut or padded to exactly ``width`` cells."""
    out: list[Piece] = []
    used = 0
    for text, role in pieces:
        if used >= width:
            break
        size = len(text) if text.isascii() else cell_len(text)
        if used + size > width:
            text, size = set_cell_size(text, width - used), width - used
        if text:
            out.append((text, role))
            used += size
    if used < width:
        out.append((" " * (width - used), None))
    return tuple(out)


def fit_parts(parts: Sequence[tuple[str, str | None, int]], width: int,
              sep: str = "  ") -> list[Piece]:
    """Parts (text, role, priority: lower is kept first) in their order, dropping the least
    important ones until the rest fits ``width``: a line never ends in a cut-off word."""
    chosen = list(range(len(parts)))

    def size(indices: list[int]) -> int:
        return sum(cell_len(parts[i][0]) for i in indices) + cell_len(sep) * max(0, len(indices) - 1)

    while chosen and size(chosen) > width:
        chosen.remove(max(chosen, key=lambda i: (parts[i][2], i)))
    out: list[Piece] = []
    for n, i in enumerate(chosen):
        if n:
            out.append((sep, None))
        out.append((parts[i][0], parts[i][1]))
    return out


def gauge_head(gpu: GpuSample, field: str, width: int = GAUGE_WIDTH) -> tuple[str, float | None]:
    """``label value`` and the fraction the bar shows."""
    label = _LABELS[field]
    if gpu.lost:
        value, frac = "lost", None
    elif field == "util_gpu":
        value, frac = pct(gpu.util_gpu), ratio(gpu.util_gpu, 100.0)
    elif field == "mem_used":
        value, frac = mem_text(gpu), ratio(gpu.mem_used, gpu.mem_total)
    elif field == "power_w":
        value, frac = power_text(gpu), ratio(gpu.power_w, gpu.power_limit_w)
    else:
        value = f"rx {mbs_h(gpu.pcie_rx_mbs)}" if gpu.pcie_rx_mbs is not None else "n/a"
        frac = ratio(gpu.pcie_rx_mbs, pcie_link_max_mbs(gpu))
    return f"{label} {value:>{max(0, width - len(label) - 1)}}"[:width], frac


def info_pieces(gpu: GpuSample, width: int) -> list[Piece]:
    """Temperature gauge and SM clock against its maximum, shortened to fit ``width``."""
    if gpu.lost:
        return []
    frac = ratio(gpu.temperature_c, TEMP_SCALE_C)
    temp: list[Piece] = [("temp ", None), (bar(frac, 5), level_style(frac, 0.8, 0.9)),
                         (f" {temp_text(gpu):>5}", None)]
    now, top = num(gpu.sm_clock_mhz), num(gpu.sm_clock_max_mhz)
    for clock in (f"SM {now}/{top} MHz", f"SM {now}/{top}", f"SM {now}"):
        if 16 + 2 + cell_len(clock) <= width:
            return [*temp, ("  " + clock, None)]
    if width >= 16:
        return temp
    return [(f"temp {temp_text(gpu).strip()}", None)]


def status_pieces(gpu: GpuSample, width: int) -> list[Piece]:
    """Throttling first (a warning), then PCIe TX and GPM activity where the GPU has it; the
    least important parts go first when the card is narrow."""
    if gpu.lost:
        return [("LOST: the GPU fell off the bus" if width >= 30 else "LOST", "error-bold")]
    parts: list[tuple[str, str | None, int]] = []
    reasons = throttle_reasons(gpu)
    quiet = "dim" if not reasons else None
    if reasons:
        parts.append(("⚠ " + ", ".join(reasons), "warning-bold", 0))
    if gpu.pcie_tx_mbs is not None:
        parts.append((f"tx {mbs_h(gpu.pcie_tx_mbs)}", quiet, 4))
    if gpu.sm_active is not None:
        parts.append((f"SM act {pct(gpu.sm_active)}", quiet, 1))
    if gpu.tensor_active is not None:
        parts.append((f"tensor {pct(gpu.tensor_active)}", quiet, 2))
    if gpu.pstate is not None:
        parts.append((f"P{gpu.pstate}", quiet, 3))
    return fit_parts(parts, width)


def card_body(gpu: GpuSample, rows: Mapping[str, Sequence[str]], inner: int,
              height: int) -> list[Line]:
    """The lines inside a card's border: ``inner`` cells wide (a space of padding first),
    ``height`` lines; ``rows[field]`` are the chart rows of each field."""
    content = inner - 1
    if gpu.mig_mode and gpu.mig and not gpu.lost:  # MIG: its devices instead of the charts
        from gputop.tui.widgets.mig_cards import mig_card_body

        head = []
        for field in ("mem_used", "power_w"):
            text, frac = gauge_head(gpu, field)
            head.append(fit([(" ", None), (text.ljust(GAUGE_WIDTH), None), (" ", None),
                             (bar(frac, max(1, content - GAUGE_WIDTH - 1)), level_style(frac))],
                            inner))
        tail = [fit([(" ", None), *info_pieces(gpu, content)], inner),
                fit([(" ", None), *status_pieces(gpu, content)], inner)]
        return mig_card_body(gpu, head, tail, inner, height, fit)
    chart_width = max(1, content - GAUGE_WIDTH - 1)
    block, extra = divmod(max(0, height - 2), len(CHART_FIELDS))
    lines: list[Line] = []
    for n, field in enumerate(CHART_FIELDS):
        block_height = max(2, block + (1 if n < extra else 0))
        head, frac = gauge_head(gpu, field)
        gauge = [(head, None), (bar(frac, GAUGE_WIDTH), "dim" if gpu.lost else
                                field_style(field, frac))]
        chart = rows.get(field, ())
        for i in range(block_height):
            left = gauge[i] if i < 2 else (" " * GAUGE_WIDTH, None)
            row = chart[i] if i < len(chart) else ""
            text = left[0].ljust(GAUGE_WIDTH)
            if len(row) == chart_width == inner - GAUGE_WIDTH - 2 and len(text) == GAUGE_WIDTH:
                # The usual line fills the card exactly (chart rows are one cell a
                # character): what ``fit`` would return, without measuring it.
                lines.append(((" ", None), (text, left[1]), (" ", None), (row, field)))
                continue
            lines.append(fit([(" ", None), (text, left[1]), (" ", None),
                              (row[:chart_width], field)], inner))
    lines.append(fit([(" ", None), *info_pieces(gpu, content)], inner))
    lines.append(fit([(" ", None), *status_pieces(gpu, content)], inner))
    return lines[:height]


def chart_width_of(card_width: int) -> int:
    """The cells a card of ``card_width`` (border included) gives each chart."""
    return max(1, card_width - 2 - 1 - GAUGE_WIDTH - 1)


def chart_heights(card_height: int) -> list[int]:
    block, extra = divmod(max(0, card_height - 2 - 2), len(CHART_FIELDS))
    return [max(2, block + (1 if n < extra else 0)) for n in range(len(CHART_FIELDS))]


def border_role(gpu: GpuSample | None, mark: str | None) -> tuple[str, str]:
    """(box characters, role) of a card's border: a finding's severity first (heavy), then a
    lost or throttled GPU (round, coloured)."""
    if mark == "critical":
        return HEAVY, "error"
    if mark == "warning":
        return HEAVY, "warning"
    if gpu is not None and gpu.lost:
        return ROUND, "error"
    if gpu is not None and throttle_reasons(gpu):
        return ROUND, "warning"
    return ROUND, "border"


def card_lines(gpu: GpuSample, rows: Mapping[str, Sequence[str]], width: int, height: int,
               mark: str | None = None) -> list[Line]:
    """A whole card, border included, ``width`` x ``height`` cells."""
    box, role = border_role(gpu, mark)
    inner = max(1, width - 2)
    title = f" {gpu.index} · {gpu.name or '?'} "
    if cell_len(title) > inner - 3:
        title = set_cell_size(title, max(0, inner - 3))
    top = fit([(box[0] + box[1] + " ", role), (title, "title"), (" " + box[1] * inner, role),
               (box[2], role)], width)
    if top[-1][0] != box[2]:  # the corner must survive the cut
        top = fit([*top[:-1], (top[-1][0][:-1], top[-1][1]), (box[2], role)], width)
    side = (box[3], role)
    body = [(side, *line, side) for line in card_body(gpu, rows, inner, max(0, height - 2))]
    while len(body) < height - 2:
        body.append((side, (" " * inner, None), side))
    bottom = ((box[4] + box[1] * inner + box[5], role),)
    return [top, *body, bottom][:height]


def compact_pieces(gpu: GpuSample, sparks: Mapping[str, str], width: int,
                   spark_width: int) -> Line:
    """One GPU on one line: name, utilization, memory, power, temperature, PCIe, each chart
    field with its sparkline, fields dropped from the right when the line is narrow."""
    name = (gpu.name or "?")[:22]
    head: list[Piece] = [(f"{gpu.index:>2} {name:<22}", "bold")]
    if gpu.lost:
        return fit([*head, ("  LOST: the GPU fell off the bus", "error-bold")], width)
    fields = [
        ("util_gpu", f" {pct(gpu.util_gpu):>4}", field_style("util_gpu",
                                                             ratio(gpu.util_gpu, 100.0))),
        ("mem_used", f" {mem_text(gpu):>10}", level_style(ratio(gpu.mem_used, gpu.mem_total))),
        ("power_w", f" {power_text(gpu):>9}",
         field_style("power_w", ratio(gpu.power_w, gpu.power_limit_w))),
        ("temp", f" {temp_text(gpu):>5}", level_style(ratio(gpu.temperature_c, 95.0), 0.8, 0.9)),
        ("pcie_rx_mbs", f" rx {mbs_h(gpu.pcie_rx_mbs):>5}", None),
    ]
    # Words a newcomer reads: why the clocks are held down (the card says all of them).
    short = {"sw_power_cap": "power cap", "hw_power_brake": "power brake",
             "sw_thermal": "too hot", "hw_thermal": "too hot (HW)",
             "hw_slowdown": "HW slowdown"}
    reasons = [short[e] for e in gpu.clock_events if e in short]
    warn = (" ⚠ slowed: " + reasons[0] + (f" +{len(reasons) - 1}" if len(reasons) > 1 else "")
            if reasons else "")
    used = 25 + cell_len(warn)
    pieces = list(head)
    for field, value, role in fields:
        spark = sparks.get(field)
        cost = len(value) + (1 + spark_width if spark is not None else 0)
        if used + cost > width:
            break
        pieces.append((value, role))
        if spark is not None:
            pieces.append((" " + spark[:spark_width].ljust(spark_width), "spark"))
        used += cost
    if warn:
        pieces.append((warn, "warning-bold"))
    return fit(pieces, width)


def compact_spark_width(width: int) -> int:
    """The sparkline width of every compact row at ``width``: the same for all GPUs, so the
    columns line up (the four sparklines share what the numbers leave)."""
    numbers = 25 + 5 + 11 + 10 + 6 + 9 + 6  # name, values, a throttle mark
    return max(5, min(24, (width - numbers) // 4 - 1))
