"""Real CPU and gloo runs recorded with torch.profiler, one per class of idle time the gap
attribution must tell apart (tests/test_trace_attribution.py analyses the traces).

    python attribution_cases.py CASE RANK PORT OUT

Cases (gloo runs two ranks; the others ignore RANK and PORT):

- ``busy_wait``: each step starts a large all_reduce asynchronously and waits for it while it
  runs (the host is blocked most of the step, but on a busy "device": not a host sync).
- ``python_after_sync``: each step computes, waits for a small all_reduce that is already done,
  then runs a pure-Python function (no operator) before the next step: the device idles while
  the host runs that function, which the analysis must name.
- ``no_steps``: no prof.step() and no optimizer; the profiler starts and stops around sleeps
  (its edges) and a loop of real compute: only the span both sides recorded may be judged.
- ``cold_start``: the first calls of a torch.compile'd model inside the profiler: the trace is
  compilation, not training.
- ``one_off_first``: steady compute steps, but the first profiled one also waits 0.2 s on
  something once (the first batch read from disk): a one-off, judged apart.
- ``profiler_tail``: steady compute steps with prof.step() at the end of each, then 0.2 s of
  other work before the profiler stops: the last ProfilerStep holds only that tail.
"""

from __future__ import annotations

import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile, schedule

torch.set_num_threads(1)


def preprocess_batch(n: int) -> int:
    # Host-side work in plain Python: nothing the profiler records as an operator.
    acc = 0
    for i in range(n):
        acc += (i * 7) % 13
    return acc


def gloo_case(case: str, rank: int, port: str, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=2,
                            init_method=f"tcp://127.0.0.1:{port}")
    big, small, a = torch.rand(16_000_000), torch.rand(1000), torch.rand(256, 256)

    def step() -> None:
        if case == "busy_wait":
            work = dist.all_reduce(big, async_op=True)
            a @ a
            work.wait()
        else:
            for _ in range(20):
                a @ a
            work = dist.all_reduce(small, async_op=True)
            work.wait()
            preprocess_batch(400_000)

    with profile(activities=[ProfilerActivity.CPU], with_stack=True,
                 schedule=schedule(wait=1, warmup=1, active=4, repeat=1)) as prof:
        for _ in range(6):
            step()
            prof.step()
    if rank == 0:
        prof.export_chrome_trace(out)
    # Both ranks leave together: a rank tearing gloo down while the other still exports its
    # trace was seen to abort at exit ("terminate called without an active exception").
    dist.barrier()
    dist.destroy_process_group()


def no_steps(out: str) -> None:
    a = torch.rand(256, 256)
    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        time.sleep(0.3)  # the profiler started before the work: an edge, not the program
        for _ in range(200):
            a = torch.tanh(a @ a)
        time.sleep(0.3)  # and stops after it
    prof.export_chrome_trace(out)


def cold_start(out: str) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    # aot_eager: the real dynamo + AOT autograd compilation, without a C++ toolchain.
    compiled = torch.compile(model, backend="aot_eager")
    x = torch.rand(32, 64)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            compiled(x).sum()
    prof.export_chrome_trace(out)


def one_off(case: str, out: str) -> None:
    a = torch.rand(256, 256)

    def step() -> None:
        nonlocal a
        for _ in range(30):
            a = torch.tanh(a @ a)

    # profiler_tail: the schedule asks for more steps than the loop runs, so the step opened by
    # the last prof.step() lasts until the profiler stops (as with any loop that ends early).
    active = 5 if case == "one_off_first" else 20
    with profile(activities=[ProfilerActivity.CPU], with_stack=True,
                 schedule=schedule(wait=0, warmup=1, active=active, repeat=1)) as prof:
        for i in range(6):
            if case == "one_off_first" and i == 1:
                time.sleep(0.2)  # once, in the first recorded step: the first batch from disk
            step()
            prof.step()
        if case == "profiler_tail":
            time.sleep(0.2)  # after the loop, before the profiler stops
    prof.export_chrome_trace(out)


def main() -> None:
    case, rank, port, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    if case in ("busy_wait", "python_after_sync"):
        gloo_case(case, rank, port, out)
    elif case == "no_steps":
        no_steps(out)
    elif case == "cold_start":
        cold_start(out)
    elif case in ("one_off_first", "profiler_tail"):
        one_off(case, out)
    else:
        raise SystemExit(f"unknown case {case!r}")


if __name__ == "__main__":
    main()
