"""A counted step that outlives the count's time limit, then no optimizer step ever again (the
training loop ends and evaluation runs): the count stops at its limit and the dispatch mode is
left at the next module call, without waiting for a step that never comes. The limit is
lowered to 1 s (it is max(30 s, 10 typical steps)) so the test does not wait 30 s. Prints one
JSON line."""

from __future__ import annotations

import json
import os
import time

import gputop.agent
import gputop.agent.flops

gputop.agent.flops.MIN_LIMIT_S = 1.0
gputop.agent.install()

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils._python_dispatch import _get_current_dispatch_mode  # noqa: E402

model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
under_mode = []
for step in range(1, 12):
    x = torch.randn(8, 16)
    loss = model(x).sum()
    if step == 11:  # the counted step (the count starts when step 10 ends)
        under_mode.append(_get_current_dispatch_mode() is not None)
        time.sleep(1.5)
        loss = loss + model(x).sum()  # an operator past the limit stops the count
    opt.zero_grad()
    loss.backward()
    if step < 11:
        opt.step()  # step 11 never ends: evaluation follows
with torch.no_grad():
    model(torch.randn(8, 16))  # a module call: the safe point
    under_mode.append(_get_current_dispatch_mode() is not None)
last = gputop.agent._agent.flops.last or {}
print(json.dumps({"under_mode": under_mode, "count": last,
                  "state": gputop.agent._agent.flops.state}), flush=True)
os._exit(0)
