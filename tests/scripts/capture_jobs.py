"""The training jobs that a default capture must handle: one script, a job per ``--kind``.

Used by the capture tests (tests/test_capture_bounded.py, tests/test_tui_capture.py) and by
benchmarks/bench_capture.py, so both measure the same jobs. Each is a tiny CPU model whose
cost sits in a known place of this file, so a test can check that the diagnosis names it:

- ``getitem``: ``__getitem__`` decodes every sample in pure Python (``decode_sample``),
  ``num_workers=0`` (``--workers``, ``--pin-memory`` vary it);
- ``compile``: the same input pipeline feeding a model under ``torch.compile``;
- ``slow``: one step every ``--step-s`` seconds, spent in the logging code (``log_metrics``);
- ``exits``: the ``getitem`` job that ends at the first step after ``--stop-file`` appears
  (a test creates it once the capture records), or after ``--exit-after`` steps.

It prints ``training <pid>`` once the first step is done and, with ``--step-log FILE``, one
line per step ``<step> <start> <end>`` (time.time()), so a benchmark can compare step times
during and outside a capture.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

FEATURES = 64


def _next_state(state: int) -> int:
    return (state * 1103515245 + 12345) % 2147483648


def _to_unit(state: int) -> float:
    return (state >> 16) / 32768.0 - 1.0


def decode_sample(index: int, work: int) -> list[float]:
    """A "decoder" written in Python: a few small function calls per value, as a parser makes."""
    values = [0.0] * FEATURES
    state = index * 2654435761 % 4294967296
    for i in range(work):
        state = _next_state(state)
        values[i % FEATURES] += _to_unit(state)
    return values


class PythonDataset(Dataset):
    """Samples decoded in Python: ``item_ms`` of pure-Python work each (calibrated once)."""

    def __init__(self, work: int, size: int = 1 << 20) -> None:
        self.work, self.size = work, size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        values = decode_sample(index, self.work)
        return torch.tensor(values), index % 4


def work_for(item_ms: float) -> int:
    """Iterations of ``decode_sample`` that take about ``item_ms`` on this machine."""
    n, t0 = 20000, time.perf_counter()
    decode_sample(0, n)
    took = max(1e-6, time.perf_counter() - t0)
    return max(1, int(n * item_ms / 1000.0 / took))


def log_metrics(step: int, loss: float, seconds: float) -> None:
    """Logging that costs: formats a report for ``seconds`` (stands in for a slow logger)."""
    end = time.perf_counter() + seconds
    lines = []
    while time.perf_counter() < end:
        lines.append(f"step {step} loss {loss:.6f} " + " ".join(str(i) for i in range(50)))
        if len(lines) > 1000:
            lines.clear()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--kind", choices=("getitem", "compile", "slow", "exits"), default="getitem")
    p.add_argument("--item-ms", type=float, default=2.0, help="Python time per sample")
    p.add_argument("--work", type=int, default=0,
                   help="decoder iterations per sample (default: --item-ms worth, measured)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--pin-memory", action="store_true")
    p.add_argument("--step-s", type=float, default=2.0, help="--kind slow: seconds per step")
    p.add_argument("--exit-after", type=int, default=0, help="--kind exits: steps in all")
    p.add_argument("--stop-file", default=None, help="--kind exits: end once this exists")
    p.add_argument("--seconds", type=float, default=900.0, help="run at most this long")
    p.add_argument("--step-log", default=None)
    p.add_argument("--device", default="cpu", help="cuda: the same jobs on a GPU "
                   "(benchmarks/bench_capture.py --device cuda)")
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    device = torch.device(args.device)
    model: nn.Module = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(),
                                     nn.Linear(32, 4)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if args.kind == "compile":
        model = torch.compile(model)
    item_ms = 0.0 if args.kind == "slow" else args.item_ms
    work = args.work or (work_for(item_ms) if item_ms else 0)
    loader = DataLoader(PythonDataset(work),
                        batch_size=args.batch_size, num_workers=args.workers,
                        pin_memory=args.pin_memory, persistent_workers=args.workers > 0)
    log = open(args.step_log, "a", buffering=1) if args.step_log else None  # noqa: SIM115
    end = time.monotonic() + args.seconds
    step, started = 0, time.time()
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        if args.kind == "slow":
            log_metrics(step, float(loss.detach()), max(0.0, args.step_s - (time.time() - started)))
        opt.step()
        step += 1
        now = time.time()
        if log is not None:
            log.write(f"{step} {started:.6f} {now:.6f}\n")
        started = now
        if step == 1:
            print(f"training {os.getpid()}", flush=True)
        if args.kind == "exits" and ((args.exit_after and step >= args.exit_after) or (
                args.stop_file and os.path.exists(args.stop_file))):
            break
        if time.monotonic() > end:
            break
    print("finished", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
