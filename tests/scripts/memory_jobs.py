"""Real training jobs with a known memory behaviour, for the memory captures' tests and
benchmarks (run under `gputop run`, so with the agent):

* ``grow``: an MLP step that also keeps a new tensor every step (``--grow-mib`` MiB) in a list,
  up to ``--max-mib`` (then it trains on without keeping more): the growth by line must name
  the appending line (``APPEND_LINE``) and the bytes per step;
* ``activations``: a deep, narrow MLP on a large batch: its activations outweigh its
  parameters, gradients and Adam's state at the step's peak;
* ``oom``: the ``grow`` job under an address-space limit (RLIMIT_AS) it sets itself, a little
  above what it holds after start-up: it keeps growing until a real allocation fails in the
  CPU allocator, and dies of it;
* ``raise-oom``: raises ``torch.OutOfMemoryError`` itself after a few steps (what CUDA's
  allocator raises), uncaught.

``--device cuda`` runs the same on a GPU (benchmarks/gpu/memory_check.py); on CUDA, ``oom``
caps the process's share of the GPU with ``torch.cuda.set_per_process_memory_fraction``
(``--fraction``) instead of the address space, so it fails fast and harms nothing else. Prints
``training`` once the loop runs; ``--step-log FILE`` writes ``<step> <start> <end>``
(time.time()) per step, for benchmarks/bench_memory.py.
"""

from __future__ import annotations

import argparse
import resource
import time

import torch
from torch import nn

history: list[torch.Tensor] = []  # what the grow job keeps


def keep(step: int, mib: float, device: str) -> None:
    history.append(torch.full((int(mib * (1 << 20)) // 4,), float(step), device=device))  # APPEND


APPEND_LINE = next(i for i, line in enumerate(open(__file__), 1) if line.rstrip().endswith(
    "# APPEND"))


def model_for(kind: str, device: str) -> tuple[nn.Module, torch.Tensor]:
    if kind == "activations":
        layers = [nn.Linear(64, 64) for _ in range(12)]
        return nn.Sequential(*layers).to(device), torch.randn(4096, 64, device=device)
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8)).to(device), \
        torch.randn(32, 64, device=device)


def limit_address_space(extra_mib: int) -> None:
    with open("/proc/self/status") as f:
        size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    limit = size + (extra_mib << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=("grow", "activations", "oom", "raise-oom"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--grow-mib", type=float, default=1.0)
    parser.add_argument("--max-mib", type=float, default=512.0,
                        help="grow: stop keeping tensors beyond this much")
    parser.add_argument("--step-ms", type=float, default=50.0)
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--headroom-mib", type=int, default=384,
                        help="oom: address space allowed beyond start-up")
    parser.add_argument("--fraction", type=float, default=0.02,
                        help="oom on CUDA: the share of the GPU's memory the process may use")
    parser.add_argument("--step-log", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    model, x = model_for(args.kind, args.device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    if args.kind == "oom" and args.device.startswith("cuda"):
        torch.cuda.set_per_process_memory_fraction(args.fraction)
    elif args.kind == "oom":
        limit_address_space(args.headroom_mib)
    log = open(args.step_log, "a", buffering=1) if args.step_log else None
    print("training", flush=True)
    end = time.monotonic() + args.seconds
    step = 0
    while time.monotonic() < end:
        started = time.monotonic()
        opt.zero_grad()
        model(x).float().pow(2).mean().backward()
        opt.step()
        step += 1
        if args.kind == "oom" or (args.kind == "grow"
                                  and len(history) * args.grow_mib < args.max_mib):
            keep(step, args.grow_mib, args.device)
        if args.kind == "raise-oom" and step == 20:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        time.sleep(max(0.0, args.step_ms / 1000 - (time.monotonic() - started)))
        if log is not None:
            now = time.time()
            log.write(f"{step} {now - (time.monotonic() - started)} {now}\n")


if __name__ == "__main__":
    main()
