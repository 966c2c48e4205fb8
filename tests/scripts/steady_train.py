"""A tiny CPU training loop with a steady step time, for recordings and baseline checks.

Steps follow a fixed schedule of one per ``--step-ms`` (the sleep stands in for GPU work around a
real optimizer step), so two runs have the same step rate even on a busy machine, and
``--slowdown 0.3`` makes every step 30 % longer. The baseline tests rely on that steadiness.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--step-ms", type=float, default=40.0)
    parser.add_argument("--slowdown", type=float, default=0.0, help="e.g. 0.2: 20%% slower steps")
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 16), torch.randn(32, 4)
    pause = args.step_ms / 1000 * (1 + args.slowdown)
    start = time.monotonic()
    end = start + args.seconds
    print("training", flush=True)
    step = 0
    while time.monotonic() < end:
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        step += 1
        time.sleep(max(0.0, start + step * pause - time.monotonic()))
        opt.step()


if __name__ == "__main__":
    main()
