"""The human report of a trace analysis: pure string building, shared by ``gputop analyze`` and
``gputop capture``. Plain text (no colour codes) so it reads the same in a terminal, a log or
an issue comment."""

from __future__ import annotations

import os
import textwrap

from gputop.core.format import ms_h, safe_text
from gputop.diagnostics.findings import CATALOGUE, NOT_ASSESSED
from gputop.diagnostics.trace.analysis import TraceAnalysis
from gputop.diagnostics.trace.measuring.busy import CLASS_LABELS, copy_text, size_text
from gputop.diagnostics.trace.measuring.compiled import compiled_lines
from gputop.diagnostics.trace.measuring.host import HOST_STATES
from gputop.diagnostics.trace.measuring.kernels import kernel_base_name, short_kernel_name
from gputop.diagnostics.trace.reporting.roofline_plot import roofline_text

# Step-time roles in the bar: (metric key(s), letter, label). Letters, not colours, so the bar
# survives copy-paste; the legend below it spells them out. Busy roles first, then the causes
# of idle time found by gap attribution.
BAR_ROLES = (
    (("compute",), "C", "compute"),
    (("communication",), "N", "communication (exposed)"),
    (("memcpy", "memset"), "M", "memcpy/memset"),
    (("sync",), "S", "idle: host sync"),
    (("copy",), "P", "idle: blocking copy"),
    (("allocator",), "A", "idle: cudaMalloc/Free"),
    (("startup",), "W", "idle: start-up"),
    (("dataloader",), "D", "idle: DataLoader"),
    (("launch",), "L", "idle: launch path"),
    (("host",), "H", "idle: host work"),
    (("unprofiled",), ".", "idle: nothing profiled"),
    (("queued",), "Q", "idle: queued on the device"),
    (("unrecorded",), "?", "idle: cause not recorded"),
)


# GPU activity not recorded: the training thread's own time by state (trace_host), with the
# same letters as the idle causes they would explain.
HOST_BAR_ROLES = tuple((keys, letter, label.removeprefix("idle: "))
                       for keys, letter, label in BAR_ROLES if keys[0] in HOST_STATES)


def breakdown_bar(pct: dict[str, float], width: int, roles=BAR_ROLES) -> tuple[str, str]:
    """A ``width``-character bar of the step-time shares and its legend (largest first)."""
    shares = [
        (letter, label, sum(pct.get(k, 0.0) for k in keys)) for keys, letter, label in roles
    ]
    total = sum(s for _, _, s in shares)
    if total <= 0:
        return "." * width, ""
    exact = [(letter, width * s / total) for letter, _, s in shares]
    cells = {letter: int(x) for letter, x in exact}
    # Largest remainders get the leftover cells so the bar is exactly ``width`` long.
    leftover = width - sum(cells.values())
    for letter, _x in sorted(exact, key=lambda e: -(e[1] - int(e[1])))[:leftover]:
        cells[letter] += 1
    bar = "".join(letter * cells[letter] for _, letter, _ in roles)
    legend = "  ".join(
        f"{letter} {label} {s:.1f}%"
        for letter, label, s in sorted(shares, key=lambda e: -e[2])
        if s >= 0.05
    )
    return bar, legend


def _wrap(text: str, width: int, first: str, rest: str) -> list[str]:
    return textwrap.wrap(
        text, width=width, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False
    ) or [first.rstrip()]


def _wrap_parts(parts: list[str], width: int, first: str, rest: str,
                sep: str = " · ") -> list[str]:
    """``parts`` joined by ``sep``, broken between parts where a line is full (a figure such
    as "GPU busy 1.6%" is never split from its words); a part longer than a line is wrapped."""
    lines: list[str] = []
    line = ""
    for part in parts:
        joined = f"{line}{sep}{part}" if line else (rest if lines else first) + part
        if line and len(joined) > width:
            lines.append(line)  # the next line's indent says it goes on
            line = rest + part
        else:
            line = joined
        if len(line) > width:
            wrapped = _wrap(line.strip(), width, rest if lines else first, rest)
            lines += wrapped[:-1]
            line = wrapped[-1]
    return [*lines, line] if line else lines


def _headline(a: TraceAnalysis) -> str:
    m = a.metrics
    parts = []
    device = m["trace"].get("device")
    if device:
        parts.append(device)
    elif not m["trace"]["gpu_activity"] and not m["trace"].get("gpu_unrecorded"):
        parts.append("CPU-only trace")
    if m["trace"].get("gpu_unrecorded"):
        parts.append("GPU activity not recorded")
    if m["trace"].get("rank") is not None:
        ws = m["trace"].get("world_size")
        parts.append(f"rank {m['trace']['rank']}" + (f" of {ws}" if ws else ""))
    steps = m["steps"]
    if steps["count"]:
        names = steps["names"]
        span = f"{names[0]}..{names[-1].split('#')[-1]}" if len(names) > 1 else names[0]
        kind = "step" if m["window"]["steps_from"] == "ProfilerStep" else "iteration"
        plural = "s" if steps["count"] != 1 else ""
        parts.append(f"{steps['count']} {kind}{plural} ({span})")
        parts.append(f"step {ms_h(steps['mean_ms'])} mean, {ms_h(steps['max_ms'])} max")
    else:
        parts.append(f"{ms_h(m['window']['dur_ms'])} judged (no steps)")
    busy = m["gpu"]["busy_pct_of_steps"]
    if busy is not None:
        parts.append(f"GPU busy {busy:.1f}%")
    return " · ".join(parts)


def _busy_lines(m: dict, width: int) -> list[str]:
    """What the GPU's busy time was: each class with its share of the window, copies with
    their bytes and rate (against the host link for host-device copies)."""
    busy = m.get("busy")
    if not busy or not m["trace"]["gpu_activity"]:
        return []
    parts = []
    for cls, row in sorted(busy["classes"].items(), key=lambda kv: -kv[1]["ms"]):
        if row["ms"] <= 0:
            continue
        if "gb_per_s" in row and row.get("bytes"):
            text = copy_text(cls, row, busy["link"])
        else:
            text = f"{CLASS_LABELS[cls]} {ms_h(row['ms'])}"
        parts.append(f"{text} ({row['pct']:.1f}%)")
    if not parts:
        return []
    return _wrap("GPU busy time: " + "; ".join(parts), width, "  ", "    ")


def _one_off_lines(m: dict, width: int) -> list[str]:
    """Steps left out of the judgement as one-offs, and what their time went to."""
    lines = []
    labels = {keys[0]: label for keys, _, label in BAR_ROLES}
    for o in m.get("one_offs") or []:
        what = ", ".join(f"{labels.get(role, role)} {ms_h(ms)}" for role, ms in o["top"])
        if o.get("h2d_bytes"):
            what += f"; host-to-device copies {size_text(o['h2d_bytes'])}"
        if o.get("profiler_stop"):
            what += "; it holds the profiler's closing synchronize"
        lines += _wrap(f"One-off {o['position']} step, not judged: {o['step']} {ms_h(o['ms'])}, "
                       f"{ms_h(o['excess_ms'])} more idle or copy time than any steady step ({what})",
                       width, "  ", "    ")
    return lines


def roofline_lines(section: dict, width: int) -> list[str]:
    """The roofline chart and its classes; or why there is none."""
    if not section.get("shapes_recorded"):
        return ["", *_wrap("Roofline: shapes not recorded (profile with record_shapes=True to "
                           "place each op on the GPU's roofline)", width, "", "  ")]
    gpu = section.get("gpu") or {}
    head = f"Roofline on {gpu.get('name') or 'a GPU the trace does not name'}"
    if not gpu.get("memory_bandwidth"):
        head += " (its roofs are not known: intensities and bounds only)"
    return ["", head + ":", *roofline_text(section, width)]


def format_report(analysis: TraceAnalysis, width: int = 100) -> str:
    width = max(60, width)
    a, m = analysis, analysis.metrics
    lines = _wrap(f"gputop analyze: {os.path.basename(a.file)}", width, "", "  ")
    lines += _wrap_parts(_headline(a).split(" · "), width, "", "  ")
    unrecorded = m["trace"].get("gpu_unrecorded")
    if a.verdict == "healthy":
        lines += _wrap(f"Verdict: healthy - {a.healthy_reason}", width, "", "  ")
    elif a.verdict == NOT_ASSESSED:
        lines += _wrap(f"Verdict: not assessed - GPU activity was not recorded ({unrecorded}); "
                       "only the host is assessed, and it shows no problem", width, "", "  ")
    else:
        top = next(f for f in a.findings if f.id == a.verdict)
        verdict = f"Verdict: {a.verdict} ({top.severity}) - {CATALOGUE[a.verdict]}"
        if unrecorded:
            verdict += " (host side only: GPU activity was not recorded)"
        lines += _wrap(verdict, width, "", "  ")

    bd = m["step_breakdown"]
    what = "step time" if m["steps"]["count"] else "window"
    if unrecorded:
        lines += ["", f"Where the training thread's {what} went ({ms_h(bd['ms']['total'])} in "
                  "all; GPU activity not recorded)"]
        bar, legend = breakdown_bar(m["host_breakdown"]["pct"], width - 4, HOST_BAR_ROLES)
    else:
        lines += ["", f"Where the {what} went ({ms_h(bd['ms']['total'])} in all)"]
        bar, legend = breakdown_bar(bd["pct"], width - 4)
    lines.append(f"  [{bar}]")
    lines += _wrap_parts(legend.split("  "), width, "  ", "  ", sep="  ") if legend else [""]
    lines += _wrap(f"Window: {m['window']['judged']}", width, "  ", "    ")
    idle = m.get("idle_attribution") or {}
    named = [
        f"{cause} {row['pct']:.1f}% ({', '.join(label for label, _ in row['top'][:2])})"
        if row.get("top") else
        f"{cause} {row['pct']:.1f}% (waiting for {', '.join(w['label'] for w in row['waits_for'][:2])})"
        for cause, row in sorted(idle.items(), key=lambda kv: -kv[1]["ms"])
        if (row.get("top") or row.get("waits_for")) and row["pct"] >= 1
    ]
    if named:
        lines += _wrap("Idle, by what the launching thread was doing: " + "; ".join(named[:4]),
                       width, "  ", "    ")

    lines += _busy_lines(m, width)
    lines += _one_off_lines(m, width)
    for line in compiled_lines(m):  # torch.compile's regions and compiles
        lines += _wrap(line, width, "  ", "    ")

    lines += ["", "Findings, most costly first" if a.findings else "Findings: none"]
    for i, f in enumerate(a.findings, 1):
        cost = f"  (costs {ms_h(f.cost_s * 1e3)})" if f.cost_s > 0 else ""
        lines += _wrap(f"{i}. [{f.severity.upper()}] {f.id}: {f.title}{cost}", width, "  ", "     ")
        lines += _wrap(f"Evidence: {f.evidence}", width, "     ", "       ")
        if f.where:  # set by `gputop capture` from py-spy samples joined to the steps
            lines += _wrap(f"Where: {f.where}", width, "     ", "       ")
        lines += _wrap(f"Fix: {f.fix}", width, "     ", "       ")
        lines += _wrap(f"Next: {f.next_step}", width, "     ", "       ")

    if m["trace"]["gpu_activity"]:
        t, idle, k = m["temporal"], m["idle_split"], m["kernels"]
        lines += [""]
        lines += _wrap(
            f"GPU: idle {t['idle_pct']:.1f}% of its active span {ms_h(t['span_ms'])} (HTA: "
            f"host wait {idle['host_wait_pct']:.0f}%, kernel wait {idle['kernel_wait_pct']:.0f}%, "
            f"other {idle['other_pct']:.0f}%); compute {t['compute_pct']:.1f}%, communication "
            f"{t['communication_pct']:.1f}%, memcpy {t['memcpy_pct']:.1f}%",
            width,
            "",
            "     ",
        )
        lines += _wrap(
            f"Kernels: {k['count']:,}, median {k['duration_us']['p50']:.1f} us, p90 "
            f"{k['duration_us']['p90']:.1f} us, {k['under_10us_pct']:.0f}% under 10 us; "
            f"{k['launch_rate_per_s']:,.0f} launches/s ({k['launches_per_step']:,.0f} per step); "
            f"host {k.get('host_us_per_launch', 0):.0f} us in the launch path per launch vs "
            f"{k.get('gpu_us_per_kernel', 0):.1f} us of GPU time per kernel",
            width,
            "",
            "     ",
        )
    ops = m.get("top_ops") or []
    if ops:
        text = " · ".join(f"{o['name']} {ms_h(o['self_ms'])}" for o in ops[:5])
        lines += _wrap(f"Top CPU ops (self time): {text}", width, "", "     ")
    kernels = m.get("top_kernels") or []
    if kernels:
        text = " · ".join(
            f"{short_kernel_name(k['name'], 48)} {ms_h(k['ms'])} ({k['pct']:.0f}%)"
            for k in kernels[:5]
        )
        lines += _wrap(f"Top kernels (GPU time): {text}", width, "", "     ")
        if m["trace"].get("vendor") != "amd":
            lines += _wrap(
                f"Look inside the top kernel: ncu --kernel-name {kernel_base_name(kernels[0]['name'])} "
                "--launch-skip 10 --launch-count 1 --set full -o top_kernel python train.py",
                width,
                "  ",
                "     ",
            )
    mem = m.get("memory") or {}
    if mem.get("peak_allocated_bytes"):
        peaks = ", ".join(
            f"GPU {d} {b / 2**30:.2f} GiB"
            + (
                f" ({mem['peak_pct_of_capacity'][d]:.0f}%)"
                if d in mem.get("peak_pct_of_capacity", {})
                else ""
            )
            for d, b in mem["peak_allocated_bytes"].items()
        )
        lines.append(f"Peak memory: {peaks}")
    elif mem.get("peak_rise_bytes"):
        rises = ", ".join(
            f"GPU {d} +{b / 2**30:.2f} GiB" for d, b in mem["peak_rise_bytes"].items()
        )
        lines.append(f"Memory allocated within the trace rose by: {rises}")
    if a.roofline is not None:
        lines += roofline_lines(a.roofline.to_json(), width)
    lines.append("")
    lines += _wrap("Assessed: " + "; ".join(a.assessed), width, "", "  ")
    if a.not_assessed:
        lines += _wrap("Not assessed: " + "; ".join(a.not_assessed), width, "", "  ")
    if a.cut:  # detail the trace lost to its budget: what the analysis could not see
        lines += _wrap("Cut: " + "; ".join(a.cut), width, "", "  ")
    # Op, kernel and device names come from the file: no line may carry a terminal escape.
    return "\n".join(safe_text(line) for line in lines) + "\n"


def format_cross_rank(cross, width: int = 100) -> str:
    """The ranks of one job side by side (``trace_ranks.CrossRank``): per rank its step,
    compute, exposed communication split into waiting for a late rank and moving data, its
    straggler score and own top cause; then the straggler."""
    width = max(60, width)
    lines = [f"Ranks of one job ({len(cross.rows)} traces, {len(cross.steps)} common steps; "
             f"compared by {cross.method})", ""]
    head = (f"  {'rank':<10} {'step':>9} {'compute':>9} {'exposed comm':>13} {'waiting':>9} "
            f"{'bandwidth':>10} {'score':>6}  own top cause")
    lines.append(head)
    for r in cross.rows:
        lines.append(
            f"  {r.label[:10]:<10} {ms_h(r.step_ms):>9} {ms_h(r.compute_ms):>9} "
            f"{ms_h(r.exposed_comm_ms):>13} {ms_h(r.exposed_wait_ms):>9} "
            f"{ms_h(r.exposed_bandwidth_ms):>10} {r.straggler_score:>6.2f}  "
            f"{r.top_cause or '-'}")
    lines.append("  (per step; waiting: exposed communication spent waiting for a late rank)")
    lines.append("")
    if cross.straggler is None:
        lines += _wrap("No straggler: no rank holds the others back.", width, "", "  ")
    for f in cross.findings:
        lines += _wrap(f"[{f.severity.upper()}] {f.id}: {f.title}", width, "", "  ")
        lines += _wrap(f"Evidence: {f.evidence}", width, "  ", "    ")
        lines += _wrap(f"Fix: {f.fix}", width, "  ", "    ")
    return "\n".join(safe_text(line) for line in lines) + "\n"
