"""Plain torch.profiler traces of CUDA steps with one known shape each, for the trace engine.

``python benchmarks/gpu/traces.py OUTDIR [CASE ...]`` writes ``OUTDIR/CASE.pt.trace.json.gz``
for each case (all by default). On a machine without CUDA it says so and exits 1.

* ``copy_h2d``: every step copies 1 GiB from pinned host memory, then a small matmul: the step
  is bounded by host-to-device copies (right verdict: copy-bound).
* ``copy_d2h``: every step runs a matmul, then reads a 512 MiB result back to pinned host
  memory (right verdict: copy-bound, device-to-host).
* ``final_read``: a busy GPU (large matmuls) whose window ends with ``out.cpu()`` of the
  output: the wait overlaps busy device time and precedes no launch (right verdict: no
  host-sync; the GPU is busy).
* ``compiled``: 40 tiny Linear layers under ``torch.compile``: the launch path runs inside
  Inductor's generated wrapper (right verdict: launch-bound).
"""

from __future__ import annotations

import gzip
import os
import shutil
import sys
import time

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule


def _export(prof, path: str) -> None:
    raw = path[: -len(".gz")]
    prof.export_chrome_trace(raw)
    with open(raw, "rb") as src, gzip.open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    os.remove(raw)


def _profiled(path: str, step, steps: int = 4, warmup: int = 2) -> None:
    sched = schedule(wait=0, warmup=warmup, active=steps, repeat=1)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                 schedule=sched) as prof:
        for _ in range(warmup + steps):
            step()
            prof.step()
    _export(prof, path)


def copy_h2d(path: str) -> None:
    host = torch.empty(1 << 30, dtype=torch.uint8).pin_memory()
    w = torch.randn(1024, 1024, device="cuda", requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.01)

    def step() -> None:
        x = host.to("cuda", non_blocking=True)[: 4 << 20].view(torch.float32).view(1024, 1024)
        opt.zero_grad(set_to_none=True)
        (x @ w).square().mean().backward()
        opt.step()

    _profiled(path, step)


def copy_d2h(path: str) -> None:
    a = torch.randn(8192, 8192, device="cuda")
    out = torch.empty(8192 * 2, 8192, dtype=torch.float32).pin_memory()

    def step() -> None:
        b = torch.cat([a @ a, a])
        out.copy_(b, non_blocking=True)
        torch.cuda.synchronize()

    _profiled(path, step)


def final_read(path: str) -> None:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    sched = schedule(wait=0, warmup=1, active=3, repeat=1)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                 schedule=sched) as prof:
        out = a
        for _ in range(4):
            for _ in range(40):
                out = (out @ a).clamp_(-1, 1)
            prof.step()
        out.float().cpu()  # the end-of-window read: the host waits on a busy GPU
    _export(prof, path)


def compiled(path: str) -> None:
    layers: list[nn.Module] = []
    for _ in range(40):
        layers += [nn.Linear(64, 64), nn.ReLU()]
    model = torch.compile(nn.Sequential(*layers).cuda())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 64, device="cuda")

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()

    for _ in range(3):  # compile outside the window
        step()
    torch.cuda.synchronize()
    _profiled(path, step, steps=5)


CASES = {"copy_h2d": copy_h2d, "copy_d2h": copy_d2h, "final_read": final_read,
         "compiled": compiled}


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("traces.py: no CUDA device here", file=sys.stderr)
        return 1
    out, names = argv[0], argv[1:] or list(CASES)
    os.makedirs(out, exist_ok=True)
    for name in names:
        start = time.monotonic()
        try:
            CASES[name](os.path.join(out, f"{name}.pt.trace.json.gz"))
            print(f"traces.py: {name} in {time.monotonic() - start:.1f} s", file=sys.stderr)
        except Exception as exc:  # one case failing must not lose the others
            print(f"traces.py: {name} failed: {exc!r}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
