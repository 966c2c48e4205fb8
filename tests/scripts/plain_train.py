"""A plain CPU training job: no gputop agent, not started with `gputop run`, nothing of gputop
imported. Its time goes into one named pure-Python function, so a sampler from outside has a
known answer:

* ``--hot loader``: the DataLoader's ``__getitem__`` calls ``decode_sample`` (num_workers=0 by
  default, so in the training process; with ``--workers N`` in the workers);
* ``--hot loop``: the training loop calls ``update_running_metrics`` after every step.

The lines marked ``# hot: NAME`` are the ones that function spends its time on; the tests read
them from this file. Prints "training" once the first batch is done; runs ``--seconds`` at most.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


def decode_sample(seconds: float) -> int:
    """A "heavy transform": pure Python, so the sampled frame is this function itself."""
    x = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:  # hot: decode_sample
        x = (x * 1103515245 + 12345) & 0xFFFFFFFF  # hot: decode_sample
    return x


def update_running_metrics(seconds: float) -> int:
    """Slow per-step bookkeeping in the main loop."""
    x = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:  # hot: update_running_metrics
        x = (x * 22695477 + 1) & 0xFFFFFFFF  # hot: update_running_metrics
    return x


class SlowDataset(Dataset):
    def __init__(self, item_s: float) -> None:
        self.item_s = item_s

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        decode_sample(self.item_s)
        return torch.full((64,), float(index % 7)), index % 4


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--hot", choices=("loader", "loop"), default="loader")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--item-ms", type=float, default=5.0)
    p.add_argument("--loop-ms", type=float, default=50.0)
    p.add_argument("--seconds", type=float, default=600.0)
    args = p.parse_args()
    torch.set_num_threads(1)
    item_s = args.item_ms / 1000 if args.hot == "loader" else 0.0
    loader = DataLoader(SlowDataset(item_s), batch_size=8, num_workers=args.workers,
                        persistent_workers=args.workers > 0)
    model = nn.Linear(64, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    stop_at = time.monotonic() + args.seconds
    announced = False
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if args.hot == "loop":
            update_running_metrics(args.loop_ms / 1000)
        if not announced:
            print(f"pid {os.getpid()} training", flush=True)
            announced = True
        if time.monotonic() > stop_at:
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
