"""What sampling Python stacks from outside (`gputop stacks`, `p` without the agent, the
findings' where lines) costs the sampled training process.

    python benchmarks/bench_stacks.py [--rounds 12] [--seconds 3] [--rate 100]

A child process runs a small CPU training loop (an MLP fed by an in-memory DataLoader, one
intra-op thread; no agent, nothing of gputop) in blocks of steps. Each round runs three
blocks, in an order that rotates every round, so machine noise and drift hit all alike:

- "sampled": while gputop samples the child exactly as `gputop stacks PID` does (two
  `py-spy record --nonblocking` side by side at the default rate, then `py-spy dump`);
- "plain": nothing samples it;
- "control": nothing samples it either (the method's own noise floor).

It prints the ratio of the median step time sampled / plain (and control / plain) per round,
their median over the rounds, the CPU py-spy itself used, and how long one sampling of the
TUI's length (2 s) takes from start to report.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


# --- child: the training loop ----------------------------------------------------------------


def child_main() -> None:
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    data = TensorDataset(torch.randn(4096, 512), torch.randint(0, 10, (4096,)))
    loader = DataLoader(data, batch_size=64, shuffle=True)
    batches = iter(loader)

    def step() -> None:
        nonlocal batches
        try:
            x, y = next(batches)
        except StopIteration:
            batches = iter(loader)
            x, y = next(batches)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    for _ in range(100):  # warm up allocator and caches
        step()
    print(json.dumps({"ready": os.getpid()}), flush=True)
    for line in sys.stdin:
        seconds = json.loads(line)["seconds"]
        times = []
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        print(json.dumps({"times": times}), flush=True)


# --- parent ----------------------------------------------------------------------------------


class Child:
    def __init__(self) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
        self.proc = subprocess.Popen([sys.executable, __file__, "--child"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        self.pid = json.loads(self.proc.stdout.readline())["ready"]

    def block(self, seconds: float) -> list[float]:
        self.proc.stdin.write(json.dumps({"seconds": seconds}) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())["times"]

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def timed_sampling(sample_stacks, pid: int, seconds: int, rate: int, into: dict) -> None:
    t0 = time.perf_counter()
    into["report"] = sample_stacks(pid, seconds, rate)
    into["wall"] = time.perf_counter() - t0


def children_cpu() -> float:
    usage = os.times()
    return usage.children_user + usage.children_system


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--seconds", type=int, default=3, help="sampling length (default 3, "
                        "`gputop stacks`' default)")
    parser.add_argument("--rate", type=int, default=None, help="samples/s (default: gputop's)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_main()
        return 0

    from gputop.stacks.pyspy import DEFAULT_RATE, sample_stacks

    rate = args.rate or DEFAULT_RATE
    # The block runs inside the sampling window: py-spy needs a moment to start (it reads the
    # process's maps and finds the interpreter) and the dumps come after it.
    lead = 0.4
    block_s = max(0.5, args.seconds - 2 * lead)
    child = Child()
    ratios, controls, spy_cpu, walls = [], [], [], []
    try:
        print(f"child pid {child.pid}; {args.rounds} rounds; blocks of {block_s:.1f} s; "
              f"sampling {args.seconds} s at {rate} samples/s per thread", flush=True)
        for r in range(args.rounds):
            medians: dict[str, float] = {}
            order = ["sampled", "plain", "control"]
            order = order[r % 3:] + order[: r % 3]
            for kind in order:
                if kind != "sampled":
                    medians[kind] = statistics.median(child.block(block_s))
                    continue
                done: dict = {}
                cpu0 = children_cpu()
                sampler = threading.Thread(target=timed_sampling,
                                           args=(sample_stacks, child.pid, args.seconds, rate,
                                                 done))
                sampler.start()
                time.sleep(lead)
                medians[kind] = statistics.median(child.block(block_s))
                sampler.join()
                spy_cpu.append(children_cpu() - cpu0)
                walls.append(done["wall"])
                assert done["report"].main is not None and done["report"].main.samples > 0
            ratios.append(medians["sampled"] / medians["plain"])
            controls.append(medians["control"] / medians["plain"])
            print(f"round {r + 1:2d}: step {medians['plain'] * 1000:6.2f} ms plain, "
                  f"{medians['sampled'] * 1000:6.2f} ms sampled (x{ratios[-1]:.3f}), "
                  f"control x{controls[-1]:.3f}", flush=True)
        # One sampling as long as the TUI's `p` and the where lines use: start to report.
        tui = []
        for _ in range(3):
            t0 = time.perf_counter()
            sample_stacks(child.pid, 2, rate)
            tui.append(time.perf_counter() - t0)
    finally:
        child.close()
    print()
    print(f"step time sampled / plain: median x{statistics.median(ratios):.3f} "
          f"(mean x{statistics.fmean(ratios):.3f}, range x{min(ratios):.3f}-x{max(ratios):.3f})")
    print(f"control / plain (noise):   median x{statistics.median(controls):.3f} "
          f"(range x{min(controls):.3f}-x{max(controls):.3f})")
    print(f"py-spy CPU per {args.seconds} s sampling: median {statistics.median(spy_cpu):.2f} s "
          f"({statistics.median(spy_cpu) / args.seconds * 100:.1f} % of one core while it "
          f"samples); wall {statistics.median(walls):.2f} s")
    print(f"a 2 s sampling (the TUI's p, the where lines), start to report: median "
          f"{statistics.median(tui):.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
