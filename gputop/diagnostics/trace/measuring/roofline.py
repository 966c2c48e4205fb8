"""The roofline of a trace: per operator (name and input shapes) and per class, how much it
computes and moves per byte, how fast its kernels ran, and how close that is to the GPU's roof.

An operator's kernels are found through the trace's own links: each kernel carries the
``correlation`` of the runtime call that launched it, and that call runs inside the operator
on the host thread (the innermost ``cpu_op`` around it: ``aten::mm`` rather than the
``aten::linear`` that called it). Its FLOPs and least bytes come from the recorded shapes
(``roofline_ops``), or from the profiler's own count (``with_flops=True``) where no formula
applies. The roofs are the GPU's: peak FLOP/s for the precision (``gputop.core.peaks``; tensor-core
peaks for matrix work whose kernels run on tensor cores, the plain FP32 rate otherwise) and peak
memory bandwidth (``gputop.core.bandwidth``), each with its source. An op is memory-bound when its
intensity (FLOP per byte) is under the machine balance (peak / bandwidth), and its roof is then
intensity x bandwidth; else the compute peak.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import msgspec

from gputop.core.bandwidth import BOARDS as MEMORY_BOARDS
from gputop.core.bandwidth import Bandwidth, datasheet_bandwidth
from gputop.core.peaks import BOARDS as PEAK_BOARDS
from gputop.core.peaks import Peak, peak_for
from gputop.diagnostics.trace.loading.load import Device, Event, TraceData
from gputop.diagnostics.trace.measuring.kernels import kernel_class
from gputop.diagnostics.trace.measuring.roofline_ops import (
    CLASSES,
    DTYPE_NAME,
    DTYPE_PRECISION,
    MATRIX_CLASSES,
    dtype_of,
    op_class,
    op_cost,
    parse_inputs,
    tensor_dims,
)

MAX_OPS = 1000  # entries in the JSON, by GPU time; the class totals count every op
MAX_SHAPE_ITEMS = 16  # tensors of a tensor list shown (an optimizer's list holds hundreds)
_OP_CATEGORIES = frozenset({"cpu_op", "operator"})


@dataclass
class Roofs:
    device: str | None
    index: int | None
    bandwidth: Bandwidth | None
    peaks: dict[str, Peak] = field(default_factory=dict)

    def balance(self, precision: str) -> float | None:
        peak = self.peaks.get(precision)
        if peak is None or self.bandwidth is None:
            return None
        return peak.flops / self.bandwidth.bytes_per_s

    def to_json(self) -> dict:
        return {
            "name": self.device,
            "index": self.index,
            "memory_bandwidth": None if self.bandwidth is None else {
                "bytes_per_s": self.bandwidth.bytes_per_s, "source": self.bandwidth.source},
            "peak_flops": {p: {"flops": k.flops, "precision": k.precision, "source": k.source}
                           for p, k in self.peaks.items()},
            "machine_balance": {p: round(b, 2) for p in self.peaks
                                if (b := self.balance(p)) is not None},
        }


def roofs_for(device: Device | None) -> Roofs:
    name = device.name if device else None
    roofs = Roofs(name, device.index if device else None,
                  datasheet_bandwidth(name, device.total_memory if device else None))
    for precision in ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8"):
        peak = peak_for(name, precision)
        if peak is not None and peak.precision == precision:
            roofs.peaks[precision] = peak
    return roofs


def _balance_range(precision: str) -> tuple[float, float] | None:
    """The least and greatest machine balance of every listed GPU for ``precision``: an
    intensity under the least is memory-bound on any of them, over the greatest compute-bound."""
    values = []
    for board in PEAK_BOARDS:
        bw = datasheet_bandwidth(board.name)
        tflops = board.tflops.get(precision)
        if bw is not None and tflops:
            values.append(tflops * 1e12 / bw.bytes_per_s)
    return (min(values), max(values)) if values and MEMORY_BOARDS else None


@dataclass
class OpEntry:
    name: str
    cls: str
    shapes: object
    dtype: str | None
    flops: float | None
    bytes: float | None
    why: str | None
    flops_source: str | None
    calls: int = 0
    gpu_us: float = 0.0
    tensor_us: float = 0.0  # of its kernels, on tensor cores (by their names)
    simt_us: float = 0.0
    kernel_us: dict[str, float] = field(default_factory=dict)  # per kernel name

    @property
    def top_kernel(self) -> str | None:
        return max(self.kernel_us, key=self.kernel_us.__getitem__) if self.kernel_us else None


def _corr(value: object) -> int | str | None:
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return value if isinstance(value, str) and value else None


def _kernels_by_correlation(data: TraceData) -> tuple[dict, dict[int, float]]:
    by_corr: dict = defaultdict(list)
    per_device: dict[int, float] = defaultdict(float)
    for k in data.kernels:
        if k.dur <= 0 or k.args is None:
            continue
        dev = k.args.device
        dev_i = dev if isinstance(dev, int) else int(dev) if isinstance(dev, str) and \
            dev.isdigit() else -1
        per_device[dev_i] += k.dur
        c = _corr(k.args.correlation)
        if c is not None and not kernel_class(k.name)[0]:  # communication is no roofline's
            by_corr[c].append(k)
    return by_corr, per_device


def _innermost_ops(data: TraceData, by_corr: dict) -> list[tuple[Event, list[Event]]]:
    """(operator, its kernels) for every launch whose kernels ran: the launch is filed under
    the innermost operator around it on its host thread."""
    threads: dict = defaultdict(list)
    for op in data.cpu_ops:
        if op.cat.lower() in _OP_CATEGORIES:
            threads[(op.pid, op.tid)].append((op.ts, 0, -op.dur, op))
    for rt in data.runtime:
        c = _corr(rt.args.correlation) if rt.args else None
        if c is not None and c in by_corr:
            threads[(rt.pid, rt.tid)].append((rt.ts, 1, 0.0, rt))
    out: dict[int, tuple[Event, list[Event]]] = {}
    for items in threads.values():
        items.sort(key=lambda x: (x[0], x[1], x[2]))
        stack: list[Event] = []
        for ts, kind, _, ev in items:
            while stack and stack[-1].ts + stack[-1].dur < ts:
                stack.pop()
            if kind == 0:
                stack.append(ev)
            elif stack:
                op = stack[-1]
                c = _corr(ev.args.correlation) if ev.args else None
                entry = out.setdefault(id(op), (op, []))
                entry[1].extend(by_corr.get(c, ()))
    return list(out.values())


def _shown_shapes(dims: object) -> object:
    if not isinstance(dims, list):
        return None
    shown = []
    for d in dims[:64]:
        if isinstance(d, list) and len(d) > MAX_SHAPE_ITEMS and all(isinstance(x, list)
                                                                   for x in d):
            shown.append([*d[:MAX_SHAPE_ITEMS], f"... {len(d) - MAX_SHAPE_ITEMS} more"])
        else:
            shown.append(d)
    return shown


def _conv_outputs(data: TraceData) -> dict:
    """(input dims, weight dims) -> output dims, read off the convolutions' backward passes
    (their grad_output is the forward's output)."""
    out: dict = {}
    for op in data.cpu_ops:
        name = op.name.rsplit("::", 1)[-1]
        if op.args is None or name not in ("convolution_backward", "cudnn_convolution_backward",
                                           "miopen_convolution_backward"):
            continue
        dims = op.args.input_dims
        if not isinstance(dims, list) or len(dims) < 3:
            continue
        g_i, x_i = (0, 1) if name == "convolution_backward" else (1, 0)
        g, x, w = tensor_dims(dims[g_i]), tensor_dims(dims[x_i]), tensor_dims(dims[2])
        if g and x and w:
            out[(x, w)] = g
    return out


@dataclass
class Roofline:
    roofs: Roofs
    entries: list[OpEntry]
    kernel_us: float  # all non-communication kernel time
    attributed_us: float  # of it, in operators
    shapes_recorded: bool

    def to_json(self) -> dict:
        ranked = sorted(self.entries, key=lambda e: -e.gpu_us)
        return {
            "gpu": self.roofs.to_json(),
            "shapes_recorded": self.shapes_recorded,
            "kernel_ms": round(self.kernel_us / 1e3, 4),
            "attributed_ms": round(self.attributed_us / 1e3, 4),
            "ops": [judge(e, self.roofs) for e in ranked[:MAX_OPS]],
            "ops_omitted": max(0, len(ranked) - MAX_OPS),
            "classes": class_totals(self.entries, self.roofs),
        }


def build_roofline(data: TraceData) -> Roofline:
    by_corr, per_device = _kernels_by_correlation(data)
    device = None
    if data.devices:
        primary = max(per_device, key=per_device.__getitem__) if per_device else None
        device = next((d for d in data.devices if d.index == primary), data.devices[0])
    roofs = roofs_for(device)
    conv_outputs = _conv_outputs(data)
    entries: dict[tuple[str, bytes], OpEntry] = {}
    encode = msgspec.json.encode
    attributed = 0.0
    recorded = False
    for op, kernels in _innermost_ops(data, by_corr):
        args = op.args
        dims = args.input_dims if args else None
        recorded = recorded or isinstance(dims, list)
        key = (op.name, encode(dims))
        entry = entries.get(key)
        if entry is None:
            types = args.input_type if args else None
            cost = op_cost(op.name, dims, types, args.concrete if args else None, conv_outputs)
            flops, source = cost.flops, "shapes" if cost.flops is not None else None
            prof = args.flops if args else None
            if flops is None and isinstance(prof, int | float) and prof > 0:
                flops, source = float(prof), "profiler"
            inputs = parse_inputs(dims, types)
            dtype = dtype_of(inputs)
            entry = entries[key] = OpEntry(
                op.name, op_class(op.name), _shown_shapes(dims), dtype, flops, cost.bytes,
                cost.why, source)
        entry.calls += 1
        for k in kernels:
            entry.gpu_us += k.dur
            attributed += k.dur
            if k.name in entry.kernel_us or len(entry.kernel_us) < 8:
                entry.kernel_us[k.name] = entry.kernel_us.get(k.name, 0.0) + k.dur
            _, matrix, prec = kernel_class(k.name)
            if prec == "tensor":
                entry.tensor_us += k.dur
            elif prec == "simt":
                entry.simt_us += k.dur
    kernel_us = sum(k.dur for ks in by_corr.values() for k in ks)
    return Roofline(roofs, list(entries.values()), kernel_us, attributed, recorded)


def precision_of(entry: OpEntry) -> str:
    """The roof's precision: matrix work in its dtype (fp32 on tensor cores is TF32); other
    ops run on the plain FP32 (or FP64) units whatever their dtype."""
    prec = DTYPE_PRECISION.get(entry.dtype or "", "fp32")
    if entry.cls not in MATRIX_CLASSES:
        return "fp64" if prec == "fp64" else "fp32"
    if prec == "fp32" and entry.tensor_us > entry.simt_us:
        return "tf32"
    return prec


def _bound(intensity: float | None, cls: str, precision: str, roofs: Roofs
           ) -> tuple[str | None, str]:
    if intensity is None:
        if cls in ("elementwise", "norm", "softmax", "embedding", "optimizer", "reduction"):
            return "memory", ("class: a few FLOPs or none per element moved, far under any "
                              "GPU's machine balance")
        return None, "intensity unknown"
    balance = roofs.balance(precision)
    if balance is not None:
        return ("memory" if intensity < balance else "compute"), (
            f"intensity {intensity:.3g} vs machine balance {balance:.3g} FLOP/byte "
            f"({precision})")
    span = _balance_range(precision)
    if span is not None and intensity < span[0]:
        return "memory", (f"intensity {intensity:.3g} under every listed GPU's {precision} "
                          f"machine balance ({span[0]:.3g}-{span[1]:.3g})")
    if span is not None and intensity > span[1]:
        return "compute", (f"intensity {intensity:.3g} over every listed GPU's {precision} "
                           f"machine balance ({span[0]:.3g}-{span[1]:.3g})")
    return None, "the GPU's roofs are not known"


def _judge_totals(cls: str, flops: float | None, nbytes: float | None, gpu_us: float,
                  precision: str, roofs: Roofs) -> dict:
    intensity = flops / nbytes if flops is not None and nbytes else None
    secs = gpu_us / 1e6
    achieved = flops / secs if flops is not None and secs > 0 else None
    achieved_b = nbytes / secs if nbytes is not None and secs > 0 else None
    bound, basis = _bound(intensity, cls, precision, roofs)
    fraction = None
    peak = roofs.peaks.get(precision)
    if bound == "memory" and achieved_b is not None and roofs.bandwidth is not None:
        fraction = achieved_b / roofs.bandwidth.bytes_per_s
    elif bound == "compute" and achieved is not None and peak is not None:
        fraction = achieved / peak.flops
    return {
        "intensity": None if intensity is None else float(f"{intensity:.4g}"),
        "gpu_ms": round(gpu_us / 1e3, 4),
        "achieved_flops": achieved,
        "achieved_bytes_per_s": achieved_b,
        "roof_precision": precision,
        "bound": bound,
        "bound_basis": basis,
        "roof_fraction": None if fraction is None else round(fraction, 4),
    }


def judge(entry: OpEntry, roofs: Roofs) -> dict:
    precision = precision_of(entry)
    out: dict = {
        "name": entry.name, "class": entry.cls, "shapes": entry.shapes,
        "dtype": DTYPE_NAME.get(entry.dtype or "", entry.dtype), "calls": entry.calls,
        "flops": entry.flops, "bytes": entry.bytes, "flops_source": entry.flops_source,
    }
    total_f = entry.flops * entry.calls if entry.flops is not None else None
    total_b = entry.bytes * entry.calls if entry.bytes is not None else None
    out.update(_judge_totals(entry.cls, total_f, total_b, entry.gpu_us, precision, roofs))
    if entry.why:
        out["why"] = entry.why
    return out


def class_totals(entries: list[OpEntry], roofs: Roofs) -> dict:
    out = {}
    for cls in CLASSES:
        mine = [e for e in entries if e.cls == cls]
        if not mine:
            continue
        modelled = [e for e in mine if e.flops is not None and e.bytes is not None]
        flops = sum((e.flops or 0.0) * e.calls for e in modelled) if modelled else None
        nbytes = sum((e.bytes or 0.0) * e.calls for e in modelled) if modelled else None
        times: dict[str, float] = defaultdict(float)
        for e in mine:
            times[precision_of(e)] += e.gpu_us
        precision = max(times, key=times.__getitem__)
        row: dict = {"calls": sum(e.calls for e in mine), "flops": flops, "bytes": nbytes}
        row.update(_judge_totals(cls, flops, nbytes, sum(e.gpu_us for e in modelled),
                                 precision, roofs))
        row["gpu_ms"] = round(sum(e.gpu_us for e in mine) / 1e3, 4)
        row["gpu_ms_modelled"] = round(sum(e.gpu_us for e in modelled) / 1e3, 4)
        out[cls] = row
    return out
