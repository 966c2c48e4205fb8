"""The card of a MIG-enabled GPU: its MIG devices, one line each, instead of the charts
. Pure, as ``cards.py``: lines of (text, role) pieces, exactly the card's width.

NVML reports no utilization for a GPU in MIG mode nor for its MIG devices, so the card shows
no utilization chart; each MIG device shows its memory and the SM activity GPM measures for
its GPU instance (Hopper and later), or "n/a" where GPM is missing: never 0 %.
"""

from __future__ import annotations

from gputop.core.format import bytes_h, pct
from gputop.core.model import GpuSample, MigSample
from gputop.tui.widgets.gauges import bar, level_style, ratio

Piece = tuple[str, str | None]
Line = tuple[Piece, ...]
MEM_BAR = 8


def mig_line(m: MigSample) -> list[Piece]:
    """`` GI  7 1g.10gb  ██████░░  7.1/10.0G  SM  83%  tensor 45%  1 proc``."""
    frac = ratio(m.mem_used, m.mem_total)
    used = "n/a" if m.mem_used is None else f"{m.mem_used / 2**30:.1f}/{bytes_h(m.mem_total, 'G')}"
    procs = len(m.pids)
    sm_role = "dim" if m.sm_active is None else level_style(ratio(m.sm_active, 100.0), 2, 2)
    return [(f"GI {m.gpu_instance:>2} {(m.profile or '?'):<8} ", "bold"),
            (bar(frac, MEM_BAR), level_style(frac)), (f" {used:>10}", None),
            (f"  SM {pct(m.sm_active):>4}", sm_role),
            (f"  tensor {pct(m.tensor_active):>4}", "dim"),
            (f"  {procs} proc{'s' if procs != 1 else ''}" if procs else "  idle", "dim")]


def mig_card_body(gpu: GpuSample, head: list[Line], tail: list[Line], inner: int,
                  height: int, fit) -> list[Line]:
    """``head`` (the board's gauges), a title, one line per MIG device (as many as fit, then
    how many more), then ``tail`` (temperature, clocks, status)."""
    room = max(0, height - len(head) - len(tail) - 1)
    title = fit([(" ", None), (f"MIG: {len(gpu.mig)} devices · SM activity from GPM "
                               "(NVML has no utilization per MIG device)", "dim")], inner)
    shown = gpu.mig if len(gpu.mig) <= room else gpu.mig[:max(0, room - 1)]
    lines = [fit([(" ", None), *mig_line(m)], inner) for m in shown]
    if len(shown) < len(gpu.mig) and room:
        lines.append(fit([(" ", None), (f"+{len(gpu.mig) - len(shown)} more MIG devices",
                                        "dim")], inner))
    body = [*head, title, *lines]
    while len(body) < height - len(tail):
        body.append(fit([], inner))
    return (body + tail)[:height]
