"""The terminal and HTML renderings of a recording's summary."""

from __future__ import annotations

import html
import time
from typing import Any

import numpy as np
import pandas as pd

from gputop.core.efficiency import joules_text, share_text
from gputop.core.format import bytes_h, num, safe_text, truncate
from gputop.recording.efficiency import efficiency_lines
from gputop.recording.store import Recording
from gputop.recording.summary import process_rows
from gputop.recording.textchart import bin_means, sparkline

# (column, label, y max) for the charts; None: the GPU's own total / limit.
CHARTS = (("util_gpu", "utilization (0-100 %)", 100.0),
          ("mem_used", "memory (0-total)", None),
          ("power_w", "power (0-limit W)", None))


def _clock(t: float | None) -> str:
    try:
        return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
    except (OverflowError, OSError, ValueError):  # read from a file: any number may come
        return "-"


def _series(rec: Recording, width: int, procs: pd.DataFrame
            ) -> list[tuple[str, list[tuple[str, str]]]]:
    """(title, [(label, sparkline)]) blocks: one per metric, one row per GPU, plus throughput."""
    if rec.gpus.empty:
        return []
    start, end = float(rec.gpus["time"].min()), float(rec.gpus["time"].max())
    # No more columns than samples: a column without a sample would print as a gap.
    width = max(1, min(width, int(rec.gpus.groupby("gpu").size().min())))
    blocks = []
    for column, title, vmax in CHARTS:
        rows = []
        for index, g in rec.gpus.groupby("gpu"):
            top = vmax
            if top is None:
                limit = g["mem_total" if column == "mem_used" else "power_limit_w"].max()
                top = float(limit) if limit == limit else float(g[column].max() or 1)
            values = bin_means(g["time"].to_numpy(), g[column].to_numpy(dtype=float), start, end, width)
            rows.append((f"GPU {index}", sparkline(values, top)))
        blocks.append((title, rows))
    if not procs.empty and procs["steps_per_s"].notna().any():
        rows = []
        for pid, p in procs.groupby("pid"):
            rate = p["steps_per_s"].to_numpy(dtype=float)
            if np.isnan(rate).all():
                continue
            values = bin_means(p["time"].to_numpy(), rate, start, end, width)
            rows.append((f"pid {pid}", sparkline(values, float(np.nanmax(rate)) or 1.0)))
        blocks.append(("throughput (0-peak steps/s)", rows))
    return blocks


def format_report(summary: dict[str, Any], rec: Recording, width: int = 72) -> str:
    m = summary["meta"]
    out = [f"recording {summary['recording']}: {m.get('host')}, {_clock(summary['start'])} to "
           f"{_clock(summary['end'])} ({num(summary['duration_s'])} s)"
           + (f", simulated: {m['simulated']}" if m.get("simulated") else "")]
    out.append(f"driver {m.get('driver_version') or 'n/a'}  CUDA {m.get('cuda_version') or 'n/a'}  "
               f"gputop {m.get('gputop_version')}")
    out.append("")
    out.append(f"{'GPU':<4} {'NAME':<22} {'UTIL mean/p5/p50/p95':>22} {'PEAK MEM':>9} "
               f"{'POWER':>7} {'ENERGY':>14}  THROTTLED")
    for g in summary["gpus"]:
        util = "/".join(num(g[k]) for k in ("util_mean", "util_p5", "util_p50", "util_p95"))
        energy = (f"{g['energy_j'] / 1000:.1f} kJ {g['energy_kwh']:.3f} kWh"
                  if g["energy_j"] is not None else "n/a")
        throttle = "-"
        if g["throttled_s"]:
            why = ", ".join(f"{k} {v:.0f}s" for k, v in g["throttled_by"].items())
            throttle = f"{g['throttled_s']:.0f} s ({why})"
        if g["lost"]:
            throttle += "  LOST during the run"
        out.append(f"[{g['gpu']}]  {(g['name'] or '?')[:22]:<22} {util:>22} "
                   f"{bytes_h(g['mem_peak']):>9} {num(g['power_mean_w'], 0, 'W'):>7} {energy:>14}  {throttle}")
    procs = summary["processes"]
    if procs:
        out.append("")
        out.append(f"{'PID':>8} {'GPU':>3} {'NAME':<16} {'CPU':>6} {'STEPS/S':>8} {'STEP p50':>9} "
                   f"{'STEP p95':>9} {'DL WAIT':>8}")
        for p in procs:
            ms = lambda v: "n/a" if v is None else f"{v * 1000:.1f}ms"  # noqa: E731
            dl = "n/a" if p["dataloader_wait_share"] is None else f"{p['dataloader_wait_share'] * 100:.0f}%"
            out.append(f"{p['pid']:>8} {'-' if p['gpu'] is None else p['gpu']:>3} "
                       f"{process_label(p['name']):<16} {num(p['cpu_mean'], 0, '%'):>6} "
                       f"{num(p['throughput_steps_per_s'], 2):>8} {ms(p['step_time_p50_s']):>9} "
                       f"{ms(p['step_time_p95_s']):>9} {dl:>8}")
    out.append("")
    out.append("findings timeline:")
    if not summary["findings"]:
        out.append("  none raised")
    start = summary["start"] or 0
    for f in summary["findings"]:
        where = " ".join(x for x in (f"GPU {f['gpu']:.0f}" if f.get("gpu") is not None else "",
                                     f"pid {f['pid']:.0f}" if f.get("pid") is not None else "") if x)
        # The reader skips parts with empty ids, states or severities; text here all the same.
        state, severity, fid = (str(f.get(k) or "?") for k in ("state", "severity", "id"))
        out.append(f"  +{f['time'] - start:7.0f}s {state:<8} {severity:<8} {fid:<17} "
                   f"{where}: {f.get('evidence') or ''}")
    for title, rows in (_series(rec, width, process_rows(rec, summary)) if width > 0 else []):
        out.append("")
        out.append(f"{title}, {_clock(summary['start'])} .. {_clock(summary['end'])}")
        for label, line in rows:
            out.append(f"  {label:>9} │{line}│")
    out.append("")
    out.extend(job_lines(summary))
    out.extend(efficiency_lines(summary))
    out.append("metrics: " + format_metrics(summary["metrics"]))
    # Names, hosts and evidence were read from files: no line may carry a terminal escape.
    return "\n".join(safe_text(line) for line in "\n".join(out).split("\n"))


def _where(job: dict[str, Any]) -> str:
    gpus = job.get("gpus") or []
    if not gpus:
        return "no GPU"
    return ("GPU " if len(gpus) == 1 else "GPUs ") + ",".join(str(g) for g in gpus)


# The collector's name for a pid it could not read in /proc; the monitor says why at length
# ("not in /proc: it has just exited, or ..."), this table in the same words, shortly.
_NOT_VISIBLE = "(not visible"
GONE = "(not in /proc)"


def process_label(name: str | None, width: int = 16) -> str:
    """A process's name in a column of ``width``: marked when cut, never cut mid-word into
    nonsense ("(not visible: ot")."""
    if not name:
        return "?"
    if name.startswith(_NOT_VISIBLE):
        return GONE
    return truncate(name, width)


def job_lines(summary: dict[str, Any]) -> list[str]:
    """Which training job the figures are from, and the others, by pid and command."""
    jobs = summary.get("jobs") or []
    if not jobs:
        return ["training job: none reported steps (start it with `gputop run -- CMD` so its "
                "agent reports throughput and step times)"]
    lines = []
    for i, job in enumerate(jobs):
        label = "training job" if i == 0 else "other job"
        figures = (f"{num(job['throughput_steps_per_s'], 2)} steps/s"
                   + (f", DataLoader wait {job['dataloader_wait_share'] * 100:.0f}%"
                      if job.get("dataloader_wait_share") is not None else ""))
        lines.append(f"{label}: pid {job['pid']} on {_where(job)}: {figures}: "
                     f"{truncate(str(job['command']), 80)}")
    return lines


def format_metrics(m: dict[str, Any]) -> str:
    """metrics.json in words and units (the file keeps the raw numbers)."""
    ms = lambda v: f"{v * 1000:.1f} ms"  # noqa: E731
    parts = [
        ("throughput", m.get("throughput_steps_per_s"), lambda v: f"{v:.3g} steps/s"),
        ("step p50", m.get("step_time_p50_s"), ms),
        ("step p95", m.get("step_time_p95_s"), ms),
        ("DataLoader wait", m.get("dataloader_wait_share"), lambda v: f"{v * 100:.0f}%"),
        ("mean GPU util", m.get("mean_gpu_utilization"), lambda v: f"{v:.1f}%"),
        ("peak GPU memory", m.get("peak_gpu_memory_bytes"), bytes_h),
        ("energy", m.get("energy_j"), lambda v: f"{v / 1000:.1f} kJ"),
        ("energy per step", m.get("energy_per_step_j"), lambda v: f"{v:.1f} J"),
        ("MFU", m.get("mfu"), share_text),
        ("goodput", m.get("goodput"), share_text),
        ("job energy per step", m.get("job_energy_per_step_j"), joules_text),
        ("per sample", m.get("job_energy_per_sample_j"), joules_text),
        ("duration", m.get("duration_s"), lambda v: f"{v:.0f} s"),
    ]
    return ", ".join(f"{name} {fmt(v)}" for name, v, fmt in parts if v is not None) or "none"


def _svg_chart(title: str, series: list[tuple[str, np.ndarray, np.ndarray]], start: float,
               end: float, vmax: float, width: int = 720, height: int = 160) -> str:
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"]
    lines = []
    for i, (label, t, v) in enumerate(series):
        keep = ~np.isnan(v)
        if not keep.any() or end <= start:
            continue
        xs = (t[keep] - start) / (end - start) * width
        ys = height - np.clip(v[keep] / (vmax or 1), 0, 1) * height
        points = " ".join(f"{x:.1f},{y:.1f}" for x, y in zip(xs, ys))
        color = colors[i % len(colors)]
        lines.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.2" points="{points}">'
                     f"<title>{html.escape(label)}</title></polyline>")
        lines.append(f'<text x="{width + 6}" y="{14 + 14 * i}" fill="{color}" font-size="11">'
                     f"{html.escape(label)}</text>")
    return (f"<h3>{html.escape(title)}</h3><svg width='{width + 90}' height='{height}' "
            f"style='background:#fafafa;border:1px solid #ddd'>{''.join(lines)}</svg>")


def format_html(summary: dict[str, Any], rec: Recording) -> str:
    """A self-contained page: the tables and the charts as inline SVG."""
    parts = ["<!doctype html><meta charset='utf-8'><title>gputop report</title>",
             "<style>body{font-family:sans-serif;margin:2em}td,th{padding:2px 8px;text-align:right}"
             "pre{background:#f4f4f4;padding:1em}</style>",
             f"<h1>gputop report: {html.escape(str(summary['meta'].get('host')))}</h1>",
             f"<pre>{html.escape(format_report(summary, rec, width=0))}</pre>"]
    if not rec.gpus.empty:
        start, end = float(rec.gpus["time"].min()), float(rec.gpus["time"].max())
        for column, title, vmax in CHARTS:
            series, top = [], vmax
            for index, g in rec.gpus.groupby("gpu"):
                g = g.sort_values("time")
                series.append((f"GPU {index}", g["time"].to_numpy(), g[column].to_numpy(dtype=float)))
                if vmax is None:
                    ref = g["mem_total" if column == "mem_used" else "power_limit_w"].max()
                    top = max(top or 0.0, float(ref) if ref == ref else 0.0)
            parts.append(_svg_chart(title, series, start, end, top or 1.0))
        procs = process_rows(rec, summary)
        if not procs.empty and procs["steps_per_s"].notna().any():
            series = [(f"pid {pid}", p["time"].to_numpy(), p["steps_per_s"].to_numpy(dtype=float))
                      for pid, p in procs.sort_values("time").groupby("pid")]
            top = float(np.nanmax(procs["steps_per_s"].to_numpy(dtype=float)))
            parts.append(_svg_chart("throughput (steps/s)", series, start, end, top))
    return "\n".join(parts)
