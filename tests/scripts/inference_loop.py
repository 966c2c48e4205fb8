"""A CPU inference loop: forward passes only, no optimizer step, until killed or --seconds."""

from __future__ import annotations

import argparse
import os
import time

import torch
from torch import nn


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=0.0, help="0 = run until killed")
    args = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)).eval()
    x = torch.randn(32, 256)
    print(f"pid {os.getpid()} inference", flush=True)
    end = time.monotonic() + args.seconds
    with torch.no_grad():
        while not args.seconds or time.monotonic() < end:
            model(x)
            time.sleep(0.002)


if __name__ == "__main__":
    main()
