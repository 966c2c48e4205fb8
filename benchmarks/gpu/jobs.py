"""Training jobs with one known problem each, for running gputop against a real GPU.

``python benchmarks/gpu/jobs.py CASE --seconds S`` trains for about S seconds on CUDA when there
is a GPU (else on the CPU, so the script itself can be tried anywhere) and exits. Each case has
one problem, named in ``CASES`` with the live finding and the trace finding a right diagnosis
gives (``benchmarks/gpu/LABELS.md`` says the same for the recordings made of them).

Run them through ``benchmarks/gpu/run_real_jobs.sh``, which starts each under ``gputop run``
beside ``gputop record`` and ``gputop watch``, and captures a trace of each with ``gputop
capture``.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

# case -> (what the job does, the right live finding, the right trace finding)
CASES: dict[str, tuple[str, str, str]] = {
    "healthy": ("ResNet-18, bf16 autocast, channels_last, batch 256 of 3x128x128 already on "
                "the GPU, SGD foreach", "none (launch-bound at most)", "healthy or launch-bound"),
    "starved": ("ResNet-18, batch 64 of 3x64x64 from a DataLoader with num_workers=0 whose "
                "__getitem__ burns 1 ms of Python per sample", "dataloader-stall",
                "dataloader-stall"),
    "hostbound": ("ResNet-18 as healthy at batch 32, then 15 ms of per-step Python "
                  "bookkeeping (no DataLoader, no sync)", "host-bound", "gpu-idle / host work"),
    "pcie": ("copies 1 GiB from pinned host memory to the GPU every step, then a small "
             "matmul", "pcie-bound", "copy-bound"),
    "tinykernels": ("40 Linear(64, 64) layers with ReLU, batch 32, no fusion", "launch-bound",
                    "launch-bound"),
    "leak": ("ResNet-18 batch 64; every step keeps a new 64 MiB tensor, then sleeps 50 ms",
             "memory-growth", "memory"),
    "sync": ("ResNet-18 batch 128 on GPU data; after each step loss.item(), then 5 ms of "
             "Python that uses the value (would overlap the GPU without the .item())",
             "host-sync", "host-sync"),
}


def _device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def _resnet(num_classes: int = 100) -> nn.Module:
    try:
        from torchvision.models import resnet18
    except ImportError:  # the CPU here has no torchvision: a small stand-in of the same shape
        return nn.Sequential(
            nn.Conv2d(3, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, num_classes))
    return resnet18(num_classes=num_classes)


class SlowDataset(Dataset):
    """Each sample burns ``python_ms`` of pure Python: a decode written in Python."""

    def __init__(self, n: int, shape: tuple[int, ...], python_ms: float) -> None:
        self.n, self.shape, self.python_ms = n, shape, python_ms

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        end = time.perf_counter() + self.python_ms / 1000.0
        acc = 0
        while time.perf_counter() < end:  # the Python decode
            acc += i * 7 % 13
        return torch.randn(self.shape), i % 100


def _bookkeeping(ms: float, value: float = 0.0) -> float:
    """Per-step Python work: metrics, logging, schedules."""
    end = time.perf_counter() + ms / 1000.0
    acc = value
    while time.perf_counter() < end:
        acc = acc * 0.5 + 1.0
    return acc


def _train_step(model, opt, x, y, dev) -> torch.Tensor:
    opt.zero_grad(set_to_none=True)
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
        loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss


def _vision(dev: torch.device, batch: int, side: int):
    model = _resnet().to(dev).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, foreach=True)
    x = torch.randn(batch, 3, side, side, device=dev).to(memory_format=torch.channels_last)
    y = torch.randint(0, 100, (batch,), device=dev)
    return model, opt, x, y


def run(case: str, seconds: float) -> int:
    dev = _device()
    end = time.monotonic() + seconds
    steps = 0
    if case in ("healthy", "hostbound", "sync"):
        batch = {"healthy": 256, "hostbound": 32, "sync": 128}[case]
        model, opt, x, y = _vision(dev, batch, 128 if case == "healthy" else 96)
        while time.monotonic() < end:
            loss = _train_step(model, opt, x, y, dev)
            if case == "hostbound":
                _bookkeeping(15.0)
            elif case == "sync":
                _bookkeeping(5.0, loss.item())
            steps += 1
    elif case in ("starved", "leak"):
        model, opt, _, _ = _vision(dev, 64, 64)
        if case == "starved":
            data = DataLoader(SlowDataset(1 << 30, (3, 64, 64), 1.0), batch_size=64,
                              num_workers=0)
        else:
            data = DataLoader(SlowDataset(1 << 30, (3, 64, 64), 0.0), batch_size=64,
                              num_workers=2)
        kept = []
        for x, y in data:
            x = x.to(dev, non_blocking=True).to(memory_format=torch.channels_last)
            _train_step(model, opt, x, y.to(dev), dev)
            if case == "leak":
                kept.append(torch.empty(64 << 20, dtype=torch.uint8, device=dev))
                time.sleep(0.05)
            steps += 1
            if time.monotonic() >= end:
                break
    elif case == "pcie":
        size = (1 << 30) if dev.type == "cuda" else (1 << 24)
        host = torch.empty(size, dtype=torch.uint8).pin_memory() if dev.type == "cuda" \
            else torch.empty(size, dtype=torch.uint8)
        w = torch.randn(1024, 1024, device=dev, requires_grad=True)
        opt = torch.optim.SGD([w], lr=0.01)
        while time.monotonic() < end:
            on_gpu = host.to(dev, non_blocking=True)
            x = on_gpu[: 1024 * 1024 * 4].view(torch.float32).view(1024, 1024)
            opt.zero_grad(set_to_none=True)
            (x @ w).square().mean().backward()
            opt.step()
            steps += 1
    elif case == "tinykernels":
        layers: list[nn.Module] = []
        for _ in range(40):
            layers += [nn.Linear(64, 64), nn.ReLU()]
        model = nn.Sequential(*layers).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.randn(32, 64, device=dev)
        while time.monotonic() < end:
            opt.zero_grad(set_to_none=True)
            model(x).square().mean().backward()
            opt.step()
            steps += 1
    else:
        print(f"jobs.py: unknown case {case!r}; one of {', '.join(CASES)}", file=sys.stderr)
        return 2
    if dev.type == "cuda":
        torch.cuda.synchronize()
    print(f"jobs.py: {case} on {dev.type}: {steps} steps in {seconds:.0f} s", file=sys.stderr)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("case", choices=sorted(CASES))
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    return run(args.case, args.seconds)


if __name__ == "__main__":
    sys.exit(main())
