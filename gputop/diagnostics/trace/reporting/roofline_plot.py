"""The roofline drawn: as an SVG (``gputop analyze TRACE --plot FILE.svg``) and as a compact
text chart for the terminal report.

Both take the JSON ``roofline`` section (``Roofline.to_json``), so a report of a recorded
analysis draws the same picture. Log-log axes: arithmetic intensity (FLOP per byte) across,
FLOP/s up; the memory roof is the line bandwidth x intensity, each compute roof a flat line at
the peak of its precision; each op class is a point at its intensity and achieved FLOP/s, its
area proportional to its GPU time. A class that does no FLOPs (copies, gathers) has no place on
a log axis and is listed under the chart instead.
"""

from __future__ import annotations

import math
import textwrap
from xml.sax.saxutils import escape

from gputop.core.format import ms_h

CLASS_COLOURS = {
    "gemm": "#1f77b4", "conv": "#17becf", "attention": "#9467bd", "elementwise": "#d62728",
    "norm": "#ff7f0e", "softmax": "#e377c2", "reduction": "#8c564b", "embedding": "#7f7f7f",
    "optimizer": "#2ca02c", "other": "#bcbd22",
}
CLASS_MARKS = {"gemm": "G", "conv": "C", "attention": "A", "elementwise": "e", "norm": "n",
               "softmax": "s", "reduction": "r", "embedding": "m", "optimizer": "o",
               "other": "?"}
# The roofs drawn, most telling first: what matrix work and everything else can reach.
ROOF_ORDER = ("fp8", "bf16", "fp16", "tf32", "fp32", "fp64")


def _points(section: dict) -> tuple[list[tuple[str, float, float, float]], list[str]]:
    """(class, intensity, achieved FLOP/s, gpu_ms) of each drawable class; the names of the
    classes that cannot be drawn, with why."""
    points, left = [], []
    for cls, row in (section.get("classes") or {}).items():
        x, y, ms = row.get("intensity"), row.get("achieved_flops"), row.get("gpu_ms") or 0.0
        if x and y and x > 0 and y > 0:
            points.append((cls, float(x), float(y), float(ms)))
        elif ms:
            why = "no FLOPs" if row.get("flops") == 0 else "FLOPs unknown"
            left.append(f"{cls} {ms_h(ms)} ({why})")
    return points, left


def _roofs(section: dict) -> tuple[float | None, list[tuple[str, float]]]:
    gpu = section.get("gpu") or {}
    bw = (gpu.get("memory_bandwidth") or {}).get("bytes_per_s")
    peaks = gpu.get("peak_flops") or {}
    # The roofs of the precisions the ops ran in (by their GPU time), else every one listed.
    used = {row.get("roof_precision") for row in (section.get("classes") or {}).values()}
    shown = [p for p in ROOF_ORDER if p in peaks and p in used] or [
        p for p in ROOF_ORDER if p in peaks]
    roofs = sorted(((p, float(peaks[p]["flops"])) for p in shown), key=lambda pf: -pf[1])
    # fp16 beside an equal bf16 says nothing more.
    if any(p == "bf16" for p, _ in roofs):
        bf = dict(roofs)["bf16"]
        roofs = [(p, f) for p, f in roofs if not (p == "fp16" and f == bf)]
    if any(p == "fp32" for p, _ in roofs):
        f32 = dict(roofs)["fp32"]
        roofs = [(p, f) for p, f in roofs if not (p == "fp64" and f == f32)]
    return (float(bw) if bw else None), roofs


def _bounds(points, bw, roofs) -> tuple[float, float, float, float]:
    xs = [p[1] for p in points] + [0.05, 2000.0]
    ys = [p[2] for p in points] + [f for _, f in roofs]
    if bw:
        ys += [bw * 0.05]
        xs += [f / bw for _, f in roofs]
    # Intensities under 0.01 (copies with a stray FLOP) sit on the left edge.
    x0 = max(0.01, 10 ** math.floor(math.log10(min(xs))))
    x1 = 10 ** math.ceil(math.log10(max(xs) * 1.01))
    y0 = max(1e8, 10 ** math.floor(math.log10(min(ys))))
    y1 = 10 ** math.ceil(math.log10(max(ys) * 1.01))
    return x0, x1, y0, y1


def roofline_svg(section: dict, title: str = "") -> str:
    """An SVG document of the roofline section."""
    W, H, L, R, T, B = 880, 480, 70, 250, 40, 50
    points, left = _points(section)
    bw, roofs = _roofs(section)
    x0, x1, y0, y1 = _bounds(points, bw, roofs)

    def px(x: float) -> float:
        x = min(max(x, x0), x1)
        return L + (math.log10(x) - math.log10(x0)) / (math.log10(x1) - math.log10(x0)) * (
            W - L - R)

    def py(y: float) -> float:
        y = min(max(y, y0), y1)
        return H - B - (math.log10(y) - math.log10(y0)) / (math.log10(y1) - math.log10(y0)) * (
            H - T - B)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="11">',
           f'<rect width="{W}" height="{H}" fill="white"/>']
    gpu = (section.get("gpu") or {}).get("name") or "GPU not named in the trace"
    out.append(f'<text x="{L}" y="22" font-size="14" font-weight="bold">'
               f'{escape(title or "Roofline")}: {escape(gpu)}</text>')
    # Grid and axes, a line per decade.
    d = int(math.log10(x0))
    while 10 ** d <= x1 * 1.001:
        x = px(10 ** d)
        out.append(f'<line x1="{x:.1f}" y1="{T}" x2="{x:.1f}" y2="{H - B}" stroke="#eee"/>')
        out.append(f'<text x="{x:.1f}" y="{H - B + 14}" text-anchor="middle">{10.0 ** d:g}'
                   '</text>')
        d += 1
    d = int(math.log10(y0))
    while 10 ** d <= y1 * 1.001:
        y = py(10 ** d)
        out.append(f'<line x1="{L}" y1="{y:.1f}" x2="{W - R}" y2="{y:.1f}" stroke="#eee"/>')
        out.append(f'<text x="{L - 4}" y="{y + 4:.1f}" text-anchor="end">{_si(10 ** d)}</text>')
        d += 1
    out.append(f'<rect x="{L}" y="{T}" width="{W - L - R}" height="{H - T - B}" fill="none" '
               'stroke="#333"/>')
    out.append(f'<text x="{(L + W - R) / 2}" y="{H - 12}" text-anchor="middle">arithmetic '
               'intensity (FLOP/byte)</text>')
    out.append(f'<text transform="translate(16 {(T + H - B) / 2}) rotate(-90)" '
               'text-anchor="middle">FLOP/s</text>')
    # The roofs: bandwidth x intensity up to each peak, then the peak.
    for i, (prec, peak) in enumerate(roofs):
        colour = "#000" if i == 0 else "#666"
        dash = "" if i == 0 else ' stroke-dasharray="6 3"'
        if bw:
            ridge = peak / bw
            xa = max(x0, y0 / bw)
            out.append(f'<polyline class="roof" fill="none" stroke="{colour}" stroke-width="2"'
                       f'{dash} points="{px(xa):.1f},{py(bw * xa):.1f} {px(ridge):.1f},'
                       f'{py(peak):.1f} {px(x1):.1f},{py(peak):.1f}"/>')
        else:
            out.append(f'<line class="roof" x1="{px(x0):.1f}" y1="{py(peak):.1f}" '
                       f'x2="{px(x1):.1f}" y2="{py(peak):.1f}" stroke="{colour}"{dash}/>')
        out.append(f'<text x="{px(x1) - 4:.1f}" y="{py(peak) - 4:.1f}" text-anchor="end">'
                   f'{prec} peak {_si(peak)}FLOP/s</text>')
    if bw:
        xa = max(x0, y0 / bw) * 1.6
        out.append(f'<text x="{px(xa):.1f}" y="{py(bw * xa) - 6:.1f}" '
                   f'transform="rotate(-{_slope_deg(px, py, bw, x0, x1):.1f} {px(xa):.1f} '
                   f'{py(bw * xa) - 6:.1f})">memory {bw / 1e12:.2f} TB/s</text>')
    total = sum(p[3] for p in points) or 1.0
    for cls, x, y, ms in sorted(points, key=lambda p: -p[3]):
        r = 4 + 22 * math.sqrt(ms / total)
        colour = CLASS_COLOURS.get(cls, "#444")
        out.append(f'<circle class="op-class" data-class="{escape(cls)}" cx="{px(x):.1f}" '
                   f'cy="{py(y):.1f}" r="{r:.1f}" fill="{colour}" fill-opacity="0.55" '
                   f'stroke="{colour}"><title>{escape(cls)}: {ms_h(ms)}, {x:.3g} FLOP/byte, '
                   f'{_si(y)}FLOP/s</title></circle>')
        out.append(f'<text x="{px(x) + r + 2:.1f}" y="{py(y) + 4:.1f}">{escape(cls)}</text>')
    # Legend: every class, its time and roof fraction.
    ly = T + 4
    for cls, row in (section.get("classes") or {}).items():
        frac = row.get("roof_fraction")
        colour = CLASS_COLOURS.get(cls, "#444")
        out.append(f'<rect x="{W - R + 10}" y="{ly}" width="10" height="10" fill="{colour}"/>')
        frac_txt = f", {100 * frac:.0f}% of roof" if frac is not None else ""
        out.append(f'<text x="{W - R + 24}" y="{ly + 9}">{escape(cls)} '
                   f'{escape(ms_h(row.get("gpu_ms") or 0.0))}{frac_txt}</text>')
        ly += 16
    if left:
        out.append(f'<text x="{W - R + 10}" y="{ly + 12}" fill="#666">not drawn:</text>')
        for i, text in enumerate(left):
            out.append(f'<text x="{W - R + 10}" y="{ly + 26 + 13 * i}" fill="#666">'
                       f'{escape(text)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _slope_deg(px, py, bw: float, x0: float, x1: float) -> float:
    a, b = x0 * 2, x0 * 20
    return math.degrees(math.atan2(py(bw * a) - py(bw * b), px(b) - px(a)))


def _si(v: float) -> str:
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if v >= scale:
            return f"{v / scale:g} {unit}"
    return f"{v:g} "


def roofline_text(section: dict, width: int = 100, height: int = 8) -> list[str]:
    """A compact roofline chart (log-log, letters for the op classes) and a line per class."""
    points, left = _points(section)
    bw, roofs = _roofs(section)
    classes = section.get("classes") or {}
    if not classes:
        return []
    lines = []
    cols = max(30, min(72, width - 12))
    if points and (bw or roofs):
        x0, x1, y0, y1 = _bounds(points, bw, roofs)
        lx0, lx1, ly0, ly1 = (math.log10(v) for v in (x0, x1, y0, y1))
        grid = [[" "] * cols for _ in range(height)]

        def cell(x: float, y: float) -> tuple[int, int]:
            c = round((math.log10(x) - lx0) / (lx1 - lx0) * (cols - 1))
            r = round((ly1 - math.log10(y)) / (ly1 - ly0) * (height - 1))
            return min(max(r, 0), height - 1), min(max(c, 0), cols - 1)

        for i, (_, peak) in enumerate(roofs[:2]):  # the top roof and the next one, dotted
            for c in range(cols):
                x = 10 ** (lx0 + c / (cols - 1) * (lx1 - lx0))
                flat = not bw or bw * x >= peak
                roof_y = peak if flat or not bw else bw * x
                if y0 <= roof_y <= y1:
                    r, cc = cell(x, roof_y)
                    if grid[r][cc] == " ":
                        grid[r][cc] = ("-" if i == 0 else ".") if flat else "/"
        for cls, x, y, _ in sorted(points, key=lambda p: p[3]):
            r, c = cell(x, y)
            grid[r][c] = CLASS_MARKS.get(cls, "?")
        label = f"{_si(y1)}FLOP/s"
        for i, row in enumerate(grid):
            prefix = label if i == 0 else (f"{_si(y0)}" if i == height - 1 else "")
            lines.append(f"{prefix:>9} |" + "".join(row).rstrip())
        lines.append(" " * 10 + "+" + "-" * cols)
        lines.append(" " * 10 + f"{x0:g}".ljust(cols - 16) + f"{x1:g} FLOP/byte")
        roof_txt = ", ".join(f"{p} {_si(f)}FLOP/s" for p, f in roofs[:2])
        mem_txt = f"memory {bw / 1e12:.2f} TB/s" if bw else ""
        lines += textwrap.wrap("roofs: " + ", ".join(t for t in (mem_txt, roof_txt) if t),
                               width, initial_indent=" " * 10, subsequent_indent=" " * 12)
    for cls, row in classes.items():
        frac = row.get("roof_fraction")
        inten = row.get("intensity")
        inten_txt = "" if inten is None else f"{inten:.3g} FLOP/B"
        frac_txt = "" if frac is None else f"{100 * frac:.0f}% of roof"
        lines.append(
            f"  {CLASS_MARKS.get(cls, '?')} {cls:<11} {ms_h(row.get('gpu_ms') or 0.0):>8} "
            f"{inten_txt:>13} {row.get('bound') or '?':<7} {frac_txt}".rstrip())
    if left:
        lines += textwrap.wrap("not drawn: " + "; ".join(left), width, initial_indent="  ",
                               subsequent_indent="    ")
    return lines
