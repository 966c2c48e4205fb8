"""The diagnosis of a capture as a picture: the step-time bar in colour by role, the findings
in their severity's colour, the top kernels and CPU ops as tables, the trace and how to open it.

The same metrics as the plain report (gputop/diagnostics/trace/reporting/report.py, whose BAR_ROLES and
letters it reuses): every bar cell keeps its role's letter on the role's colour, so the bar
still reads without colour (NO_COLOR) and matches `gputop analyze`'s legend.
"""

from __future__ import annotations

import os

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from gputop.core.format import ms_h, safe_text
from gputop.diagnostics.findings import CATALOGUE, NOT_ASSESSED
from gputop.diagnostics.trace.analysis import TraceAnalysis
from gputop.diagnostics.trace.measuring.kernels import kernel_base_name, short_kernel_name
from gputop.diagnostics.trace.reporting.report import BAR_ROLES, breakdown_bar, format_report

PERFETTO = "https://ui.perfetto.dev"
# Busy roles in cool colours, idle causes in warm ones; the dark text keeps the letter legible.
ROLE_STYLE = {
    "C": "black on green",
    "N": "black on magenta",
    "M": "black on cyan",
    "S": "white on red",
    "P": "black on dark_orange",
    "A": "black on yellow",
    "W": "white on grey42",
    "D": "white on bright_red",
    "L": "white on blue",
    "H": "black on bright_blue",
    ".": "white on grey27",
    "Q": "black on bright_cyan",
    "?": "white on grey19",
}
SEVERITY_STYLE = {"critical": "bold red", "warning": "bold yellow", "info": "bold cyan"}
# The plain report's lines kept under the tables (statistics a glance does not need first).
DETAIL_PREFIXES = ("GPU: idle", "Kernels:", "Peak memory", "Memory allocated", "Assessed",
                   "Not assessed")


def title_text(pid: int, analysis: TraceAnalysis) -> Text:
    text = Text(f"diagnosis of pid {pid}: ", style="bold")
    if analysis.verdict == "healthy":
        text.append("healthy", style="bold green")
    elif analysis.verdict == NOT_ASSESSED:
        text.append("not assessed: GPU activity was not recorded", style="bold yellow")
    else:
        top = next((f for f in analysis.findings if f.id == analysis.verdict), None)
        text.append(analysis.verdict, style=SEVERITY_STYLE.get(top.severity if top else "",
                                                              "bold yellow"))
        text.append(f" - {CATALOGUE.get(analysis.verdict, '')}")
    return text


def open_text(trace: str) -> Text:
    """Where the trace is and the two ways to look at it."""
    trace = safe_text(trace)  # named by the agent: no terminal escapes
    text = Text("trace: ", style="bold")
    text.append(trace)
    text.append("\nopen it: ", style="bold")
    text.append(f"{PERFETTO} (Open trace file)  or  "
                f"tensorboard --logdir {os.path.dirname(trace) or '.'}")
    return text


def bar_text(pct: dict[str, float], width: int) -> tuple[Text, Text]:
    """The bar (each cell its role's letter on its colour) and the legend, largest first,
    laid out in lines of whole entries."""
    bar, _ = breakdown_bar(pct, width)
    text = Text()
    for letter in dict.fromkeys(bar):
        text.append(letter * bar.count(letter), style=ROLE_STYLE.get(letter, ""))
    legend = Text()
    used = 0
    shares = [(letter, label, sum(pct.get(k, 0.0) for k in keys))
              for keys, letter, label in BAR_ROLES]
    for letter, label, share in sorted(shares, key=lambda e: -e[2]):
        if share < 0.05:
            continue
        entry = f" {label} {share:.1f}%"
        size = 3 + len(entry)
        if used and used + 3 + size > width:
            legend.append("\n")
            used = 0
        elif used:
            legend.append("   ")
            used += 3
        legend.append(f" {letter} ", style=ROLE_STYLE.get(letter, ""))
        legend.append(entry)
        used += size
    return text, legend


def findings_renderable(analysis: TraceAnalysis) -> RenderableType:
    """Each finding in its severity's colour; evidence, fix and next step indented under it
    (wrapped lines keep the indent)."""
    if not analysis.findings:
        return Text(f"Findings: none. {analysis.healthy_reason or ''}".strip(), style="green")
    parts: list[RenderableType] = [Text("Findings, most costly first", style="bold underline")]
    for i, f in enumerate(analysis.findings, 1):
        style = SEVERITY_STYLE.get(f.severity, "bold")
        cost = f"  (costs {ms_h(f.cost_s * 1e3)})" if f.cost_s > 0 else ""
        parts.append(Text.assemble(f"{i}. ", (f"[{f.severity.upper()}] {f.id}", style),
                                   f": {safe_text(f.title)}{cost}"))
        grid = Table.grid(padding=(0, 1))
        grid.add_column(width=2)
        grid.add_column(no_wrap=True, style="bold")
        grid.add_column(ratio=1)
        grid.add_row("", "Evidence:", safe_text(f.evidence))
        if f.where:  # where in the code (py-spy samples joined to the steps)
            grid.add_row("", "Where:", safe_text(f.where))
        grid.add_row("", "Fix:", safe_text(f.fix))
        if f.next_step:
            grid.add_row("", "Next:", Text(safe_text(f.next_step), style="dim"))
        parts.append(grid)
    return Group(*parts)


def tables_renderable(analysis: TraceAnalysis, width: int) -> RenderableType | None:
    m = analysis.metrics
    kernels, ops = m.get("top_kernels") or [], m.get("top_ops") or []
    if not kernels and not ops:
        return None
    half = max(30, (width - 3) // 2)
    grid = Table.grid(padding=(0, 3), expand=True)
    cells = []
    if kernels:
        t = Table(title="Top kernels (GPU time)", title_justify="left", title_style="bold",
                  box=None, padding=(0, 1), expand=True, header_style="bold dim")
        t.add_column("kernel", no_wrap=True, overflow="ellipsis", ratio=1)
        t.add_column("GPU", justify="right", no_wrap=True)
        t.add_column("%", justify="right", no_wrap=True)
        t.add_column("calls", justify="right", no_wrap=True)
        for k in kernels[:8]:
            t.add_row(safe_text(short_kernel_name(k["name"], max(20, half - 22))),
                      ms_h(k["ms"]), f"{k['pct']:.0f}", str(k.get("calls", "")))
        cells.append(t)
    if ops:
        t = Table(title="Top CPU ops (self time)", title_justify="left", title_style="bold",
                  box=None, padding=(0, 1), expand=True, header_style="bold dim")
        t.add_column("operator", no_wrap=True, overflow="ellipsis", ratio=1)
        t.add_column("self", justify="right", no_wrap=True)
        t.add_column("calls", justify="right", no_wrap=True)
        for o in ops[:8]:
            t.add_row(safe_text(o["name"]), ms_h(o["self_ms"]), str(o.get("calls", "")))
        cells.append(t)
    if width >= 100 and len(cells) == 2:
        grid.add_column(ratio=1)
        grid.add_column(ratio=1)
        grid.add_row(*cells)
        parts: list[RenderableType] = [grid]
    else:
        parts = list(cells)
    if kernels and m["trace"].get("vendor") != "amd":
        parts.append(Text.assemble(
            ("Look inside the top kernel: ", "bold"),
            (f"ncu --kernel-name {safe_text(kernel_base_name(kernels[0]['name']))} "
             "--launch-skip 10 --launch-count 1 --set full -o top_kernel python train.py",
             "dim")))
    return Group(*parts)


def details_text(analysis: TraceAnalysis, width: int) -> Text:
    """The plain report's statistics (GPU idle split, kernel figures, memory, what was
    assessed), as they read in `gputop analyze`."""
    keep, out = False, []
    for line in format_report(analysis, width).splitlines():
        if line and not line.startswith(" "):
            keep = line.startswith(DETAIL_PREFIXES)
        if keep and line:
            out.append(line)
    return Text("\n".join(out), style="dim")


def diagnosis_renderable(analysis: TraceAnalysis, trace: str, width: int,
                         source: str = "") -> RenderableType:
    """Everything below the title, for a screen ``width`` cells wide."""
    m = analysis.metrics
    bd = m["step_breakdown"]
    what = "step time" if m["steps"]["count"] else "window"
    headline = format_report(analysis, width).splitlines()
    parts: list[RenderableType] = []
    # The report's second line is the headline: device, steps, step time, GPU busy.
    if len(headline) > 1:
        parts.append(Text(headline[1], style="bold"))
    parts += [open_text(trace), Text("")]
    parts.append(Text(f"Where the {what} went ({ms_h(bd['ms']['total'])} in all)",
                      style="bold underline"))
    bar, legend = bar_text(bd["pct"], max(20, width - 2))
    parts += [bar, legend]
    parts.append(Text(f"Window: {m['window']['judged']}", style="dim"))
    parts.append(Text(""))
    parts.append(findings_renderable(analysis))
    tables = tables_renderable(analysis, width)
    if tables is not None:
        parts += [Text(""), tables]
    details = details_text(analysis, width)
    if details.plain:
        parts += [Text(""), details]
    if source:
        parts += [Text(""), Text(source)]
    return Group(*parts)
