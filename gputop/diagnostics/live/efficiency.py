"""The live rule on MFU: a job far below what the same job reached earlier.

"What it can reach" is measured, not guessed: the agent keeps the job's best 30 s window of step
rate since it started, and with the same FLOP count and the same GPU's peak that window's MFU is
the job's own best. The rule compares it with the current MFU (the agent's last 30 s, the same
length of window), so a model that is slow by design never fires it; a job that became slower
than itself does.

A steady job's 30 s step rate moves by a few percent from window to window; losing ``DROP`` (30 %)
of it is far outside that. Losing half is critical, as on the trace rules' scale anything that
costs a quarter of the time or more is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gputop.core.efficiency import flops_text, share_text
from gputop.diagnostics import next_steps as ns
from gputop.diagnostics.findings import Finding

if TYPE_CHECKING:
    from gputop.core.model import ProcSample
    from gputop.diagnostics.live.windows import _Context

DROP = 0.30  # the share of its best MFU the job must have lost
CRITICAL_DROP = 0.50
WINDOW_S = 30.0  # both figures are rates over 30 s windows (the agent's)


def _procs(ctx: _Context) -> list[tuple[int | None, ProcSample]]:
    snap = ctx.window[-1]
    seen: set[int] = set()
    out = []
    for g in snap.gpus:
        for p in g.processes:
            if p.pid not in seen and p.efficiency is not None:
                seen.add(p.pid)
                out.append((g.index, p))
    out += [(None, p) for p in snap.other_processes
            if p.pid not in seen and p.efficiency is not None]
    return out


def rule_mfu_drop(ctx: _Context) -> list[Finding]:
    out = []
    for gpu, proc in _procs(ctx):
        eff = proc.efficiency
        if eff is None or eff.mfu is None or not eff.best_mfu:
            continue
        lost = 1.0 - eff.mfu / eff.best_mfu
        if lost < DROP:
            continue
        where = f"GPU {gpu}" if gpu is not None else "its GPU"
        out.append(Finding(
            id="mfu-drop",
            severity="critical" if lost >= CRITICAL_DROP else "warning",
            title=f"pid {proc.pid}: MFU {share_text(eff.mfu)}, {lost * 100:.0f}% under its best",
            evidence=(f"MFU {share_text(eff.mfu)} over the last {WINDOW_S:.0f} s against "
                      f"{share_text(eff.best_mfu)} in its best {WINDOW_S:.0f} s window (the same "
                      f"{flops_text(eff.flops_per_step)}/step on the {eff.device} "
                      f"{eff.precision} peak): the job runs slower than it already did"),
            fix=(f"Find what changed since its best window: the other findings on {where}, "
                 "the input pipeline, a new phase (evaluation, a larger sequence length), "
                 "checkpoints, or another process on the GPU; the goodput breakdown shows where "
                 "the time goes"),
            next_step=ns.gputop_capture(proc.pid),
            cost_s=lost * WINDOW_S,
            gpu=gpu,
            pid=proc.pid,
        ))
    return out
