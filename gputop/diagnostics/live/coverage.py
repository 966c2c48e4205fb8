"""What the live rules could not assess, from the inputs they were given.

The rules use what the samples hold: a driver without GPM gives no SM activity, an older
recording no PCIe link or process states, an older agent no device-sync timing. ``Coverage``
watches the snapshots go by and says, in a few lines, which findings could not be judged and
what stood in for a missing input (the PCIe link from the board's datasheet, say).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gputop.core.model import Snapshot
from gputop.core.pcie import board_link
from gputop.diagnostics.live.common import agent_share


@dataclass
class _GpuSeen:
    name: str | None = None
    sm_active: bool = False
    link: bool = False


@dataclass
class Coverage:
    gpus: dict[int, _GpuSeen] = field(default_factory=dict)
    processes: int = 0
    states: int = 0
    start_times: int = 0
    agents: int = 0
    agents_timing_syncs: int = 0

    def add(self, snap: Snapshot) -> None:
        for g in snap.gpus:
            seen = self.gpus.setdefault(g.index, _GpuSeen())
            seen.name = g.name or seen.name
            seen.sm_active = seen.sm_active or g.sm_active is not None
            seen.link = seen.link or bool((g.pcie_gen_max or g.pcie_gen)
                                          and (g.pcie_width_max or g.pcie_width))
            for p in g.processes:
                if not p.visible:
                    continue
                self.processes += 1
                self.states += bool(p.state)
                self.start_times += p.create_time is not None
                if p.agent:
                    self.agents += 1
                    self.agents_timing_syncs += agent_share(p, "sync_wait_share") is not None

    def notes(self) -> list[str]:
        out = []
        for index, seen in sorted(self.gpus.items()):
            label = f"GPU {index} ({seen.name or 'unknown model'})"
            if not seen.sm_active:
                out.append(f"{label}: no SM activity (GPM): launch-bound not assessed, and "
                           "host-bound cannot tell kernel launches from Python")
            if not seen.link:
                board = board_link(seen.name)
                out.append(f"{label}: PCIe link not reported; Gen{board.gen} x{board.width} "
                           f"taken from {board.source}" if board is not None else
                           f"{label}: PCIe link not reported and the model is not in gputop's "
                           "datasheet table: pcie-bound not assessed")
        if not self.processes:
            return out
        if not self.states:
            out.append("no process states: host-sync from outside (a process asleep while its "
                       "GPU works) and the CPU-starved (runnable) share not assessed")
        if not self.start_times:
            out.append("no process start times: a process without the agent is taken to start "
                       "when first seen")
        if not self.agents:
            out.append("no agent telemetry (jobs not started with `gputop run`): no step "
                       "breakdown, DataLoader stalls judged from worker CPU only")
        elif not self.agents_timing_syncs:
            out.append("the agents report no device-sync timing (an older gputop): host-sync "
                       "only from process states; host-bound from the process's CPU")
        return out
