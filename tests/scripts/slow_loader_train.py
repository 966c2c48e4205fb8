"""A small, deterministic CPU training loop whose DataLoader is the bottleneck.

num_workers=0 and a per-sample transform that takes a few milliseconds (CPU work or a sleep),
so most of each step is spent in the loader's ``__next__``. Used by the agent tests as the
"training process"; the loss of every step is printed (as float.hex) with --print-loss so runs
can be compared bit for bit.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class SlowDataset(Dataset):
    """Deterministic samples (seeded per index) behind a deliberately slow transform."""

    def __init__(self, seed: int, item_ms: float, cpu: bool, size: int = 1 << 20) -> None:
        self.seed, self.item_s, self.cpu, self.size = seed, item_ms / 1000, cpu, size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        x = torch.randn(3, 16, 16, generator=g)
        if self.cpu:
            end = time.perf_counter() + self.item_s
            while time.perf_counter() < end:  # a "heavy transform": burn CPU for item_ms
                x = torch.tanh(x @ x.transpose(1, 2) / 16.0)
            x = torch.randn(3, 16, 16, generator=g)  # keep the data independent of timing
        elif self.item_s:
            time.sleep(self.item_s)
        return x.flatten(), int(torch.randint(0, 4, (1,), generator=g))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20, help="0 = run until killed")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--item-ms", type=float, default=4.0)
    p.add_argument("--cpu-transform", action="store_true")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--optimizers", type=int, default=1, choices=(1, 2))
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--start-method", default=None)
    p.add_argument("--print-loss", action="store_true")
    p.add_argument("--install-agent", action="store_true")
    p.add_argument("--exit-code", type=int, default=0)
    args = p.parse_args()

    if args.install_agent:
        import gputop.agent

        gputop.agent.install()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(768, 64), nn.ReLU(), nn.Linear(64, 4))
    head, tail = list(model[0].parameters()), list(model[2].parameters())
    if args.optimizers == 2:  # e.g. separate optimizers for two parts of a model
        optimizers = [torch.optim.SGD(head, lr=0.05), torch.optim.Adam(tail, lr=0.01)]
    else:
        optimizers = [torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)]
    loader = DataLoader(
        SlowDataset(args.seed, args.item_ms, args.cpu_transform),
        batch_size=args.batch_size,
        num_workers=args.workers,
        multiprocessing_context=args.start_method if args.workers else None,
        persistent_workers=args.workers > 0,
    )
    print(f"pid {os.getpid()} training", flush=True)
    step = 0
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        for opt in optimizers:
            opt.zero_grad()
        loss.backward()
        for opt in optimizers:
            opt.step()
        step += 1
        if args.print_loss:
            print(f"loss {step} {loss.item().hex()}", flush=True)
        if args.steps and step >= args.steps:
            break
    print("finished", flush=True)
    return args.exit_code


if __name__ == "__main__":
    sys.exit(main())
