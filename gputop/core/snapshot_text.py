"""A snapshot as text: the host, every GPU (and its MIG devices), then the GPUs' processes
with their workers, agents and compile health. `gputop snapshot` prints it; the live monitor
paints it as its plain first frame (tui/monitor/plain_frame.py). What comes from processes and agents
is escaped (``safe_text``)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from gputop.core.format import bytes_h, mbs_h, num, pct, safe_text, truncate

if TYPE_CHECKING:
    from gputop.core.agent_status import AgentStatus
    from gputop.core.model import GpuSample, ProcSample, Snapshot


def _scaled(value: object, factor: float) -> float | None:
    return float(value) * factor if isinstance(value, (int, float)) else None


def agent_line(a: AgentStatus) -> str:
    """The agent's telemetry in one line; n/a until the first steps are timed (never 0)."""
    who = f"rank {a.rank}/{a.world_size}, " if a.rank is not None and a.world_size else ""
    if not a.steps:
        return who + "no optimizer step yet (steps/s, step time and DataLoader wait: n/a)"
    return who + (f"{num(_scaled(a.steps_per_s, 1), 2)} steps/s, step p50 "
            f"{num(_scaled(a.step_time_p50_s, 1000), 0, ' ms')}, DataLoader wait "
            f"{pct(_scaled(a.dataloader_wait_share, 100))}")


def _proc_lines(proc: ProcSample, gpu: int | None, width: int) -> list[str]:
    from gputop.core.process_info import per_process, tags

    gpu_col = "-" if gpu is None else str(gpu)
    cmd = safe_text(proc.cmdline or proc.name)  # another user's command may carry escapes
    if not proc.visible and not proc.cmdline:
        cmd = safe_text(proc.name)
    where = tags(proc)  # MIG device, the other pid, container / pod / Slurm job
    line = (
        f"  {gpu_col:>3} {proc.pid:>7} {truncate(proc.user or '?', 8):<8} "
        f"{per_process(proc, proc.gpu_mem, bytes_h):>9} "
        f"{per_process(proc, proc.sm_util, pct):>9} {pct(proc.cpu_percent):>6} "
        f"{bytes_h(proc.rss):>7} {truncate(proc.state or '-', 8):<8} "
    )
    lines = [line + truncate(cmd, max(10, width - len(line)))]
    if where:
        lines.append(f"{'':>13}{where}")
    if proc.hidden:
        lines.append(f"{'':>13}{safe_text(proc.hidden)}")
    if proc.agent:
        lines.append(f"{'':>13}agent: {agent_line(proc.agent)}")
    if proc.efficiency is not None:
        from gputop.core.efficiency import long_lines

        lines.extend(f"{'':>13}{truncate(safe_text(line), max(20, width - 13))}"
                     for line in long_lines(proc.efficiency))
    if proc.compiled is not None:  # torch.compile's health
        from gputop.core.compile_health import compile_lines

        lines.extend(f"{'':>13}{truncate(safe_text(line), max(20, width - 13))}"
                     for line in compile_lines(proc.compiled))
    for i, w in enumerate(proc.workers):
        branch = "└─" if i == len(proc.workers) - 1 else "├─"
        lines.append(
            f"  {'':>3} {w.pid:>7} {'':<8} {'':>9} {'':>9} {pct(w.cpu_percent):>6} "
            f"{bytes_h(w.rss):>7} {truncate(w.state, 8):<8} {branch} {safe_text(w.name)} (worker)"
        )
    return lines


def _mig_lines(g: GpuSample) -> list[str]:
    """A MIG-enabled GPU's MIG devices, one line each. NVML gives no utilization for them;
    SM activity comes from GPM where the GPU has it, else n/a (never 0)."""
    if not g.mig_mode:
        return []
    out = [f"     MIG on: {len(g.mig)} MIG devices (no NVML utilization per device; SM activity "
           f"from GPM)"]
    for m in g.mig:
        mem = f"{bytes_h(m.mem_used, 'G')}/{bytes_h(m.mem_total, 'G')}"
        pids = ",".join(map(str, m.pids)) or "-"
        out.append(f"     GI {m.gpu_instance:>2} CI {m.compute_instance if m.compute_instance is not None else '?':>1} "
                   f"{truncate(m.profile or '?', 10):<10} mem {mem:>11}  SM act "
                   f"{pct(m.sm_active):>5}  tensor {pct(m.tensor_active):>5}  pids {pids}")
    return out


def format_snapshot(snap: Snapshot, width: int = 120) -> str:
    d, h = snap.driver, snap.host
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(snap.time))
    if d.available:
        drv = f"driver {d.driver_version or 'n/a'}  CUDA {d.cuda_version or 'n/a'}"
        if d.simulated:
            drv += f"  (simulated: {d.simulated})"
    else:
        drv = f"no GPU driver: {d.error}"
    out = [f"{h.hostname}  {drv}  {stamp}"]
    out.append(
        f"CPU {pct(h.cpu_percent)} of {h.cpu_count} cores  iowait {pct(h.iowait, 1)}  "
        f"load {num(h.load_1, 2)} {num(h.load_5, 2)} {num(h.load_15, 2)}  "
        f"mem {bytes_h(h.memory_used)}/{bytes_h(h.memory_total)}  "
        f"swap {bytes_h(h.swap_used)}/{bytes_h(h.swap_total)}"
    )
    if d.available and not snap.gpus and d.error:
        out.append("")
        out.append(f"no GPUs: {safe_text(d.error)}")
    if snap.gpus:
        out.append("")
        out.append(
            f"{'GPU':<4} {'NAME':<24} {'UTIL':>5} {'MEMORY':>13} {'POWER':>11} {'TEMP':>5} "
            f"{'SM CLOCK':>11} {'PCIe RX/TX':>13}  EVENTS"
        )
    for g in snap.gpus:
        if g.lost:
            out.append(f"[{g.index}]  {truncate(g.name or '?', 24):<24} LOST (off the bus or no longer reachable)")
            continue
        mem = f"{bytes_h(g.mem_used, 'G')}/{bytes_h(g.mem_total, 'G')}"
        power = f"{num(g.power_w)}/{num(g.power_limit_w)}W" if g.power_w is not None else "n/a"
        clock = f"{num(g.sm_clock_mhz)}/{num(g.sm_clock_max_mhz)}"
        pcie = f"{mbs_h(g.pcie_rx_mbs)}/{mbs_h(g.pcie_tx_mbs)}"
        events = ",".join(e for e in g.clock_events if e != "gpu_idle") or "-"
        out.append(
            f"[{g.index}]  {truncate(g.name or '?', 24):<24} {pct(g.util_gpu):>5} {mem:>13} "
            f"{power:>11} {num(g.temperature_c, 0, 'C'):>5} {clock:>11} {pcie:>13}  {events}"
        )
        out.extend(_mig_lines(g))
    procs: list[tuple[int | None, ProcSample]] = [(g.index, p) for g in snap.gpus
                                                   for p in g.processes]
    procs += [(None, p) for p in snap.other_processes]
    if procs:
        out.append("")
        out.append(
            f"  {'GPU':>3} {'PID':>7} {'USER':<8} {'GPU MEM':>9} {'SM':>9} {'CPU':>6} "
            f"{'RSS':>7} {'STATE':<8} COMMAND"
        )
        for gpu, proc in procs:
            out.extend(_proc_lines(proc, gpu, width))
    elif snap.gpus:
        out.append("")
        out.append("no GPU processes")
    return "\n".join(out)
