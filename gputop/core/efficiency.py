"""MFU, goodput and energy per step of each training process with the agent.

* **MFU** (model FLOPs utilization) = FLOPs per step (counted by the agent, one step with
  ``FlopCounterMode``) x steps/s (the agent's 30 s window) / the dense datasheet peak of the
  process's GPU for the precision most of those FLOPs used (``gputop.core.peaks``). A process's GPU is
  the one where it holds the most memory. Without a peak (no GPU, a board or a precision the
  table lacks) the achieved FLOP/s is still given, with the reason.
* **Cross-check**: where the GPU has GPM, its tensor activity (the share of cycles the tensor
  pipes were busy) bounds what tensor-core precisions can reach: MFU <= activity x SM clock /
  max clock. A count above that bound, or tensor pipes far busier than the count explains, is
  flagged as a disagreement.
* **Goodput**: the agent's ledger (``gputop.agent.goodput``): productive time over the time
  booked since the process started, and the seconds per category.
* **Energy**: NVML's energy counter of the process's GPU over the last ``ENERGY_WINDOW_S``,
  divided by the optimizer steps the agent counted meanwhile; per sample, divided again by the
  samples of the counted step. The GPU's whole energy is the job's: another process on the same
  GPU shares it.

``EfficiencyTracker`` keeps the energy windows between ticks; the Sampler attaches its results
to each ``ProcSample``. What an agent reports is untrusted: every number is checked.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable
from typing import Any

from gputop.core.agent_status import AgentStatus
from gputop.core.model import Efficiency, GpuSample
from gputop.core.peaks import PRECISIONS, peak_for
from gputop.core.protocol import GOODPUT_CATEGORIES as CATEGORIES
from gputop.core.validate import MAX_DEVICE_FLOPS, PEAK_MARGIN, real

ENERGY_WINDOW_S = 30.0  # the agent's own window for steps/s
TENSOR_PRECISIONS = frozenset({"tf32", "bf16", "fp16", "fp8", "int8"})
# MFU above activity x clock ratio by more than this is impossible for the hardware (the windows
# differ: the agent's 30 s rate against GPM's last interval, hence the slack)...
OVER_RATIO, OVER_POINTS = 1.25, 0.05
# ...and tensor pipes this much busier than the count explains mean work it does not see.
UNDER_RATIO, UNDER_FLOOR = 4.0, 0.2
GOODPUT_KEYS = CATEGORIES  # the agent's ledger: productive, startup, dataloader, ...
_PRECISION = re.compile(r"^[a-z0-9_]{1,24}$")
MAX_FLOPS = 1e21  # per step: far beyond any model, keeps a hostile number finite


def flop_count(agent: AgentStatus | None) -> tuple[dict[str, Any] | None, str | None]:
    """(the agent's last good FLOP count, why there is none)."""
    flops = agent.flops if agent is not None else None
    if not isinstance(flops, dict):
        return None, "the agent does not count FLOPs (an older gputop)"
    last = flops.get("last")
    state = flops.get("state")
    if not isinstance(last, dict):
        if state in ("armed", "counting"):
            return None, "FLOPs not counted yet (one step after warm-up)"
        return None, "FLOPs not counted (GPUTOP_FLOP_COUNT=0?): press F to count one step"
    if last.get("ok") is not True:
        message = last.get("message")
        text = message[:120] if isinstance(message, str) else "failed"
        return None, f"FLOP count failed: {text}"
    per_step = real(last.get("flops_per_step"), 0.0, MAX_FLOPS)
    if not per_step:
        return None, "the counted step ran no matrix work (FlopCounterMode counts matmuls, " \
                     "convolutions, attention)"
    precision = last.get("precision")
    samples = real(last.get("samples_per_step"), 1, 1e9)
    return {"flops_per_step": per_step,
            "precision": precision if isinstance(precision, str)
            and _PRECISION.match(precision) else None,
            "samples_per_step": int(samples) if samples else None}, None


def goodput_of(agent: AgentStatus | None) -> tuple[float | None, dict[str, float]]:
    """(the ledger's productive share, its seconds by category): checked where they were read
    (core/agent_status.py)."""
    if agent is None or agent.goodput_ledger is None:
        return None, {}
    return agent.goodput, {k: v for k, v in agent.goodput_seconds.items() if k in GOODPUT_KEYS}


def best_rate(agent: AgentStatus | None) -> float | None:
    ledger = agent.goodput_ledger if agent is not None else None
    return ledger.get("best_window_steps_per_s") if ledger is not None else None


def main_gpu(placed: Iterable[tuple[GpuSample, int | None]]) -> GpuSample | None:
    """The GPU where the process holds the most memory (a stray context elsewhere is small)."""
    best = None
    for gpu, mem in placed:
        if gpu.lost:
            continue
        if best is None or (mem or 0) > (best[1] or 0):
            best = (gpu, mem)
    return best[0] if best else None


def tensor_check(mfu: float, precision: str | None, gpu: GpuSample
                 ) -> tuple[bool | None, str | None]:
    """(agrees, note) of MFU against GPM tensor activity; (None, note) when not comparable."""
    if gpu.tensor_active is None:
        return None, None
    if precision not in TENSOR_PRECISIONS:
        return None, f"{precision or 'this precision'} does not run on tensor cores"
    clock = 1.0
    if gpu.sm_clock_mhz and gpu.sm_clock_max_mhz:
        clock = min(1.0, gpu.sm_clock_mhz / gpu.sm_clock_max_mhz)
    bound = gpu.tensor_active / 100.0 * clock
    if mfu > OVER_RATIO * bound + OVER_POINTS:
        return False, (f"MFU {share_text(mfu)} needs more tensor-core time than GPM saw "
                       f"(tensor pipes active {gpu.tensor_active:.0f}%): the FLOP count or the "
                       "peak is off")
    if bound >= UNDER_FLOOR and mfu < bound / UNDER_RATIO:
        return False, (f"tensor pipes active {gpu.tensor_active:.0f}% but the counted FLOPs "
                       f"fill {share_text(mfu)} of the peak: work the count does not see "
                       "(custom or Triton kernels, another process on the GPU)")
    return True, f"tensor pipes active {gpu.tensor_active:.0f}%"


def efficiency(agent: AgentStatus | None, gpu: GpuSample | None,
               j_per_step: float | None = None, window_s: float | None = None) -> Efficiency:
    """One process's figures from its agent's status and its GPU (None: not on a GPU)."""
    count, why = flop_count(agent)
    share, seconds = goodput_of(agent)
    rate = agent.steps_per_s if agent is not None else None
    fields: dict[str, Any] = {"goodput": share, "goodput_s": seconds,
                              "j_per_step": j_per_step, "energy_window_s": window_s}
    if gpu is not None:
        fields["tensor_active"] = gpu.tensor_active
    if count is None:
        return Efficiency(mfu_note=why, **fields)
    per_step, precision = count["flops_per_step"], count["precision"]
    samples = count["samples_per_step"]
    fields.update(flops_per_step=per_step, precision=precision, samples_per_step=samples)
    if j_per_step is not None and samples:
        fields["j_per_sample"] = j_per_step / samples
    if rate is None:
        return Efficiency(mfu_note="no step rate yet", **fields)
    achieved = per_step * rate
    if achieved > MAX_DEVICE_FLOPS:  # more than any one device does: not shown or exported
        return Efficiency(mfu_note="the agent's FLOP count x steps/s is beyond any GPU: "
                          "dropped", **fields)
    fields["achieved_flops"] = achieved
    if gpu is None:
        return Efficiency(mfu_note="not on a GPU: no peak to compare with", **fields)
    fields["device"] = gpu.name
    peak = peak_for(gpu.name, precision)
    if peak is None:
        if precision is None or precision not in PRECISIONS:
            note = f"precision {precision or 'unknown'}: no datasheet peak for it"
        elif peak_for(gpu.name, "fp32") is None:
            note = f"no datasheet peak for {gpu.name or 'this GPU'}"
        else:
            note = f"{gpu.name} has no {precision} peak in its datasheet"
        return Efficiency(mfu_note=note, **fields)
    mfu = achieved / peak.flops
    if mfu > PEAK_MARGIN:  # above the datasheet peak: the count or the rate is false
        del fields["achieved_flops"]
        return Efficiency(mfu_note=f"the agent's FLOPs x steps/s exceed {peak.board}'s "
                          f"{peak.precision} peak x {PEAK_MARGIN}: dropped", **fields)
    best = best_rate(agent)
    agrees, tensor_note = tensor_check(mfu, peak.precision, gpu)
    fields.update(device=peak.board, peak_flops=peak.flops, peak_source=peak.source, mfu=mfu,
                  best_mfu=per_step * best / peak.flops if best else None,
                  tensor_agrees=agrees, tensor_note=tensor_note)
    if peak.precision != precision:
        fields["mfu_note"] = f"{peak.board} has no {precision}: measured against its " \
                             f"{peak.precision} peak"
    return Efficiency(**fields)


class EfficiencyTracker:
    """Per process: (time, steps, joules) over the last ENERGY_WINDOW_S, for J/step."""

    def __init__(self, window_s: float = ENERGY_WINDOW_S) -> None:
        self.window_s = window_s
        self._points: dict[int, deque[tuple[float, int, float]]] = {}
        self._gpu: dict[int, int] = {}

    def update(self, now: float, placed: dict[int, list[tuple[GpuSample, int | None]]],
               agents: dict[int, AgentStatus]) -> dict[int, Efficiency]:
        """Efficiency of every process with an agent; ``placed`` lists its GPUs and the memory
        it holds on each (empty for a process no GPU reports)."""
        out: dict[int, Efficiency] = {}
        for pid, agent in agents.items():
            gpu = main_gpu(placed.get(pid, ()))
            j_per_step, window = self._energy(pid, now, gpu, agent)
            out[pid] = efficiency(agent, gpu, j_per_step, window)
        # A pid whose agent missed this tick's deadline (a busy process: the probe retries it
        # later) keeps its window; it is forgotten once its newest point is a window old.
        for pid in [p for p, pts in self._points.items()
                    if p not in agents and (not pts or pts[-1][0] <= now - self.window_s)]:
            del self._points[pid]
            self._gpu.pop(pid, None)
        return out

    def _energy(self, pid: int, now: float, gpu: GpuSample | None, agent: AgentStatus
                ) -> tuple[float | None, float | None]:
        steps = agent.steps
        if gpu is None or gpu.energy_j is None or steps is None:
            return None, None  # nothing to add this tick; both counters still hold across it
        points = self._points.setdefault(pid, deque())
        if self._gpu.get(pid) != gpu.index or (points and (gpu.energy_j < points[-1][2]
                                                           or steps < points[-1][1])):
            points.clear()  # another GPU, a driver reload or another process behind the pid
        self._gpu[pid] = gpu.index
        points.append((now, steps, float(gpu.energy_j)))
        while len(points) > 2 and points[1][0] <= now - self.window_s:
            points.popleft()
        first, last = points[0], points[-1]
        done = last[1] - first[1]
        if done <= 0:
            return None, None
        return (last[2] - first[2]) / done, last[0] - first[0]


# -- jobs: the ranks together ------------------------------------------------------------------


def job_figures(ranks: Iterable[tuple[Efficiency | None, tuple[int, ...]]]) -> dict[str, Any]:
    """A job's MFU (achieved over peak, summed over ranks), mean goodput, and J/step (summed
    over the GPUs of its ranks: every rank takes each step)."""
    achieved = peak = 0.0
    mfu_ranks = 0
    goodputs: list[float] = []
    joules = 0.0
    seen_gpus: set[int] = set()
    energy_ranks = 0
    for eff, gpus in ranks:
        if eff is None:
            continue
        if eff.mfu is not None and eff.achieved_flops is not None and eff.peak_flops:
            achieved += eff.achieved_flops
            peak += eff.peak_flops
            mfu_ranks += 1
        if eff.goodput is not None:
            goodputs.append(eff.goodput)
        if eff.j_per_step is not None and not (set(gpus) & seen_gpus):
            joules += eff.j_per_step
            seen_gpus.update(gpus)
            energy_ranks += 1
    return {"mfu": achieved / peak if peak else None,
            "achieved_flops": achieved if mfu_ranks else None,
            "goodput": sum(goodputs) / len(goodputs) if goodputs else None,
            "j_per_step": joules if energy_ranks else None}


# -- text -----------------------------------------------------------------------------------------


def share_text(value: float | None) -> str:
    """A share as a percentage, with up to three decimals below 1 % (a CPU job against a GPU's
    peak reads 0.005 %, not 0 %)."""
    if value is None:
        return "n/a"
    pct = value * 100
    if pct >= 10 or pct == 0:
        return f"{pct:.0f}%"
    if pct >= 1:
        return f"{pct:.1f}%"
    if pct >= 0.1:
        return f"{pct:.2f}%"
    return f"{pct:.3f}%" if pct >= 0.0005 else "<0.001%"


def flops_text(value: float | None) -> str:
    if value is None:
        return "n/a"
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.3g} FLOP"


def joules_text(value: float | None) -> str:
    if value is None:
        return "n/a"
    if value >= 1000:
        return f"{value / 1000:.3g} kJ"
    if 0 < value < 1:
        return f"{value * 1000:.3g} mJ"  # three figures in units, not 0.0947 J
    return f"{value:.3g} J"


def short_text(eff: Efficiency | None) -> str:
    """The process row's few words: MFU (or achieved FLOP/s), goodput, J/step."""
    if eff is None:
        return ""
    parts = []
    if eff.mfu is not None:
        parts.append(f"MFU {share_text(eff.mfu)}" + ("!" if eff.tensor_agrees is False else ""))
    elif eff.achieved_flops is not None:
        parts.append(f"{flops_text(eff.achieved_flops)}/s")
    # No "MFU n/a": the row's command column is narrow (80x24), and a figure that is not
    # there says nothing at a glance; the process view says why.
    if eff.goodput is not None:
        parts.append(f"goodput {share_text(eff.goodput)}")
    if eff.j_per_step is not None:
        parts.append(f"{joules_text(eff.j_per_step)}/step")
    return ", ".join(parts)


def goodput_breakdown(seconds: dict[str, float]) -> str:
    """``productive 41% · start-up 12% · DataLoader 40% ...`` over the seconds booked."""
    total = sum(seconds.values())
    if total <= 0:
        return "n/a"
    names = {"startup": "start-up", "dataloader": "DataLoader", "capture": "captures",
             "checkpoint": "checkpoints", "stall": "stalls", "hang": "hangs"}
    return " · ".join(f"{names.get(k, k)} {share_text(v / total)}"
                      for k, v in seconds.items() if v > 0 or k == "productive")


def long_lines(eff: Efficiency) -> list[str]:
    """Every figure with where it comes from (snapshot text, the process view)."""
    lines = []
    if eff.mfu is not None:
        lines.append(f"MFU {share_text(eff.mfu)}: {flops_text(eff.flops_per_step)}/step "
                     f"({eff.precision}) at {flops_text(eff.achieved_flops)}/s of "
                     f"{flops_text(eff.peak_flops)}/s ({eff.device} dense {eff.precision} peak)"
                     + (f"; best 30 s window {share_text(eff.best_mfu)}"
                        if eff.best_mfu is not None else ""))
        if eff.mfu_note:
            lines.append(f"  {eff.mfu_note}")
    else:
        achieved = (f"achieved {flops_text(eff.achieved_flops)}/s "
                    f"({flops_text(eff.flops_per_step)}/step, {eff.precision}); "
                    if eff.achieved_flops is not None else "")
        lines.append(f"MFU n/a: {achieved}{eff.mfu_note or 'unknown'}")
    if eff.tensor_note:
        verdict = {True: "agrees", False: "DISAGREES", None: "not comparable"}[eff.tensor_agrees]
        lines.append(f"GPM cross-check {verdict}: {eff.tensor_note}")
    if eff.goodput is not None:
        lines.append(f"goodput {share_text(eff.goodput)}: {goodput_breakdown(eff.goodput_s)}")
    if eff.j_per_step is not None:
        per_sample = (f", {joules_text(eff.j_per_sample)}/sample"
                      if eff.j_per_sample is not None else "")
        lines.append(f"energy {joules_text(eff.j_per_step)}/step{per_sample} (GPU energy "
                     f"counter over {eff.energy_window_s or 0:.0f} s)")
    return lines
