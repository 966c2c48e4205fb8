"""Trace rules: turn ``TraceMetrics`` into ``Finding`` objects.

Each rule measures the time its cause costs over the analysed steps (``cost_s``) and, unless
said otherwise, takes its severity from that cost's share of the step time (``severity_for``).
Thresholds come from how each condition works and from the published rules of the tools users
compare against (TensorBoard profiler plugin, Holistic Trace Analysis, Nsight Systems expert
rules); each one carries its reason next to it.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable

from gputop.diagnostics.findings import Finding, order_findings
from gputop.diagnostics.trace_intervals import RangeIndex, intersect, merge, subtract, total
from gputop.diagnostics.trace_metrics import TraceMetrics

# Share of the step time a finding costs -> severity.
# 5%: TensorBoard's profiler plugin recommends acting on the DataLoader from 5% of the step time;
# below that a cost is within step-to-step noise and not worth a warning.
WARNING_SHARE = 0.05
# 25%: a quarter of the step; fixing this alone makes the step at least 1.33x faster.
CRITICAL_SHARE = 0.25
# Below 1% of the step time a cause is not worth a line, even as information.
INFO_SHARE = 0.01
# TensorBoard's plugin flags communication from 10% of the step time (its own threshold).
COMMUNICATION_SHARE = 0.10
# Nsight Systems' gpu_time_util rule and TensorBoard's "low utilization" hint both use 50%.
LOW_GPU_BUSY_PCT = 50.0
# HTA's idle breakdown: host-wait is the share of idle caused by the CPU not enqueuing work.
HOST_WAIT_MAJORITY_PCT = 50.0
# TensorBoard's memory rule: peak above 90% of the device's memory.
MEMORY_PRESSURE_PCT = 90.0
# Mixed precision moves GEMM/convolution work to tensor cores; NVIDIA's AMP guidance reports
# 2-3x on such layers, so assume the conservative end: their time halves.
TENSOR_CORE_SAVING = 0.5
# A rank is "systematically" late when it is the slowest in at least 2 of 3 compared steps.
STRAGGLER_MAJORITY = 2 / 3

NSYS = "nsys profile -t cuda,nvtx,osrt"
TRAIN = "python train.py"


def severity_for(share: float) -> str:
    if share >= CRITICAL_SHARE:
        return "critical"
    if share >= WARNING_SHARE:
        return "warning"
    return "info"


def _ms(x_ms: float) -> str:
    if x_ms >= 10_000:
        return f"{x_ms / 1e3:.1f} s"
    if x_ms >= 100:
        return f"{x_ms:.0f} ms"
    if x_ms >= 1:
        return f"{x_ms:.1f} ms"
    return f"{x_ms * 1e3:.0f} us"


def _pct(share: float) -> str:
    return f"{100 * share:.1f}%"


def kernel_base_name(name: str) -> str:
    """The function name ncu's ``--kernel-name`` matches (its default --kernel-name-base is the
    function name without namespace, template arguments or parameters)."""
    text = name.strip()
    if text.startswith("void "):
        text = text[5:]
    cut = len(text)
    for ch in "<(":
        i = text.find(ch)
        if i != -1:
            cut = min(cut, i)
    text = text[:cut]
    return text.rsplit("::", 1)[-1].strip() or name[:60]


def short_kernel_name(name: str, limit: int = 60) -> str:
    """Readable kernel name: namespaces kept, template arguments and parameters elided."""
    text = name.strip()
    if text.startswith("void "):
        text = text[5:]
    text = re.sub(r"\(.*$", "", text)
    out, depth = [], 0
    for ch in text:
        if ch == "<":
            if depth == 0:
                out.append("<…>")
            depth += 1
        elif ch == ">" and depth:
            depth -= 1
        elif depth == 0:
            out.append(ch)
    text = "".join(out)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _amd(m: TraceMetrics) -> bool:
    return m.vendor == "amd"


def _rocprof(tag: str) -> str:
    return f"rocprofv3 --hip-trace --kernel-trace --stats -d rocprof_{tag} -- {TRAIN}"


def _ncu_top_kernel(m: TraceMetrics, kernel: str | None = None) -> str:
    if kernel is None:
        top = m.values.get("top_kernels") or []
        kernel = top[0]["name"] if top else None
    if not kernel:
        return f"{NSYS} -o trace {TRAIN} && nsys stats -r cuda_gpu_kern_sum trace.nsys-rep"
    if _amd(m):
        return _rocprof("kernels")
    return (
        f"ncu --kernel-name {kernel_base_name(kernel)} --launch-skip 10 --launch-count 1 "
        f"--set full -o top_kernel {TRAIN}"
    )


def _steps_phrase(m: TraceMetrics) -> str:
    n = len(m.steps)
    if m.step_source == "ProfilerStep":
        return f"over {n} step{'s' if n != 1 else ''}"
    if m.step_source == "Optimizer.step":
        return f"over {n} iterations"
    return "over the whole trace (no steps recorded)"


def _share(m: TraceMetrics, ms: float) -> float:
    total_ms = m.step_total_ms
    return ms / total_ms if total_ms > 0 else 0.0


# --- rules ---------------------------------------------------------------------------------------


def dataloader_stall(m: TraceMetrics) -> list[Finding]:
    dl = m.values["dataloader"]
    if not dl["calls"]:
        return []
    exposed = m.roles_ms["dataloader"]
    share = _share(m, exposed)
    if share < WARNING_SHARE:
        return []
    hidden = "not hidden by GPU work" if m.gpu_present else "CPU-only trace, no GPU to hide it"
    workers = (
        "num_workers=0 (_SingleProcessDataLoaderIter): batches are loaded in the training "
        "process, between steps"
        if dl["single_process"]
        else f"{dl['iterator'] or 'multi-process iterator'}: the workers do not keep up"
    )
    if dl["single_process"]:
        fix = (
            "Load batches in parallel: DataLoader(..., num_workers=4 to 8 per GPU (up to the "
            "free CPU cores), pin_memory=True, persistent_workers=True, prefetch_factor=2); "
            "keep __getitem__ cheap (decode once, cache, move augmentation to the GPU)."
        )
    else:
        fix = (
            "Give the input pipeline more throughput: raise num_workers and prefetch_factor, "
            "set persistent_workers=True and pin_memory=True, and make each sample cheaper "
            "(pre-decoded/cached data, GPU-side augmentation, faster storage)."
        )
    return [
        Finding(
            id="dataloader-stall",
            severity=severity_for(share),
            title=f"DataLoader holds {_pct(share)} of the step time",
            evidence=(
                f"{_ms(exposed)} {_steps_phrase(m)} waiting in enumerate(DataLoader).__next__ "
                f"({hidden}; {dl['calls']} calls, longest {_ms(dl['max_call_ms'])}); "
                f"{workers}."
            ),
            fix=fix,
            next_step=(
                f"{NSYS} --sample=cpu --python-sampling=true -o dataloader {TRAIN}  "
                "(CPU samples of the loader; osrt shows file reads and waits)"
            ),
            cost_s=exposed / 1e3,
        )
    ]


def host_sync(m: TraceMetrics) -> list[Finding]:
    if not m.gpu_present:
        return []
    s = m.values["sync"]
    gpu_cost = (
        total(intersect(m.ranges["sync_gpu_cost"], merge((st.start, st.end) for st in m.steps)))
        / 1e3
    )
    gpu_share = _share(m, gpu_cost)
    blocked_share = _share(m, s["host_blocked_ms"])
    if max(gpu_share, blocked_share) < WARNING_SHARE:
        return []
    # A blocked host costs GPU time only once the device runs dry; blocking alone makes the
    # pipeline fragile (the CPU cannot run ahead), so by itself it is a warning, not critical.
    severity = severity_for(max(gpu_share, min(blocked_share, CRITICAL_SHARE - 1e-9)))
    calls = ", ".join(f"{n} {name}" for name, n in s["calls"].items())
    item = ""
    if s["item_calls"]:
        item = f"{s['item_calls']} aten::item calls ({_ms(s['item_ms'])}); "
    return [
        Finding(
            id="host-sync",
            severity=severity,
            title=(
                f"The CPU blocks on the GPU {_pct(blocked_share)} of the step time"
                if blocked_share >= gpu_share
                else f"Host syncs leave the GPU idle {_pct(gpu_share)} of the step time"
            ),
            evidence=(
                f"host blocked {_ms(s['host_blocked_ms'])} {_steps_phrase(m)}: {item}"
                f"{calls or 'synchronising calls'}; the GPU then sat idle "
                f"{_ms(gpu_cost)} ({_pct(gpu_share)} of the step time) until new work arrived."
            ),
            fix=(
                "Keep values on the GPU: drop .item(), .cpu(), .tolist() and print(loss) from "
                "the step (accumulate metrics in tensors, read them every N steps); remove "
                "torch.cuda.synchronize() from the loop; avoid Python branches on tensor values. "
                "torch.cuda.set_sync_debug_mode('warn') points at each sync."
            ),
            next_step=(
                _rocprof("sync")
                if _amd(m)
                else f"{NSYS} --cudabacktrace=sync --python-backtrace=cuda -o sync {TRAIN} && "
                "nsys analyze -r cuda_api_sync sync.nsys-rep"
            ),
            cost_s=gpu_cost / 1e3,
        )
    ]


def launch_bound(m: TraceMetrics) -> list[Finding]:
    if not m.gpu_present:
        return []
    busy = m.values["gpu"]["busy_pct_of_steps"] or 0.0
    idle = m.values["idle_split"]
    k = m.values["kernels"]
    short = k["duration_us"]["p50"] <= k["launch_call_us_p50"] or k["under_10us_pct"] >= 50.0
    if idle["host_wait_pct"] < HOST_WAIT_MAJORITY_PCT or not short:
        return []
    # GPU idle while the host is launching or running operators, outside long gaps (their own
    # finding) — the time a faster host path would give back.
    host_r = merge(m.ranges["role_runtime"] + m.ranges["role_cpu"])
    cost = total(subtract(host_r, m.ranges["long_gaps"])) / 1e3
    share = _share(m, cost)
    if share < WARNING_SHARE:
        return []
    top_ops = m.values.get("top_ops") or []
    top_op = f"; top operator by self time: {top_ops[0]['name']}" if top_ops else ""
    # With the GPU busy half the time or more it is not underused by the published rules; the
    # launch overhead is then worth knowing but not a warning.
    severity = severity_for(share) if busy < LOW_GPU_BUSY_PCT else "info"
    return [
        Finding(
            id="launch-bound",
            severity=severity,
            title=(
                f"GPU busy only {busy:.0f}% of the step: the CPU cannot launch work fast enough"
                if busy < LOW_GPU_BUSY_PCT
                else f"The GPU waits on kernel launches {_pct(share)} of the step time"
            ),
            evidence=(
                f"{_ms(cost)} ({_pct(share)} of the step time) the GPU waits while the host "
                f"launches kernels or runs operators; {idle['host_wait_pct']:.0f}% of GPU idle "
                f"is host-wait (HTA); median kernel {k['duration_us']['p50']:.1f} us vs median "
                f"launch call {k['launch_call_us_p50']:.1f} us, {k['under_10us_pct']:.0f}% of "
                f"kernels under 10 us; {k['launch_rate_per_s']:,.0f} launches/s{top_op}."
            ),
            fix=(
                "Fewer, bigger kernels: torch.compile(model) to fuse small ops (mode="
                "'reduce-overhead' adds CUDA graphs), CUDA graphs for static shapes "
                "(torch.cuda.make_graphed_callables), a larger batch, fused/foreach optimizers "
                "(fused=True), and no Python loops over small tensors."
            ),
            next_step=(
                _rocprof("launch")
                if _amd(m)
                else f"{NSYS} --cuda-graph-trace=node -o launch {TRAIN} && "
                "nsys stats -r cuda_api_sum,cuda_gpu_kern_sum launch.nsys-rep"
            ),
            cost_s=cost / 1e3,
        )
    ]


def communication(m: TraceMetrics) -> list[Finding]:
    c = m.values["communication"]
    if m.gpu_present:
        exposed = m.roles_ms["communication"]
        detail = (
            f"collective kernels {_ms(c['kernel_ms'])} ({c['share_pct']:.1f}% of the step "
            f"time), {c['overlap_pct']:.0f}% overlapped with compute; {_ms(exposed)} exposed"
        )
    else:
        exposed = m.roles_ms["communication"]
        detail = f"{c['collective_calls']} host-side collectives take {_ms(exposed)}"
    share = _share(m, exposed)
    if share < COMMUNICATION_SHARE:
        return []
    top = [
        k
        for k in m.values.get("top_kernels", [])
        if "nccl" in k["name"].lower() or "rccl" in k["name"].lower()
    ]
    top_txt = f"; top: {short_kernel_name(top[0]['name'])} ({_ms(top[0]['ms'])})" if top else ""
    backend = f" ({c['backend']})" if c["backend"] else ""
    return [
        Finding(
            id="communication",
            severity=severity_for(share),
            title=f"Communication{backend} holds {_pct(share)} of the step time",
            evidence=f"{detail} {_steps_phrase(m)}{top_txt}.",
            fix=(
                "Overlap and shrink it: with DDP tune bucket_cap_mb (e.g. 50-100) and set "
                "gradient_as_bucket_view=True / static_graph=True; accumulate gradients under "
                "no_sync(); compress gradients with a bf16/fp16 comm hook; for FSDP enable "
                "forward/backward prefetch; check the fabric (NCCL_DEBUG=INFO shows NVLink/IB "
                "vs TCP)."
            ),
            next_step=(
                f"NCCL_DEBUG=INFO {NSYS} -o comm_rank%q{{RANK}} torchrun --nproc-per-node=<gpus> "
                "train.py; compare bandwidth with nccl-tests: all_reduce_perf -b 8M -e 1G -f 2 "
                "-g <gpus>"
            ),
            cost_s=exposed / 1e3,
        )
    ]


def allocator_churn(m: TraceMetrics) -> list[Finding]:
    a = m.values["allocator"]
    steady_ms = m.details.get("allocator_steady_ms", 0.0)
    share = a["time_ms"] / steady_ms if steady_ms > 0 else 0.0
    if share < WARNING_SHARE:
        return []
    scope = (
        f"from {a['steady_state_from']} on (after the warm-up step)"
        if a["steady_state_from"] != "start of trace"
        else "over the whole trace (no steps recorded, so start-up may be included)"
    )
    return [
        Finding(
            id="allocator-churn",
            severity=severity_for(share),
            title=f"cudaMalloc/cudaFree take {_pct(share)} of the time",
            evidence=(
                f"{a['malloc_calls']} cudaMalloc and {a['free_calls']} cudaFree calls take "
                f"{_ms(a['time_ms'])} {scope}; the caching allocator keeps going back to the "
                "driver (cudaFree also synchronises the device)."
            ),
            fix=(
                "Let the caching allocator reuse memory: no torch.cuda.empty_cache() in the "
                "loop, static shapes (pad or bucket variable lengths), "
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation, and "
                "reuse preallocated buffers; if this is start-up, profile after warm-up with "
                "torch.profiler.schedule(wait=1, warmup=2, active=3)."
            ),
            next_step=(
                _rocprof("alloc")
                if _amd(m)
                else f"nsys profile -t cuda,osrt --cuda-memory-usage=true -o alloc {TRAIN}"
            ),
            cost_s=a["time_ms"] / 1e3,
        )
    ]


def long_gpu_gaps(m: TraceMetrics) -> list[Finding]:
    g = m.values["gpu_gaps"]
    if not g["count"]:
        return []
    steady_ms = (
        total(subtract(m.ranges["long_gaps_unexplained"], m.ranges["long_gaps_warmup"])) / 1e3
    )
    warm_ms = total(m.ranges["long_gaps_warmup"]) / 1e3
    if steady_ms + warm_ms <= 0:
        return []  # every long gap is explained by another finding
    longest = max(g["gaps"], key=lambda row: row["dur_ms"])
    # Gaps in the first of several steps are start-up (CUDA context, cuDNN autotuning, first
    # allocations): worth knowing, not a steady-state problem.
    severity = severity_for(_share(m, steady_ms)) if steady_ms > 0 else "info"
    warm = f"; {_ms(warm_ms)} of it in the first step (start-up)" if warm_ms > 0 else ""
    return [
        Finding(
            id="long-gpu-gaps",
            severity=severity,
            title=f"The GPU sits idle in {g['count']} stretch(es) of 500 ms or more",
            evidence=(
                f"{g['count']} idle gaps >= 500 ms, {_ms(g['total_ms'])} in all "
                f"({_ms(g['unexplained_ms'])} not explained by other findings{warm}); "
                f"longest {_ms(longest['dur_ms'])} "
                f"{'at the start' if longest['start_ms'] < 1 else 'at +' + _ms(longest['start_ms'])}"
                f" while the host was in {longest['host']}."
            ),
            fix=(
                "Find what runs in the gap and take it off the step: checkpoints (save "
                "asynchronously or less often), evaluation or logging inside the loop, blocking "
                "I/O; for start-up (CUDA init, cuDNN autotune, torch.compile) profile after "
                "warm-up with torch.profiler.schedule(wait=1, warmup=2, active=3)."
            ),
            next_step=(
                _rocprof("gaps")
                if _amd(m)
                else f"{NSYS} --sample=cpu -o gaps {TRAIN} && nsys analyze -r gpu_gaps gaps.nsys-rep"
            ),
            cost_s=(steady_ms + warm_ms) / 1e3,
        )
    ]


def no_tensor_cores(m: TraceMetrics) -> list[Finding]:
    tc = m.values["tensor_cores"]
    if not m.gpu_present or not m.devices:
        return []
    dev = m.devices[0]
    major = dev.compute_major
    if major is None:
        return []
    # Tensor cores from compute capability 7.0 (Volta); AMD matrix cores on CDNA (gfx9, major 9).
    capable = major >= 9 if _amd(m) else major >= 7
    if not capable:
        return []
    # When tensor cores already do most of the matrix work, mixed precision is on and the
    # remaining fp32 GEMMs are usually deliberate (loss, normalisation): nothing to suggest.
    if tc["tensor_core_share_of_matrix_pct"] >= 50.0:
        return []
    non_tc_ms = tc["matrix_kernel_ms"] - tc["tensor_core_kernel_ms"]
    saving = TENSOR_CORE_SAVING * non_tc_ms
    share = _share(m, saving)
    if share < INFO_SHARE:
        return []
    top = m.details.get("top_non_tensor_core_kernel")
    top_txt = f"; top: {short_kernel_name(top)}" if top else ""
    # Info only: precision is a modelling choice a trace cannot judge (fp32 may be deliberate).
    return [
        Finding(
            id="no-tensor-cores",
            severity="info",
            title=f"Matrix work runs without tensor cores on {dev.name}",
            evidence=(
                f"{_ms(non_tc_ms)} of GEMM/convolution kernels run in fp32 without tensor cores "
                f"(compute capability {tc['compute_capability']}; tensor cores do "
                f"{tc['tensor_core_share_of_matrix_pct']:.0f}% of the matrix time){top_txt}; "
                f"mixed precision would save an estimated {_ms(saving)} ({_pct(share)} of the "
                "step time)."
            ),
            fix=(
                "Use mixed precision: torch.autocast('cuda', dtype=torch.bfloat16) on Ampere and "
                "newer, float16 with torch.amp.GradScaler on Volta/Turing; at least allow TF32 "
                "on Ampere+ (torch.set_float32_matmul_precision('high')); keep GEMM dimensions "
                "multiples of 8."
            ),
            next_step=_ncu_top_kernel(m, top),
            cost_s=saving / 1e3,
        )
    ]


def memory_pressure(m: TraceMetrics) -> list[Finding]:
    mem = m.values.get("memory", {})
    out = []
    for dev, pct in (mem.get("peak_pct_of_capacity") or {}).items():
        if pct < MEMORY_PRESSURE_PCT:
            continue
        peak = mem["peak_allocated_bytes"][dev] / 2**30
        cap = mem["capacity_bytes"][dev] / 2**30
        out.append(
            Finding(
                id="memory-pressure",
                severity="warning",
                title=f"GPU {dev} memory at {pct:.0f}% of capacity",
                evidence=f"peak allocated {peak:.1f} GiB of {cap:.1f} GiB during the trace.",
                fix=(
                    "Make room before it fails or fragments: activation checkpointing "
                    "(torch.utils.checkpoint), mixed precision, a smaller micro-batch with "
                    "gradient accumulation, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True."
                ),
                next_step=f"nsys profile -t cuda --cuda-memory-usage=true -o memory {TRAIN}",
                cost_s=0.0,
                gpu=int(dev) if dev.isdigit() else None,
            )
        )
    return out


def pageable_memcpy(m: TraceMetrics) -> list[Finding]:
    if not m.gpu_present:
        return []
    c = m.values["memcpy"]
    cost = total(intersect(m.ranges["copy_cost"], merge((s.start, s.end) for s in m.steps))) / 1e3
    share = _share(m, cost)
    if share < INFO_SHARE or (c["pageable_count"] == 0 and c["blocking_calls"] == 0):
        return []
    parts = []
    if c["pageable_count"]:
        parts.append(
            f"{c['pageable_count']} copies from/to pageable memory "
            f"({c['pageable_bytes'] / 2**20:.1f} MiB, {_ms(c['pageable_ms'])} on the GPU)"
        )
    if c["blocking_calls"]:
        parts.append(
            f"{c['blocking_calls']} blocking copy calls "
            f"({_ms(c['blocking_ms'])} with the host waiting)"
        )
    return [
        Finding(
            id="pageable-memcpy",
            severity=severity_for(share),
            title=f"Host-device copies are staged or blocking ({_pct(share)} of the step time)",
            evidence=f"{'; '.join(parts)} {_steps_phrase(m)}; such copies cannot overlap compute.",
            fix=(
                "Copy from pinned memory asynchronously: DataLoader(pin_memory=True) and "
                "batch.to('cuda', non_blocking=True); pin buffers you reuse (tensor.pin_memory()); "
                "avoid torch.tensor(numpy_array).cuda() inside the step."
            ),
            next_step=(
                _rocprof("copies")
                if _amd(m)
                else f"nsys profile -t cuda,osrt -o copies {TRAIN} && "
                "nsys analyze -r cuda_memcpy_async,cuda_memcpy_sync copies.nsys-rep"
            ),
            cost_s=cost / 1e3,
        )
    ]


def gpu_idle(m: TraceMetrics) -> list[Finding]:
    if not m.gpu_present:
        return []
    other = subtract(m.ranges["role_other"], m.ranges["long_gaps"])
    cost = total(other) / 1e3
    share = _share(m, cost)
    if share < WARNING_SHARE:
        return []
    return [
        Finding(
            id="gpu-idle",
            severity=severity_for(share),
            title=f"GPU idle {_pct(share)} of the step time with no profiled host activity",
            evidence=(
                f"{_ms(cost)} {_steps_phrase(m)} where the GPU has no work and the host runs no "
                "profiled operator, runtime call or DataLoader fetch: Python code between ops, "
                "logging, I/O, or a wait the profiler does not see."
            ),
            fix=(
                "Look at the Python between steps: per-step logging and metric computation, "
                "checkpoint or eval checks, polling/sleeps, host-side preprocessing outside the "
                "DataLoader; move it off the step or make it asynchronous."
            ),
            next_step=f"{NSYS} --sample=cpu --python-sampling=true -o idle {TRAIN}",
            cost_s=cost / 1e3,
        )
    ]


RULES: tuple[Callable[[TraceMetrics], list[Finding]], ...] = (
    dataloader_stall,
    host_sync,
    launch_bound,
    communication,
    allocator_churn,
    long_gpu_gaps,
    no_tensor_cores,
    memory_pressure,
    pageable_memcpy,
    gpu_idle,
)


def run_rules(m: TraceMetrics) -> list[Finding]:
    findings: list[Finding] = []
    for rule in RULES:
        findings.extend(rule(m))
    return order_findings(findings)


def healthy_summary(m: TraceMetrics) -> str:
    if m.gpu_present:
        busy = m.values["gpu"]["busy_pct_of_steps"] or 0.0
        return f"GPU busy {busy:.0f}% of the step time {_steps_phrase(m)}"
    dl = m.values["dataloader"]
    dl_txt = (
        f"DataLoader {dl['share_pct']:.1f}% of the step time"
        if dl["calls"]
        else "no DataLoader seen"
    )
    return f"CPU-only trace ({dl_txt}; GPU metrics not assessed)"


# --- several ranks of one job ----------------------------------------------------------------


def rank_imbalance(metrics: list[TraceMetrics], labels: list[str]) -> list[Finding]:
    """A rank that does systematically more work per step than the others makes them wait in
    collectives: compare per-step work (step time minus time spent in collectives)."""
    if len(metrics) < 2:
        return []
    series = [_work_by_step(m) for m in metrics]
    if any(not s for s in series):
        return []
    common = set(series[0])
    for s in series[1:]:
        common &= set(s)
    if len(common) < 2:
        # Step names differ (ranks profiled different iterations): align by position.
        n = min(len(s) for s in series)
        series = [dict(enumerate(list(s.values())[:n])) for s in series]
        common = set(range(n))
    keys = sorted(common, key=str)
    if len(keys) < 2:
        return []
    slowest_count = [0] * len(metrics)
    excess_ms = [0.0] * len(metrics)
    for key in keys:
        works = [s[key][0] for s in series]
        worst = max(range(len(works)), key=works.__getitem__)
        slowest_count[worst] += 1
        others = [w for i, w in enumerate(works) if i != worst]
        excess_ms[worst] += works[worst] - statistics.median(others)
    straggler = max(range(len(metrics)), key=slowest_count.__getitem__)
    if slowest_count[straggler] < STRAGGLER_MAJORITY * len(keys):
        return []
    step_ms = sum(series[straggler][k][1] for k in keys)
    cost = excess_ms[straggler]
    share = cost / step_ms if step_ms > 0 else 0.0
    if share < WARNING_SHARE:
        return []
    mine = statistics.median(series[straggler][k][0] for k in keys)
    rest = statistics.median(s[k][0] for i, s in enumerate(series) if i != straggler for k in keys)
    m = metrics[straggler]
    who = labels[straggler]
    dev = m.devices[0].index if m.gpu_present and len(m.devices) == 1 else None
    return [
        Finding(
            id="imbalance",
            severity=severity_for(share),
            title=f"{who} is the straggler: it is the slowest in {slowest_count[straggler]} of {len(keys)} steps",
            evidence=(
                f"per-step work (step time minus collectives) median {_ms(mine)} on {who} vs "
                f"{_ms(rest)} on the other {len(metrics) - 1} rank(s); the others wait "
                f"{_ms(cost)} in all for it ({_pct(share)} of its step time)."
            ),
            fix=(
                "Even out the work per rank: equal shards (DistributedSampler, drop_last=True), "
                "length-grouped batches for variable sequence lengths, balanced model/embedding "
                "sharding; check the slow rank's GPU and host for throttling or other processes "
                "(gputop's live view), and make rank-0-only work (logging, checkpoints) "
                "asynchronous."
            ),
            next_step=(
                f"{NSYS} -o rank%q{{RANK}} torchrun --nproc-per-node=<gpus> train.py, then "
                f"compare the ranks' timelines (gputop analyze on each rank's torch trace)"
            ),
            cost_s=cost / 1e3,
            gpu=dev,
        )
    ]


def _work_by_step(m: TraceMetrics) -> dict:
    """Step name -> (work ms, step ms); work excludes time waiting in collectives."""
    out = {}
    host_coll = RangeIndex(m.ranges.get("host_collectives", []))
    for step, row in zip(m.steps, m.per_step_roles_ms):
        if m.gpu_present:
            wait = row["communication"]
        else:
            wait = host_coll.covered(step.start, step.end) / 1e3
        out[step.name] = (row["total"] - wait, row["total"])
    return out
