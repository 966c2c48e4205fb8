"""A small gloo (CPU) job for the hang tests and benchmark, launched by torchrun.

Every step: a small model's forward and backward, ``--collectives`` all_reduce calls of a small
tensor, an optimizer step, and ``--step-ms`` of sleep (a light job on a shared machine). At
step ``--at`` the ``--rank`` rank does the ``--scenario``:

* ``sleep``: sleeps forever before the step's first all_reduce (the others wait in it);
* ``spin``: spins in a pure-Python loop that holds the GIL (its switch interval made huge, so
  no other thread of it, the agent's included, ever runs again);
* ``desync``: calls all_gather where the others call all_reduce;
* ``keeper``: nothing happens at ``--at``; each rank forks a child after the process group is
  made that keeps its sockets open (as DataLoader workers forked after init do), so a rank
  killed from outside leaves the others waiting in their next collective, as NCCL's peers do
  (gloo's would see the connection close and fail at once). The child leaves with the
  launcher;
* ``checkpoint``: every ``--at`` steps, every rank (``--rank`` ignored) writes a checkpoint
  with torch.save that takes ``--checkpoint-s`` seconds, then training goes on.

Prints "rank R training" after the first step, and "rank R at N" when it reaches ``--at``.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn


class SlowFile(io.RawIOBase):
    """A file whose writes take ``seconds`` in all: a checkpoint to slow storage."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        time.sleep(min(0.2, max(0.0, self.deadline - time.monotonic())))
        return len(data)


def keep_sockets() -> None:
    """Fork a child that holds this rank's sockets open as long as the launcher lives."""
    launcher = os.getppid()
    if os.fork() == 0:
        while True:
            try:
                os.kill(launcher, 0)
            except ProcessLookupError:
                os._exit(0)
            time.sleep(0.5)


def spin_forever() -> None:
    sys.setswitchinterval(1e6)  # no other thread gets the GIL back
    n = 0
    while True:
        n += 1  # HANG-SPIN


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--scenario", choices=("none", "sleep", "spin", "desync", "checkpoint", "keeper"),
                   default="none")
    p.add_argument("--rank", type=int, default=-1)
    p.add_argument("--at", type=int, default=20, help="the step of the scenario")
    p.add_argument("--collectives", type=int, default=2, help="all_reduce calls per step")
    p.add_argument("--step-ms", type=float, default=20.0)
    p.add_argument("--checkpoint-s", type=float, default=20.0)
    p.add_argument("--steps", type=int, default=0, help="0 = until killed")
    p.add_argument("--device", default="cpu", help="cpu, or cuda (every rank on cuda:LOCAL_RANK "
                   "modulo the cards there are; gloo all-reduces CUDA tensors too)")
    args = p.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if args.scenario == "keeper":
        keep_sockets()
    torch.manual_seed(0)
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))
                              % torch.cuda.device_count())
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    grad = torch.zeros(1024, device=device)
    step = 0
    while args.steps == 0 or step < args.steps:
        loss = model(torch.randn(16, 64, device=device)).square().mean()
        loss.backward()
        if args.scenario == "checkpoint" and step and step % args.at == 0:
            torch.save(model.state_dict(), SlowFile(args.checkpoint_s))
        if step == args.at:
            print(f"rank {rank} at {step}", flush=True)
            if rank == args.rank and args.scenario == "sleep":
                time.sleep(1e6)  # HANG-SLEEP
            elif rank == args.rank and args.scenario == "spin":
                spin_forever()
            elif rank == args.rank and args.scenario == "desync":
                out = [torch.zeros(1024, device=device) for _ in range(dist.get_world_size())]
                dist.all_gather(out, grad)  # HANG-DESYNC
        for _ in range(args.collectives):
            dist.all_reduce(grad)
        opt.step()
        opt.zero_grad()
        step += 1
        if step == 1:
            print(f"rank {rank} training", flush=True)
        time.sleep(args.step_ms / 1000)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
