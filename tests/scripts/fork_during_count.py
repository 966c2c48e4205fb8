"""DataLoader workers forked while the agent counts FLOPs: each epoch has two batches and
starts new workers (fork), so the automatic count's step (the 11th) begins by forking them.
Prints how many samples the workers made under a dispatch mode (the count must not follow them
into the child) and the count's result, as one JSON line."""

from __future__ import annotations

import json
import os

import gputop.agent

gputop.agent.install()

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils._python_dispatch import _get_current_dispatch_mode  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402


class Flagged(Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        return torch.randn(4), int(_get_current_dispatch_mode() is not None)


model = nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(Flagged(), batch_size=4, num_workers=1, multiprocessing_context="fork")
flagged = batches = 0
for _epoch in range(12):
    for x, flag in loader:
        flagged += int(flag.sum())
        batches += 1
        loss = model(x).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
last = gputop.agent._agent.flops.last or {}
print(json.dumps({"flagged": flagged, "batches": batches, "count": last}), flush=True)
os._exit(0)
