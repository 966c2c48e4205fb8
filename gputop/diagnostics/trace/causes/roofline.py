"""Findings from a trace's roofline: memory-bound ops far from the bandwidth roof, matrix work
far under the compute roof.

What each op could save is its kernels' time x (1 - the fraction of its roof it reached / the
fraction of that roof real kernels attain): streaming kernels reach about 85 % of the peak
memory bandwidth (STREAM and BabelStream on V100, A100, H100 and MI250X: 80-92 %), large
aligned GEMMs about 80 % of the dense tensor peak on NVIDIA (cuBLAS on H100/H200: 750-800 of
989 TFLOP/s) and about half on AMD's CDNA 3 (hipBLASLt on MI300X: ~650 of 1307 TFLOP/s; its
peak assumes a clock that matrix work does not hold). The work is *far* from its roof when it
runs at under half of what is attained (a 2x to gain on that time): only then is a finding a
warning, and only where the GPU is busy (its busy share at the healthy floor or over); while
the GPU idles for a named cause, that cause is the step's problem and the roofline's finding
stays informational.
"""

from __future__ import annotations

from gputop.core.format import ms_h
from gputop.diagnostics.findings import Finding, severity_for
from gputop.diagnostics.trace.causes.common import (
    HEALTHY_BUSY_FLOOR_PCT,
    INFO_SHARE,
    busy_pct,
    is_amd,
    kernel_profile,
    of_what,
    percent,
    share_of,
)
from gputop.diagnostics.trace.measuring.metrics import TraceMetrics
from gputop.diagnostics.trace.measuring.roofline import OpEntry, Roofline, judge, precision_of
from gputop.diagnostics.trace.measuring.roofline_ops import MATRIX_CLASSES, gemm_dims

MEMORY_ATTAINABLE = 0.85
COMPUTE_ATTAINABLE = {"nvidia": 0.80, "amd": 0.50}
FAR = 0.5  # of the attained fraction
MEMORY_CLASSES = ("elementwise", "norm", "softmax", "reduction", "embedding", "optimizer")
# Tensor cores read 16-byte aligned rows: dimensions a multiple of 8 (fp16/bf16), 4 (tf32),
# 16 (fp8); cuBLAS's tiles are 64-256 wide, so a dimension under 64 leaves most of a tile idle.
ALIGN_BYTES = 16
SMALL_DIM = 64


def _saving_us(row: dict, attainable: float) -> float:
    fraction = row.get("roof_fraction")
    if fraction is None:
        return 0.0
    return row["gpu_ms"] * 1e3 * max(0.0, 1.0 - fraction / attainable)


def _scale(m: TraceMetrics, roof: Roofline) -> float:
    """Kernel time of the whole trace -> the judged steps' (the trace may hold more)."""
    compute_ms = m.roles_ms.get("compute", 0.0)
    if roof.kernel_us <= 0 or compute_ms <= 0:
        return 0.0
    return min(1.0, compute_ms * 1e3 / roof.kernel_us)


def _severity(m: TraceMetrics, share: float, fraction: float, attainable: float) -> str:
    if busy_pct(m) < HEALTHY_BUSY_FLOOR_PCT or fraction >= FAR * attainable:
        return "info"
    return severity_for(share)


def _attainable(m: TraceMetrics) -> float:
    return COMPUTE_ATTAINABLE["amd" if is_amd(m) else "nvidia"]


def _op_text(e: OpEntry, row: dict) -> str:
    shapes = row["shapes"] if isinstance(row["shapes"], list) else []
    first = next((d for d in shapes if isinstance(d, list) and d
                  and all(isinstance(x, int) for x in d)), None)
    shape_txt = "x".join(str(d) for d in first) if first else "shapes not recorded"
    dims = gemm_dims(e.name, shapes) if e.cls == "gemm" else None
    if dims is not None:
        shape_txt = "M={} N={} K={}".format(*dims[1:]) + (f" batch {dims[0]}" if dims[0] > 1
                                                           else "")
    frac = row["roof_fraction"]
    return (f"{e.name} ({shape_txt}, {row['dtype'] or '?'}) {ms_h(row['gpu_ms'])} at "
            f"{percent(frac) if frac is not None else '?'} of its roof")


def memory_bound_ops(m: TraceMetrics, roof: Roofline) -> list[Finding]:
    bw = roof.roofs.bandwidth
    if bw is None or not m.gpu_present:
        return []
    rows = [(e, judge(e, roof.roofs)) for e in roof.entries if e.cls in MEMORY_CLASSES]
    rows = [(e, r) for e, r in rows if r["bound"] == "memory" and r["roof_fraction"] is not None]
    saving = sum(_saving_us(r, MEMORY_ATTAINABLE) for _, r in rows) * _scale(m, roof) / 1e3
    share = share_of(m, saving)
    if share < INFO_SHARE or not rows:
        return []
    gpu_ms = sum(r["gpu_ms"] for _, r in rows)
    nbytes = sum(r["achieved_bytes_per_s"] * r["gpu_ms"] / 1e3 for _, r in rows)
    fraction = nbytes / (gpu_ms / 1e3) / bw.bytes_per_s if gpu_ms > 0 else 0.0
    intensities = [r["intensity"] for _, r in rows if r["intensity"] is not None]
    classes = sorted({e.cls for e, _ in rows}, key=MEMORY_CLASSES.index)
    top = sorted(rows, key=lambda er: -_saving_us(er[1], MEMORY_ATTAINABLE))[:3]
    kernel_share = gpu_ms * 1e3 / roof.kernel_us if roof.kernel_us else 0.0
    span = (f" at {min(intensities):.2g}-{max(intensities):.2g} FLOP/byte" if intensities
            else "")
    fixes = ["fuse chains of them: torch.compile(model) makes one kernel of each chain of "
             "element-wise and normalization ops"]
    if "optimizer" in classes:
        fixes.append("torch.optim.AdamW(..., fused=True) (or foreach=True)")
    if "norm" in classes:
        fixes.append("fused layer/RMS norm kernels (torch.compile, apex.normalization)")
    if "softmax" in classes:
        fixes.append("F.scaled_dot_product_attention (FlashAttention) instead of "
                     "softmax(Q @ K^T) @ V")
    fixes.append("keep activations in bf16 (torch.autocast) to halve the bytes they move")
    return [Finding(
        id="memory-bound-ops",
        severity=_severity(m, share, fraction, MEMORY_ATTAINABLE),
        title=(f"{percent(kernel_share)} of GPU time in memory-bound ops at "
               f"{percent(fraction)} of the bandwidth roof"),
        evidence=(
            f"{ms_h(gpu_ms)} of kernels in {', '.join(classes)} ops{span} (under the machine "
            f"balance: their roof is the {bw.bytes_per_s / 1e12:.2f} TB/s memory bandwidth, "
            f"{bw.source}); they moved {percent(fraction)} of it; reaching "
            f"{percent(MEMORY_ATTAINABLE)} would save about {ms_h(saving)} "
            f"({percent(share)} of the {of_what(m)}). Most to gain: "
            + "; ".join(_op_text(e, r) for e, r in top) + "."),
        fix="; ".join(fixes) + ".",
        next_step=kernel_profile(m, top[0][0].top_kernel),
        cost_s=saving / 1e3,
    )]


def _gemm_reasons(e: OpEntry, row: dict, roof: Roofline) -> list[str]:
    reasons = []
    precision = precision_of(e)
    if precision == "fp32" and "tf32" in roof.roofs.peaks and e.cls != "attention":
        reasons.append("fp32 without TF32 or bf16 (no tensor cores)")
    dims = gemm_dims(e.name, row["shapes"]) if e.cls == "gemm" else None
    if dims is not None:
        el = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}.get(row["dtype"] or "", 2)
        align = max(1, ALIGN_BYTES // el)
        for label, v in zip("MNK", dims[1:]):
            if v % align:
                reasons.append(f"{label}={v} is not a multiple of {align}")
                break
        small = [f"{label}={v}" for label, v in zip("MNK", dims[1:]) if v < SMALL_DIM]
        if small:
            reasons.append(f"small: {', '.join(small)} (under one {SMALL_DIM}-wide tile)")
    if row["bound"] == "memory":
        balance = roof.roofs.balance(precision)
        bal = f" under the machine balance {balance:.0f}" if balance else ""
        reasons.append(f"memory-bound at {row['intensity']:.0f} FLOP/byte{bal}: a dimension "
                       "too small to reuse what it reads (a larger batch, batched or fused "
                       "GEMMs)")
    return reasons


def gemm_under_roof(m: TraceMetrics, roof: Roofline) -> list[Finding]:
    if roof.roofs.bandwidth is None or not roof.roofs.peaks or not m.gpu_present:
        return []
    rows = [(e, judge(e, roof.roofs)) for e in roof.entries if e.cls in MATRIX_CLASSES]
    rows = [(e, r) for e, r in rows if r["roof_fraction"] is not None]
    attainable = _attainable(m)
    saving = sum(_saving_us(r, attainable) for _, r in rows) * _scale(m, roof) / 1e3
    share = share_of(m, saving)
    if share < INFO_SHARE or not rows:
        return []
    gpu_ms = sum(r["gpu_ms"] for _, r in rows)
    fraction = sum(r["gpu_ms"] * r["roof_fraction"] for _, r in rows) / gpu_ms
    top = sorted(rows, key=lambda er: -_saving_us(er[1], attainable))[:3]
    times: dict[str, float] = {}
    for e, r in rows:
        times[precision_of(e)] = times.get(precision_of(e), 0.0) + r["gpu_ms"]
    main_precision = max(times, key=times.__getitem__)
    kernel_share = gpu_ms * 1e3 / roof.kernel_us if roof.kernel_us else 0.0
    details = []
    for e, r in top:
        why = _gemm_reasons(e, r, roof)
        details.append(_op_text(e, r) + (f" ({'; '.join(why)})" if why else ""))
    kinds = sorted({e.cls for e, _ in rows}, key=("gemm", "conv", "attention").index)
    peak = roof.roofs.peaks.get(main_precision)
    peak_txt = (f"the {main_precision} peak {peak.flops / 1e12:.0f} TFLOP/s" if peak else
                f"no {main_precision} peak known")
    return [Finding(
        id="gemm-under-roof",
        severity=_severity(m, share, fraction, attainable),
        title=(f"{percent(kernel_share)} of GPU time in matrix work at {percent(fraction)} of "
               f"its roof ({main_precision})"),
        evidence=(
            f"{ms_h(gpu_ms)} of {'/'.join(kinds)} kernels on {roof.roofs.device} reach "
            f"{percent(fraction)} of the roof at their intensity ({peak_txt}, or the memory "
            f"bandwidth for the memory-bound); reaching {percent(attainable)} would "
            f"save about {ms_h(saving)} ({percent(share)} of the {of_what(m)}). Most to "
            "gain: " + "; ".join(details) + "."),
        fix=("Feed the tensor cores: bf16/fp16 (torch.autocast) or at least TF32 "
             "(torch.set_float32_matmul_precision('high')); dimensions multiples of 8 (64 for "
             "full tiles: pad vocabularies and hidden sizes); a larger batch (more rows per "
             "weight read); torch.compile(mode='max-autotune') to pick better GEMM kernels."),
        next_step=kernel_profile(m, top[0][0].top_kernel),
        cost_s=saving / 1e3,
    )]


def roofline_findings(m: TraceMetrics, roof: Roofline | None) -> list[Finding]:
    if roof is None or not roof.entries:
        return []
    return [*memory_bound_ops(m, roof), *gemm_under_roof(m, roof)]

