"""The fleet screen's rows and findings, from the nodes' views. Pure, so it is tested alone.

One compact row per node and GPU; a node that is not streaming gets one row that says why and
when it is tried again. Text from a node was escaped when it was read (``fleet.wire``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from rich.text import Span, Text

from gputop.core.format import bytes_h, pct, truncate
from gputop.core.model import GpuSample
from gputop.diagnostics.findings import SEVERITY_RANK
from gputop.fleet.monitor import BAD, CONNECTING, DOWN, NO_GPUTOP, SLOW, NodeView
from gputop.tui.view.severity import SEVERITY_MARK

HOST_MAX = 20
NAME_WIDTH = 18
_SEVERITY_STYLE = {"critical": "bold red", "warning": "bold yellow", "info": "cyan"}
_STATE_STYLE = {DOWN: "bold red", BAD: "bold red", NO_GPUTOP: "bold yellow",
                CONNECTING: "dim", SLOW: "yellow"}


@dataclass(frozen=True)
class FleetRow:
    key: tuple[str, int | None]  # (host, GPU index or None for a node's only row)
    host: str
    gpu: int | None
    text: Text


@dataclass(frozen=True)
class FleetFinding:
    """A node's finding as the findings panel draws it: the host leads the title."""

    host: str
    id: str
    severity: str
    title: str
    evidence: str
    fix: str
    next_step: str
    cost_s: float
    gpu: int | None
    pid: int | None
    gpu_instance: int | None = None  # a node's findings name their MIG device in the title


def host_width(hosts: Sequence[str]) -> int:
    return min(HOST_MAX, max((len(h) for h in hosts), default=4))


def header_text(width: int, host_w: int) -> Text:
    line = (f"{'NODE':<{host_w}} {'GPU':>3} {'NAME':<{NAME_WIDTH}} {'UTIL':>4} "
            f"{'MEMORY':>11} {'POWER':>9} {'TEMP':>4} {'SAMPLE':>8}  FINDINGS")
    return Text(line[:width], style="bold")


def _gpu_fields(gpu: GpuSample) -> str:
    if gpu.lost:
        return f"{'LOST: fell off the bus':<{4 + 11 + 9 + 4 + 3}}"
    mem = (f"{bytes_h(gpu.mem_used, 'G')}/{bytes_h(gpu.mem_total, 'G')}"
           if gpu.mem_used is not None else "n/a")
    power = (f"{gpu.power_w:.0f}/{gpu.power_limit_w or 0:.0f}W" if gpu.power_w is not None
             else "n/a")
    temp = f"{gpu.temperature_c:.0f}C" if gpu.temperature_c is not None else "n/a"
    return f"{pct(gpu.util_gpu):>4} {mem:>11} {power:>9} {temp:>4}"


def _retry_text(view: NodeView, now: float) -> str:
    if view.retry_at is None:
        return " · reconnecting…" if view.state in (DOWN, NO_GPUTOP, BAD) else ""
    wait = view.retry_at - now
    return " · retrying now" if wait <= 0.5 else f" · retry in {wait:.0f} s"


def state_text(view: NodeView, now: float) -> str:
    """A node that is not streaming, in words."""
    if view.state == CONNECTING:
        return "connecting…" if view.connects <= 1 else f"reconnecting… (attempt {view.connects})"
    label = {DOWN: "DOWN", NO_GPUTOP: "NO GPUTOP", BAD: "BAD DATA", SLOW: "SLOW"}.get(
        view.state, view.state.upper())
    reason = f": {view.reason}" if view.reason else ""
    return f"{label}{reason}{_retry_text(view, now)}"


def node_rows(view: NodeView, width: int, host_w: int, now: float | None = None
              ) -> list[FleetRow]:
    now = time.monotonic() if now is None else now
    host = f"{truncate(view.host, host_w):<{host_w}}"
    snap = view.snapshot
    if not view.live or snap is None:
        text = Text(host + " ", style="bold")
        text.append(state_text(view, now)[: max(10, width - host_w - 1)],
                    style=_STATE_STYLE.get(view.state, ""))
        return [FleetRow((view.host, None), view.host, None, text)]
    stamp = time.strftime("%H:%M:%S", time.localtime(snap.time))
    by_gpu: dict[int | None, list] = {}
    for f in sorted(view.findings, key=lambda f: (-SEVERITY_RANK[f.severity], -f.cost_s)):
        by_gpu.setdefault(f.gpu, []).append(f)
    slow = f"SLOW: {view.reason}" if view.state == SLOW else ""
    rows = []
    if not snap.gpus:
        d = snap.driver
        what = f"no GPU: {d.error}" if not d.available else "no GPUs visible"
        text = Text(f"{host} {'-':>3} ", style="bold")
        text.append(truncate(f"{what}  CPU {pct(snap.host.cpu_percent)}", width // 2))
        _append_findings(text, by_gpu.get(None, []), slow, width)
        return [FleetRow((view.host, None), view.host, None, text)]
    for i, gpu in enumerate(snap.gpus):
        name = truncate((gpu.name or "?").removeprefix("NVIDIA "), NAME_WIDTH)
        text = Text(f"{host} " if i == 0 else f"{'':<{host_w}} ", style="bold")
        text.append(f"{gpu.index:>3} {name:<{NAME_WIDTH}} ")
        text.append(_gpu_fields(gpu), style="red" if gpu.lost else "")
        text.append(f" {stamp:>8}", style="dim")
        mine = by_gpu.get(gpu.index, []) + (by_gpu.get(None, []) if i == 0 else [])
        _append_findings(text, mine, slow, width)
        if view.state == SLOW:
            text.stylize("dim")
        rows.append(FleetRow((view.host, gpu.index), view.host, gpu.index, text))
    return rows


def _append_findings(text: Text, findings: list, slow: str, width: int) -> None:
    """The GPU's findings after its numbers, cut to ``width`` by length (Text.truncate
    measures every cell, which costs more than the whole row)."""
    room = width - len(text.plain) - 2
    if room <= 0:
        return
    text.append("  ")
    if slow:
        text.append(slow[:room], style="yellow")
        return
    for j, f in enumerate(findings):
        part = ("" if j == 0 else " ") + f"{SEVERITY_MARK.get(f.severity, '•')} {f.id}"
        if len(part) > room:
            break
        text.append(part, style=_SEVERITY_STYLE.get(f.severity, ""))
        room -= len(part)


def fleet_rows(views: Sequence[NodeView], width: int, now: float | None = None
               ) -> list[FleetRow]:
    host_w = host_width([v.host for v in views])
    rows: list[FleetRow] = []
    for view in views:
        rows.extend(node_rows(view, width, host_w, now))
    return rows


class RowCache:
    """The rows of each node, made again only when the node has news (a new sample, another
    state or reason, a retry countdown that moved) or the width changed."""

    def __init__(self) -> None:
        self._rows: dict[str, tuple[tuple, list[FleetRow]]] = {}

    def rows(self, views: Sequence[NodeView], width: int, now: float | None = None
             ) -> list[FleetRow]:
        now = time.monotonic() if now is None else now
        host_w = host_width([v.host for v in views])
        out: list[FleetRow] = []
        for view in views:
            countdown = None if view.retry_at is None else round(view.retry_at - now)
            key = (view.seq, view.state, view.reason, view.connects, countdown, width, host_w,
                   view.findings)
            cached = self._rows.get(view.host)
            if cached is None or cached[0] != key:
                cached = (key, node_rows(view, width, host_w, now))
                self._rows[view.host] = cached
            out.extend(cached[1])
        return out


def fleet_findings(views: Sequence[NodeView]) -> list[FleetFinding]:
    """The findings of every streaming node, the most costly first."""
    out = []
    for view in views:
        if not view.live:
            continue
        for f in view.findings:
            out.append(FleetFinding(view.host, f.id, f.severity, f"{view.host}: {f.title}",
                                    f.evidence, f.fix, f.next_step, f.cost_s, f.gpu, f.pid))
    return sorted(out, key=lambda f: (-f.cost_s, -SEVERITY_RANK[f.severity], f.host, f.id,
                                      f.gpu if f.gpu is not None else -1))


def finding_line(f: FleetFinding, width: int, host_w: int) -> Text:
    """One finding on one line, cut by length (measuring cells costs more than the line) and
    styled by spans (one Text, not five appended)."""
    where = f"GPU {f.gpu}" if f.gpu is not None else ""
    head = f"{SEVERITY_MARK.get(f.severity, '•')} {f.severity:<8} "
    node = f"{truncate(f.host, host_w):<{host_w}} {where:<6} {f.id:<16} "
    title = f.title.removeprefix(f"{f.host}: ")[: max(0, width - len(head) - len(node))]
    evidence = f"  {f.evidence}"[: max(0, width - len(head) - len(node) - len(title))]
    a, b = len(head), len(head) + len(node)
    c = b + len(title)
    spans = [Span(0, a, _SEVERITY_STYLE.get(f.severity, "")), Span(a, b, "bold")]
    if evidence:
        spans.append(Span(c, c + len(evidence), "dim"))
    return Text(head + node + title + evidence, spans=spans)


class FindingRows:
    """The findings list's rows; a finding whose line has not changed keeps its Text."""

    def __init__(self) -> None:
        self._lines: dict[tuple, Text] = {}

    def rows(self, findings: Sequence[FleetFinding], width: int) -> list[FleetRow]:
        if not findings:
            return [FleetRow(("", None), "", None, Text("no findings on any node",
                                                          style="dim"))]
        host_w = host_width([f.host for f in findings])
        lines: dict[tuple, Text] = {}
        rows = []
        for f in findings:
            key = (f, width, host_w)
            text = self._lines.get(key) or finding_line(f, width, host_w)
            lines[key] = text
            rows.append(FleetRow((f.host, f.gpu), f.host, f.gpu, text))
        self._lines = lines
        return rows


def finding_rows(findings: Sequence[FleetFinding], width: int) -> list[FleetRow]:
    """One line per finding, most costly first: severity, node, GPU, id, title, evidence. A
    fleet has hundreds; the node's own screen (Enter) shows each with its fix."""
    return FindingRows().rows(findings, width)


def summary_text(views: Sequence[NodeView], interval: float, width: int) -> Text:
    counts: dict[str, int] = {}
    for v in views:
        counts[v.state] = counts.get(v.state, 0) + 1
    gpus = sum(len(v.snapshot.gpus) for v in views if v.live and v.snapshot is not None)
    text = Text("gputop fleet", style="bold")
    text.append(f"  {len(views)} nodes: ")
    parts = [f"{counts.get(s, 0)} {s}" for s in ("up", SLOW, CONNECTING, DOWN, NO_GPUTOP, BAD)
             if counts.get(s)]
    text.append(", ".join(parts) or "none")
    text.append(f"  {gpus} GPUs  every {interval:g} s  {time.strftime('%H:%M:%S')}")
    return text
