"""MFU on a real GPU: the agent's figure beside the analytic one and GPM's tensor activity.

    python benchmarks/gpu/mfu_check.py [--seconds 60] [--precision bf16] [--width 8192]
                                       [--layers 4] [--batch 8192]

A child process trains an MLP of ``--layers`` Linear(width, width) layers on CUDA under the
gputop agent (its FLOPs are known: 2·B·in·out forward, 2·B·in·out for each weight's gradient and
2·B·in·out for each input's gradient but the first layer's), with the model in the precision
asked for (``tf32``: fp32 with TF32 matmuls allowed). The parent samples it once a second with
gputop's own collector (NVML, GPM, the agent's socket: what `gputop` shows) and prints, per
sample and as medians: the agent's MFU, the analytic MFU (analytic FLOPs x the agent's steps/s
over the same datasheet peak), GPM tensor activity and the SM clock, and gputop's cross-check
verdict. It exits 1 when the agent's FLOP count is more than 5 % off the analytic count.

For a dry run without a GPU: ``--device cpu --demo healthy`` trains on the CPU and puts the
child on the simulated H100 of the demo (GPUTOP_DEMO_PIDS): the numbers are then the
simulator's, the code path the same.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def analytic_flops(width: int, layers: int, batch: int) -> int:
    per_layer = 2 * batch * width * width
    return layers * per_layer + layers * per_layer + (layers - 1) * per_layer


# --- child: the training job ----------------------------------------------------------------


def child(args: argparse.Namespace) -> int:
    import gputop.agent

    gputop.agent.install()  # before torch, as under `gputop run`
    import torch
    from torch import nn

    device = torch.device(args.device)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32,
             "fp32": torch.float32}[args.precision]
    if args.precision == "tf32":
        torch.backends.cuda.matmul.allow_tf32 = True
    elif args.precision == "fp32":
        torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(args.width, args.width, bias=False)
                            for _ in range(args.layers)]).to(device=device, dtype=dtype)
    opt = torch.optim.SGD(model.parameters(), lr=1e-6, foreach=True)
    x = torch.randn(args.batch, args.width, device=device, dtype=dtype)
    print(json.dumps({"pid": os.getpid(),
                      "analytic": analytic_flops(args.width, args.layers, args.batch)}),
          flush=True)
    end = time.monotonic() + args.seconds + 60
    step = 0
    while time.monotonic() < end:
        loss = model(x).float().square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        if step % 10 == 0 and device.type == "cuda":
            torch.cuda.synchronize()  # keep the host within 10 steps of the GPU
    return 0


# --- parent: gputop's view --------------------------------------------------------------------


def pct(value: float | None) -> str:
    from gputop.core.efficiency import share_text

    return share_text(value)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0,
                        help="how long to sample after the agent's FLOP count (default 60)")
    parser.add_argument("--precision", choices=["bf16", "fp16", "tf32", "fp32"], default="bf16")
    parser.add_argument("--width", type=int, default=8192)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8192)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--demo", default=None, help="simulated GPUs for a dry run (healthy)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)

    from gputop.client.agents import agent_status
    from gputop.client.session import open_sampler
    from gputop.core.efficiency import flops_text

    argv = [sys.executable, __file__, "--child", "--seconds", str(args.seconds),
            "--precision", args.precision, "--width", str(args.width), "--layers",
            str(args.layers), "--batch", str(args.batch), "--device", args.device]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    job = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
    try:
        hello = json.loads(job.stdout.readline())
        pid, analytic = hello["pid"], hello["analytic"]
        print(f"model: {args.layers} x Linear({args.width}, {args.width}) {args.precision}, "
              f"batch {args.batch}: analytic {flops_text(analytic)}/step", flush=True)
        count = None
        deadline = time.monotonic() + 600
        while count is None and time.monotonic() < deadline and job.poll() is None:
            status = agent_status(pid, timeout=5.0) or {}
            count = (status.get("flops") or {}).get("last")
            time.sleep(0.5)
        if not count or not count.get("ok"):
            print(f"the agent's FLOP count did not come: {count}", file=sys.stderr)
            return 1
        ratio = count["flops_per_step"] / analytic
        print(f"agent's count: {flops_text(count['flops_per_step'])}/step "
              f"({count['precision']} {count['precision_share'] * 100:.0f}%), step "
              f"{count['step']}, counted in {count['counted_step_s'] * 1e3:.1f} ms against "
              f"{(count['typical_step_s'] or 0) * 1e3:.1f} ms typical: count/analytic "
              f"{ratio:.4f}", flush=True)
        if args.demo:
            os.environ["GPUTOP_DEMO_PIDS"] = f"0:{pid}"
        rows = []
        with open_sampler(args.demo, wait_for_workers=0) as sampler:
            end = time.monotonic() + args.seconds
            while time.monotonic() < end and job.poll() is None:
                snap = sampler.sample()
                placed = [(g, p) for g in snap.gpus for p in g.processes if p.pid == pid]
                if placed and placed[0][1].efficiency is not None:
                    g, p = placed[0]
                    eff = p.efficiency
                    rate = p.agent.steps_per_s if p.agent else None
                    analytic_mfu = (analytic * rate / eff.peak_flops
                                    if rate and eff.peak_flops else None)
                    clock = (g.sm_clock_mhz / g.sm_clock_max_mhz
                             if g.sm_clock_mhz and g.sm_clock_max_mhz else None)
                    rows.append((eff.mfu, analytic_mfu, g.tensor_active, clock,
                                 eff.tensor_agrees))
                    if len(rows) == 1:
                        print(f"device {g.name}: {eff.device} dense {eff.precision} peak "
                              f"{(eff.peak_flops or 0) / 1e12:.1f} TFLOP/s ({eff.peak_source})",
                              flush=True)
                    print(f"t={len(rows):3d} s  steps/s {rate or 0:8.2f}  MFU agent "
                          f"{pct(eff.mfu):>6}  analytic {pct(analytic_mfu):>6}  GPM tensor "
                          f"{'n/a' if g.tensor_active is None else f'{g.tensor_active:.0f}%':>4}"
                          f"  SM {'n/a' if g.sm_active is None else f'{g.sm_active:.0f}%':>4}"
                          f"  clock {g.sm_clock_mhz or 0:.0f}/{g.sm_clock_max_mhz or 0:.0f} MHz"
                          f"  check {eff.tensor_note or eff.mfu_note or '-'}", flush=True)
                time.sleep(1.0)
        ok = abs(ratio - 1) <= 0.05
        mfus = [r[0] for r in rows if r[0] is not None]
        analytic_mfus = [r[1] for r in rows if r[1] is not None]
        bounds = [r[2] / 100 * (r[3] or 1) for r in rows if r[2] is not None]
        agree = [r[4] for r in rows if r[4] is not None]
        print(f"summary over {len(rows)} samples: MFU agent {pct(_median(mfus))}, analytic "
              f"{pct(_median(analytic_mfus))}, GPM tensor activity x clock ratio "
              f"{pct(_median(bounds))}; count/analytic {ratio:.4f} ({'ok' if ok else 'OFF'}, "
              f"limit 5%); cross-check agrees in {sum(agree)} of {len(agree)} samples")
        if mfus and bounds and _median(bounds):
            print(f"MFU / (tensor activity x clock ratio) = {_median(mfus) / _median(bounds):.3f}"
                  " (1.0: every active tensor cycle at the datasheet rate)")
        return 0 if ok else 1
    finally:
        job.kill()
        job.wait(30)


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


if __name__ == "__main__":
    sys.exit(main())
