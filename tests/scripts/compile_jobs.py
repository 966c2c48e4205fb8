"""Small torch.compile training jobs on the CPU, each with one compile problem (or none).

    python compile_jobs.py CASE [--backend eager|aot_eager|inductor] [--seconds S]

CASE: ``batch`` (the batch size changes every ``--change-every`` steps: recompiles),
``item`` (``.item()`` in forward: a graph break), ``branch`` (a Python ``if`` on a tensor
value: a graph break), ``limit`` (changing sizes with ``recompile_limit`` set to 2: the limit
is hit and forward runs eager), ``healthy`` (fixed shapes, nothing to say after warm-up).
Prints "training" after its first step, then trains until ``--seconds`` have passed.
"""

from __future__ import annotations

import argparse
import sys
import time

CASES = ("batch", "item", "branch", "limit", "healthy")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("case", choices=CASES)
    parser.add_argument("--backend", default="eager")
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--change-every", type=int, default=10)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--mode", default=None)
    args = parser.parse_args()

    import torch
    from torch import nn

    torch.manual_seed(0)
    torch.set_num_threads(1)
    if args.case == "limit":
        torch._dynamo.config.recompile_limit = 2
    # torch 2.6+ remembers which sizes changed in an earlier run (profile-guided automatic
    # dynamic, in the cache directory) and starts them dynamic: every run starts afresh here.
    if hasattr(torch._dynamo.config, "automatic_dynamic_local_pgo"):
        torch._dynamo.config.automatic_dynamic_local_pgo = False

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(16, 32)
            self.b = nn.Linear(32, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.relu(self.a(x))
            if args.case == "item":
                scale = h.abs().max().item()  # ITEM-LINE
                h = h / (scale + 1.0)
            if args.case == "branch":
                if h.mean() > 0:  # BRANCH-LINE
                    h = h * 2
            return self.b(h)

    model = Net().to(args.device)
    # Fixed shapes are compiled once; the cases that change sizes ask for static shapes, so each
    # new size is a recompile (dynamic=None would recompile once, then go dynamic).
    dynamic = False if args.case in ("batch", "limit") else None
    compiled = torch.compile(model, backend=args.backend, dynamic=dynamic, mode=args.mode)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    sizes = [32, 17, 24, 9, 28, 13] if args.case in ("batch", "limit") else [32]
    end = time.monotonic() + args.seconds
    step = 0
    while time.monotonic() < end:
        batch = sizes[(step // args.change_every) % len(sizes)]
        x = torch.randn(batch, 16, device=args.device)
        loss = compiled(x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if step == 1:
            print("training", flush=True)
        time.sleep(args.step_ms / 1000)
    return 0


if __name__ == "__main__":
    sys.exit(main())
