"""The roofline, live: each busy GPU's speed of light from GPM, and whether its work is
memory-bound or latency-bound.

GPM (Hopper and later; DCGM's profiling fields 1002-1005 carry the same) gives, per sample
interval, the share of the time the tensor pipes were busy (``tensor_active``), the share of
the DRAM bandwidth used (``dram_active``) and the share of SM-cycles with a warp resident
(``sm_active``). They are the speed of light of Nsight Compute: how close the GPU runs to its
compute roof (tensor activity) and to its memory roof (DRAM activity).

Read on the roofline, their ratio is the work's position: an op of intensity I on a GPU of
machine balance B runs at a fraction f of the memory roof and f x I/B of the compute roof, so
tensor / DRAM activity = I / B. Work whose tensor activity is under half its DRAM activity is
well left of the ridge (memory-bound); with DRAM at least half busy, the memory system is what
sets its pace. The fix is the trace's ``memory-bound-ops`` fix: fewer bytes per FLOP (fusion,
fused kernels, bf16 activations). Latency-bound work is neither: kernels run all the time but
a quarter or fewer of the SM-cycles have a warp and neither pipe nor memory is busy (grids
smaller than the GPU, serial dependent kernels, spin-waits).
"""

from __future__ import annotations

from gputop.core.bandwidth import Bandwidth, datasheet_bandwidth, nvml_bandwidth
from gputop.core.model import GpuSample
from gputop.diagnostics import next_steps as ns
from gputop.diagnostics.findings import Finding
from gputop.diagnostics.live.common import WINDOW_S, first_pid, mean, pct, relaunch
from gputop.diagnostics.live.windows import _Context

BUSY = 0.8  # the least share of the time kernels ran for a GPU to be busy
DRAM_HIGH = 50.0  # % of the DRAM bandwidth: memory is at least half used
MEMORY_SIDE = 0.5  # tensor / DRAM activity under this: intensity under half the balance
SM_LOW = 25.0  # % of SM-cycles with a warp while kernels run all the time
IDLE_PIPES = 30.0  # % under which neither tensor pipes nor DRAM set the pace


def speed_of_light(g: GpuSample) -> tuple[float | None, float | None]:
    """(compute, memory) speed of light of one sample, in % of the roofs: tensor-pipe and DRAM
    activity; None where GPM does not give them."""
    return g.tensor_active, g.dram_active


def memory_roof(g: GpuSample) -> Bandwidth | None:
    """The GPU's peak memory bandwidth: NVML's maximum memory clock x bus width, else the
    datasheet's for its name."""
    return (nvml_bandwidth(g.mem_clock_max_mhz, g.mem_bus_width_bits)
            or datasheet_bandwidth(g.name, g.mem_total))


def rule_roofline(ctx: _Context) -> list[Finding]:
    out = []
    for index, gpus in ctx.per_gpu():
        r = ctx.readings(index, gpus)
        kernels = r.kernels
        tensor = mean(g.tensor_active for g in gpus)
        dram = mean(g.dram_active for g in gpus)
        if kernels is None or kernels < BUSY or r.sm is None:
            continue
        name = gpus[-1].name or f"GPU {index}"
        sol = (f"speed of light: compute {tensor:.0f}% (tensor pipes), memory {dram:.0f}% "
               f"(DRAM bandwidth)" if tensor is not None and dram is not None else "")
        roof = memory_roof(gpus[-1])
        if roof is not None and dram is not None:
            sol += (f"; DRAM {dram:.0f}% of the {roof.bytes_per_s / 1e12:.2f} TB/s memory roof "
                    f"= {dram / 100 * roof.bytes_per_s / 1e12:.2f} TB/s ({roof.source})")
        if tensor is not None and dram is not None and dram >= DRAM_HIGH \
                and tensor < MEMORY_SIDE * dram:
            out.append(_memory_bound(index, gpus, kernels, tensor, dram, r.sm, name, sol))
        elif (r.sm < SM_LOW and tensor is not None and dram is not None
              and dram < IDLE_PIPES and tensor < IDLE_PIPES):
            # Only with both roofs' activities known: neither is what sets the pace.
            out.append(_latency_bound(index, gpus, kernels, r.sm, name, sol))
    return out


def _memory_bound(index, gpus, kernels, tensor, dram, sm, name, sol) -> Finding:
    # The time over what its compute needs: kernels x (1 - tensor/DRAM), at most a warning
    # (the GPU works; the work itself moves more than it computes).
    share = kernels * (1.0 - tensor / dram)
    return Finding(
        id="memory-bound",
        severity="warning" if share >= 0.05 else "info",
        title=f"GPU {index} runs memory-bound work: DRAM {dram:.0f}%, tensor pipes {tensor:.0f}%",
        evidence=(f"{name} busy {pct(kernels)} of the last {WINDOW_S:.0f} s (SM activity "
                  f"{sm:.0f}%); {sol}: tensor/DRAM activity {tensor / dram:.2f} is the work's "
                  "arithmetic intensity over the machine balance, under "
                  f"{MEMORY_SIDE:g}: element-wise, norm and softmax kernels set the pace, not "
                  "the tensor cores"),
        fix=("Move fewer bytes per FLOP: torch.compile(model) fuses chains of element-wise and "
             "norm ops; fused kernels (torch.optim.AdamW(fused=True), fused layer norm, "
             "F.scaled_dot_product_attention); bf16 activations (torch.autocast). "
             "`gputop capture` places each op on the roofline"),
        next_step=ns.gputop_capture(first_pid(gpus)),
        cost_s=share * WINDOW_S,
        gpu=index,
    )


def _latency_bound(index, gpus, kernels, sm, name, sol) -> Finding:
    share = kernels * (1.0 - sm / 100.0)
    return Finding(
        id="latency-bound",
        severity="warning" if share >= 0.05 else "info",
        title=f"GPU {index} is busy but its SMs mostly idle (SM activity {sm:.0f}%)",
        evidence=(f"{name}: kernels run {pct(kernels)} of the last {WINDOW_S:.0f} s, yet only "
                  f"{sm:.0f}% of SM-cycles have a warp" + (f"; {sol}" if sol else "")
                  + ": kernels too small to fill the GPU, run one after another"),
        fix=("Give each kernel more work: a larger batch, CUDA graphs or torch.compile("
             "mode='reduce-overhead') for chains of small kernels, fused ops; look for a kernel "
             "that spins waiting (a custom barrier) in the profile"),
        next_step=ns.nsys("latency", app=relaunch(gpus, first_pid(gpus)), trace="cuda,nvtx"),
        cost_s=share * WINDOW_S,
        gpu=index,
    )
