"""Another user's CPU training job with the gputop agent: started by root under
`GPUTOP_AGENT=0 gputop run -- python foreign_train.py --uid 65534`, it imports what it needs,
becomes that user, then loads the agent, whose socket is then that user's own
(/tmp/gputop-<uid>/). The interpreter and its standard library are root's to read here, so the
imports come before the uid changes; the training loop is steady_train.py's.

Prints "training" once the agent listens.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
import time

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import gputop.agent  # noqa: E402

for module in pkgutil.walk_packages(gputop.agent.__path__, "gputop.agent."):
    try:
        importlib.import_module(module.name)  # nothing left to read from root's files later
    except ImportError:
        pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--uid", type=int, required=True)
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--seconds", type=float, default=600.0)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 16), torch.randn(32, 4)
    for _ in range(2):  # one step before the uid changes: torch imports more on the first
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    os.setgroups([])
    os.setgid(args.uid)
    os.setuid(args.uid)
    os.environ["HOME"] = "/tmp"
    gputop.agent.install()
    problem = gputop.agent.problem()
    if problem:
        raise SystemExit(f"foreign_train: agent not loaded: {problem}")
    pause = args.step_ms / 1000
    start = time.monotonic()
    print("training", flush=True)
    step = 0
    while time.monotonic() < start + args.seconds:
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        step += 1
        time.sleep(max(0.0, start + step * pause - time.monotonic()))
        opt.step()


if __name__ == "__main__":
    main()
