"""The board itself: ``throttling`` and ``hardware-errors``.

Throttling counts only while the GPU is busy and the SM clock is at least 10 % under its
maximum, for a reason NVML names (power cap, thermal, hardware slowdown): a power-capped idle
GPU costs nothing. A GPU whose handle answers GPU_IS_LOST, or INVALID_ARGUMENT even for its UUID, has fallen off
the bus (the driver no longer knows it); rising volatile ECC
counts precede failures.
"""

from __future__ import annotations

from gputop.diagnostics.findings import Finding
from gputop.diagnostics.live.common import WINDOW_S, mean
from gputop.diagnostics.live.windows import _Context

THROTTLE_EVENTS = ("sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake")


def rule_throttling(ctx: _Context) -> list[Finding]:
    out = []
    for index, gpus in ctx.per_gpu():
        busy = [g for g in gpus if (g.util_gpu or 0) >= 50]
        if len(busy) < max(3, len(gpus) // 2):
            continue
        throttled = [g for g in busy if any(e in THROTTLE_EVENTS for e in g.clock_events)]
        if len(throttled) < len(busy) / 2:
            continue
        clock = mean(g.sm_clock_mhz for g in throttled)
        max_clock = throttled[-1].sm_clock_max_mhz
        if clock is None or not max_clock or clock > 0.9 * max_clock:
            continue
        lost = 1 - clock / max_clock
        reasons = sorted({e for g in throttled for e in g.clock_events if e in THROTTLE_EVENTS})
        thermal = any("thermal" in r for r in reasons)
        last = throttled[-1]
        power = (f", power {last.power_w:.0f}/{last.power_limit_w:.0f} W"
                 if last.power_w is not None and last.power_limit_w else "")
        temp = f", {last.temperature_c:.0f} C" if last.temperature_c is not None else ""
        out.append(Finding(
            id="throttling",
            severity="critical" if thermal else "warning",
            title=f"GPU {index} clocks held down ({', '.join(reasons)})",
            evidence=(f"SM clock {clock:.0f}/{max_clock:.0f} MHz (-{lost * 100:.0f}%) while busy"
                      f"{power}{temp}; reasons: {', '.join(reasons)}"),
            fix=("Thermal: check the node's cooling and airflow, fan or chassis faults. Power cap: "
                 "check `nvidia-smi -q -d POWER` for a lowered limit (nvidia-smi -pl), or accept it"
                 if thermal else
                 "The board is at its power limit: check `nvidia-smi -q -d POWER` for a lowered "
                 "limit; otherwise this is the GPU's ceiling (mixed precision does more per watt)"),
            next_step=f"nvidia-smi -q -d PERFORMANCE,POWER,TEMPERATURE -i {index}",
            cost_s=lost * WINDOW_S,
            gpu=index,
        ))
    return out


def rule_hardware(ctx: _Context) -> list[Finding]:
    out = []
    for index, gpus in ctx.per_gpu():
        last = gpus[-1]
        if last.lost:
            out.append(Finding(
                id="hardware-errors",
                severity="critical",
                title=f"GPU {index} fell off the bus",
                evidence=(f"GPU {index} ({last.name or '?'}, {last.bus_id or '?'}) no longer "
                          "answers the driver (NVML: GPU_IS_LOST, or an invalid handle)"),
                fix=("The GPU needs a reset or the node a reboot; drain the node and check "
                     "`dmesg | grep -i xid` for the Xid code (79: fallen off the bus)"),
                next_step="dmesg -T | grep -i -E 'xid|nvrm'",
                cost_s=WINDOW_S,
                gpu=index,
            ))
            continue
        counts = [g.ecc_volatile for g in gpus if g.ecc_volatile is not None]
        if counts and counts[-1] > 0 and (counts[-1] > counts[0] or len(counts) >= 3):
            out.append(Finding(
                id="hardware-errors",
                severity="critical" if counts[-1] > counts[0] else "warning",
                title=f"GPU {index} reports ECC errors",
                evidence=f"{counts[-1]} volatile ECC errors (+{counts[-1] - counts[0]} in {WINDOW_S:.0f} s)",
                fix="Rising ECC errors precede failures: drain the node and have the GPU checked",
                next_step=f"nvidia-smi -q -d ECC,ROW_REMAPPER -i {index}",
                gpu=index,
            ))
    return out
