"""One small CPU training job profiled with torch.profiler, its DataLoader slowed or not: the
two real traces of tests/test_analyze_compare.py (tests/data/compare/).

    python tests/scripts/compare_job.py OUT_DIR ITEM_MS

ITEM_MS: milliseconds each sample takes to load (a sleep in the dataset, num_workers=0: the
input-bound run); 0 for the run with the DataLoader fixed. The same model, batch and steps
otherwise. Re-record: python tests/scripts/compare_job.py tests/data/compare/input_bound 4;
python tests/scripts/compare_job.py tests/data/compare/fixed 0.
"""

from __future__ import annotations

import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Samples(Dataset):
    def __init__(self, item_ms: float) -> None:
        self.item_s = item_ms / 1000

    def __len__(self) -> int:
        return 1 << 16

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.item_s:
            time.sleep(self.item_s)
        g = torch.Generator().manual_seed(index)
        return torch.randn(64, generator=g), torch.randn(16, generator=g)


def main() -> None:
    out, item_ms = sys.argv[1], float(sys.argv[2])
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 16))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = iter(DataLoader(Samples(item_ms), batch_size=8, num_workers=0))
    sched = torch.profiler.schedule(wait=1, warmup=1, active=3, repeat=1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                schedule=sched,
                                on_trace_ready=torch.profiler.tensorboard_trace_handler(
                                    out, worker_name="worker0", use_gzip=True)) as prof:
        for _ in range(5):
            x, y = next(loader)
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            prof.step()


if __name__ == "__main__":
    main()
