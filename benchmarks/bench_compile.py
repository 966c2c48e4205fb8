"""What the agent's torch.compile tracking costs a compiled training job.

    python benchmarks/bench_compile.py [--rounds 40] [--block 40] [--backend aot_eager]

One process with the agent installed trains a small MLP compiled with ``torch.compile`` (one
thread, fixed shapes after warm-up) in blocks of steps, alternately with the compile tracking
on (its compile callbacks registered, and the agent's ``status`` with its ``compile`` part
asked for at 10 Hz from another thread: ten times what the monitor does) and off (callbacks
removed, the same status polling without the ``compile`` part), swapping the order every
round, so machine noise hits both alike. Prints the median step-time ratio on/off (the goal:
under 1.01, the agent's budget), the direct cost of one ``compile`` status read and of the
two callbacks of one compile, and a control ratio (off against off: the method's noise).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--block", type=int, default=40, help="steps per block")
    parser.add_argument("--backend", default="aot_eager")
    args = parser.parse_args()

    import gputop.agent as agent_pkg

    agent_pkg.install()
    import torch
    from torch import nn

    torch.set_num_threads(1)
    torch.manual_seed(0)
    agent = agent_pkg._agent
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64), nn.ReLU(),
                          nn.Linear(64, 10))
    compiled = torch.compile(model, backend=args.backend)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))

    def step() -> None:
        loss = nn.functional.cross_entropy(compiled(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    for _ in range(20):  # compile and warm up
        step()

    stop = threading.Event()

    def poll() -> None:
        while not stop.wait(0.1):
            agent._status({"cmd": "status"})

    threading.Thread(target=poll, daemon=True).start()

    def tracking(on: bool) -> None:
        from gputop.agent.process import COMPILE_WATCH

        COMPILE_WATCH[0] = on
        if on:
            agent.compile._registered = False
            agent.compile.dynamo_imported()
        else:
            agent.compile.remove()

    def block() -> float:
        times = []
        for _ in range(args.block):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    ratios, control = [], []
    for r in range(args.rounds):
        order = (True, False) if r % 2 == 0 else (False, True)
        got = {}
        for on in order:
            tracking(on)
            got[on] = block()
        ratios.append(got[True] / got[False])
        tracking(False)
        a, b = block(), block()
        control.append(a / b if r % 2 == 0 else b / a)
    stop.set()
    tracking(True)

    # Direct costs: one compile status read (socket thread), the callbacks of one compile.
    reads = []
    for _ in range(200):
        t0 = time.perf_counter()
        agent.compile.status()
        reads.append(time.perf_counter() - t0)

    class _Args:
        callback_trigger = type("T", (), {"name": "DYNAMO"})()
        compile_id = "99/1"

    t0 = time.perf_counter()
    for _ in range(1000):
        agent.compile._on_start(_Args)
        agent.compile._on_end(_Args)
    callbacks = (time.perf_counter() - t0) / 1000
    step_s = statistics.median(block() for _ in range(3))
    print(json.dumps({
        "torch": torch.__version__,
        "backend": args.backend,
        "step_ms": round(step_s * 1e3, 3),
        "ratio_on_off_median": round(statistics.median(ratios), 4),
        "ratio_on_off_mean": round(statistics.fmean(ratios), 4),
        "control_off_off_median": round(statistics.median(control), 4),
        "compile_status_read_us_median": round(statistics.median(reads) * 1e6, 1),
        "compile_callbacks_us_per_compile": round(callbacks * 1e6, 2),
        "polls_per_s": 10,
    }, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
