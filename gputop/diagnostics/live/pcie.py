"""The host link: ``pcie-bound``, from PCIe throughput against the link's capacity.

Utilization cannot say it: on real hardware NVML counts copy time as busy, so a job that only
copies reads 52-100 % "utilization" with SM activity of 3-7 %. What the counters do say: the
busier direction's throughput over the link's theoretical capacity (generation and width,
``links``) is the least share of the time the link was moving data (at best it carries ~90 %
of its theoretical rate after packet overheads). From half the time on, copies take at least
half of every step. They bound the step unless the SMs compute longer than the link copies
(SM activity above that share: the copies may hide under compute); the cost is the time the
SMs idle, up to the link's busy share. Without SM activity (no GPM) overlap cannot be seen,
and the link's share is the cost.
"""

from __future__ import annotations

from gputop.diagnostics import next_steps as ns
from gputop.diagnostics.findings import Finding
from gputop.diagnostics.live.common import (
    WARNING_SHARE,
    WINDOW_S,
    first_pid,
    pct,
    relaunch,
    severity_for,
)
from gputop.diagnostics.live.windows import _Context

LINK_BUSY = 0.5  # of the link's theoretical capacity, in its busier direction


def rule_pcie(ctx: _Context) -> list[Finding]:
    out = []
    for index, gpus in ctx.per_gpu():
        r = ctx.readings(index, gpus)
        link, bus = r.link, r.bus
        if link is None or bus is None or bus < LINK_BUSY:
            continue
        if r.sm is not None and r.sm / 100.0 >= bus:
            continue  # the SMs compute longer than the link copies
        share = min(bus, 1.0 - r.sm / 100.0) if r.sm is not None else bus
        if share < WARNING_SHARE:
            continue
        traffic = max(r.rx, r.tx)
        direction = "host to device" if r.rx >= r.tx else "device to host"
        source = ("" if link.source == "driver" else
                  f" (the driver did not report the link: {link.name} from {link.source})")
        sm = (f", SM activity {r.sm:.0f}%: the SMs compute less than the link copies"
              if r.sm is not None else ", no SM activity (GPM) to see whether compute overlaps")
        util = f"utilization {r.util:.0f}% counts copy time as busy" if r.util is not None else ""
        out.append(Finding(
            id="pcie-bound",
            severity=severity_for(share),
            title=f"GPU {index} waits on PCIe copies",
            evidence=(f"{traffic / 1000:.1f} GB/s {direction} = {pct(bus)} of the {link.name} "
                      f"link's {link.capacity_mbs / 1000:.1f} GB/s over {WINDOW_S:.0f} s"
                      f"{source}; {util}{sm}"),
            fix=("Send less over the bus: keep data on the GPU across steps, send uint8 images and "
                 "normalise on the GPU, use pin_memory=True with non_blocking=True to overlap copies"),
            next_step=ns.nsys("pcie", app=relaunch(gpus, first_pid(gpus)),
                              trace="cuda,osrt") + " && nsys stats --report=cuda_gpu_mem_size_sum,"
                              "cuda_gpu_mem_time_sum pcie.nsys-rep",
            cost_s=share * WINDOW_S,
            gpu=index,
        ))
    return out
