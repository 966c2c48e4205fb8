"""A small DistributedDataParallel job on gloo (CPU), launched by torchrun, for the job tests.

Every rank trains the same small model on its own shard; DDP's all-reduce keeps the ranks in
lockstep, so one rank whose DataLoader is slow (``--slow-rank R --slow-ms M``: a sleep in its
``__getitem__``) holds every other rank back in the all-reduce. ``--sample-ms`` gives every
rank the same wait per sample (reading from storage): four ranks on a small machine then do not
all compete for the CPU all the time. Runs until killed (or
``--steps``); prints "rank R training" once the first step is done.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset


class Samples(Dataset):
    def __init__(self, rank: int, slow_s: float) -> None:
        self.rank, self.slow_s = rank, slow_s

    def __len__(self) -> int:
        return 1 << 20

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if self.slow_s:
            time.sleep(self.slow_s)  # this rank's input pipeline is the slow one
        g = torch.Generator().manual_seed(self.rank * 1_000_003 + index)
        return torch.randn(256, generator=g), int(torch.randint(0, 8, (1,), generator=g))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=0, help="0 = until killed")
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-ms", type=float, default=0.0, help="per sample, on --slow-rank")
    p.add_argument("--sample-ms", type=float, default=0.0,
                   help="per sample on every rank (reading from storage, say)")
    p.add_argument("--batch-size", type=int, default=8)
    args = p.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(
        nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                      nn.Linear(512, 8)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    slow_s = (args.slow_ms if rank == args.slow_rank else args.sample_ms) / 1000
    loader = DataLoader(Samples(rank, slow_s), batch_size=args.batch_size, num_workers=0)
    step = 0
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if step == 1:
            print(f"rank {rank} pid {os.getpid()} training", flush=True)
        if args.steps and step >= args.steps:
            break
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
