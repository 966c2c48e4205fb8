"""What the gputop agent costs a training run: idle, polled, and during one capture.

    python benchmarks/bench_agent.py [--rounds 150] [--block 30]

A child process runs a small CPU training loop (an MLP fed by an in-memory DataLoader, one
thread) in blocks of steps, alternately with the agent installed and with it removed
(`gputop.agent.shutdown()`), swapping the order every round, so machine noise and drift hit
both alike and nothing else differs (same process, memory layout, data). It prints:

- the step-time ratio with/without the agent, idle (goal <= 1.005), with the parent polling the
  agent's `status` at 10 Hz (ten times what the monitor does), and for a control run without
  the agent on either side (the method's own noise floor);
- the agent's own cost per step measured directly (optimizer hook + DataLoader timer), and of
  its device-sync timers: a wrapped `.item()` on a CPU tensor (one attribute test, not timed)
  and the timing a CUDA tensor's sync gets (two clock reads);
- the latency of `agent_status()`, which the monitor calls once per tick per process;
- for one capture (1 warm-up + 3 recorded steps): the time the training thread spends in the
  agent's hook (profiler start, steps, stop) and the training time added overall from the
  request until the trace is written (profiling overhead and the export thread included);
- for one FLOP count (``FlopCounterMode`` on one step, as the monitor's `m` asks for it): the
  counted step against a typical one, and the training time added from request to reply. The
  agent counted once by itself after warm-up too: the idle figures above are with that done and
  the goodput ledger on (it is part of the hook's cost measured directly).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


# --- child: the training loop ----------------------------------------------------------------


def child_main() -> None:
    import gputop.agent

    gputop.agent.install()  # before torch, as under `gputop run`
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(
        nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    data = TensorDataset(torch.randn(4096, 512), torch.randint(0, 10, (4096,)))
    loader = DataLoader(data, batch_size=64, shuffle=True)
    batches = iter(loader)

    def step() -> None:
        nonlocal batches
        try:
            x, y = next(batches)
        except StopIteration:
            batches = iter(loader)
            x, y = next(batches)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    for _ in range(100):  # warm up allocator and caches (the agent counts step 11's FLOPs)
        step()
    auto = gputop.agent._agent.flops.last or {}
    print(json.dumps({"ready": os.getpid(), "auto_count": auto}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "run":
            # The same loop, in the same process, with the agent in place or removed.
            if cmd["agent"]:
                gputop.agent.install()
            else:
                gputop.agent.shutdown()
            times = []
            for _ in range(cmd["steps"]):
                t0 = time.perf_counter()
                step()
                times.append(time.perf_counter() - t0)
            print(json.dumps({"times": times}), flush=True)
        elif cmd["op"] == "run_until":  # run while a flag file exists, logging each step
            log = []
            flag = Path(cmd["flag"])
            while flag.exists():
                t0 = time.monotonic()
                step()
                log.append((t0, time.monotonic()))
            print(json.dumps({"log": log}), flush=True)
        elif cmd["op"] == "overhead":
            gputop.agent.install()
            print(json.dumps(direct_overhead()), flush=True)
        elif cmd["op"] == "quit":
            return


def direct_overhead() -> dict:
    """The agent's idle cost per step, timed directly: hook call + wrapped __next__."""
    import timeit

    import torch
    from torch.utils.data import DataLoader, TensorDataset

    import gputop.agent

    telemetry = gputop.agent._agent.telemetry
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    n = 50_000

    def best(fn) -> float:  # best of 5: the least disturbed by the rest of the machine
        return min(timeit.repeat(fn, number=n, repeat=5)) / n

    hook = best(lambda: telemetry.optimizer_hook(opt, (), {}))
    empty = best(lambda: None)
    ledger = telemetry.ledger
    now = time.perf_counter()
    ledger_step = best(lambda: ledger.step(now, 0.001, 0.0))
    loader = DataLoader(TensorDataset(torch.zeros(20 * n, 1)), batch_size=None)
    it = iter(loader)
    wrapped = type(it).__next__
    original = getattr(wrapped, "_gputop_original", wrapped)
    t_wrapped = best(lambda: wrapped(it))
    t_original = best(lambda: original(it))
    # The sync timers: .item() on a CPU tensor passes straight through; a CUDA tensor's sync
    # (no GPU here) costs the clock reads and the sum, timed as the wrapper does them.
    scalar = torch.zeros(())
    item = torch.Tensor.item
    plain = getattr(item, "_gputop_original", item)
    perf_counter = time.perf_counter

    def timed_sync() -> None:
        t0 = perf_counter()
        telemetry.add_sync_wait(perf_counter() - t0)

    return {"hook_s": hook - empty, "dataloader_timer_s": max(0.0, t_wrapped - t_original),
            "sync_passthrough_s": max(0.0, best(lambda: item(scalar)) - best(lambda: plain(scalar))),
            "sync_timing_s": best(timed_sync) - empty, "ledger_s": ledger_step - empty}


# --- parent ------------------------------------------------------------------------------------


class Child:
    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--child"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=REPO,
        )
        ready = json.loads(self.proc.stdout.readline())
        self.pid = ready["ready"]
        self.auto_count = ready["auto_count"]

    def ask(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        try:
            self.ask_nowait(op="quit")
        finally:
            self.proc.wait(30)

    def ask_nowait(self, **cmd) -> None:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()


def interleaved(child: Child, rounds: int, block: int, agent_on=(False, True), poll_hz=0.0):
    """Blocks of steps without and with the agent in turn (the order alternates each round).

    Returns (step times of the first kind, of the second kind, per-round ratios second/first).
    ``agent_on=(False, False)`` is the control: the method's own noise floor.
    """
    from gputop.client.agents import agent_status

    first, second, ratios = [], [], []
    for r in range(rounds):
        result: dict[int, list[float]] = {}
        for kind in (0, 1) if r % 2 == 0 else (1, 0):
            stop = threading.Event()
            poller = None
            if agent_on[kind] and poll_hz:

                def poll(stop: threading.Event = stop) -> None:
                    while not stop.wait(1.0 / poll_hz):
                        agent_status(child.pid)

                poller = threading.Thread(target=poll, daemon=True)
                poller.start()
            result[kind] = child.ask(op="run", steps=block, agent=agent_on[kind])["times"]
            stop.set()
            if poller:
                poller.join()
        first += result[0]
        second += result[1]
        ratios.append(_quantile(result[1], 0.25) / _quantile(result[0], 0.25))
    return first, second, ratios


def _while_training(agent: Child, ask) -> tuple[dict, dict]:
    """Run ``ask()`` (a request to the agent) while the child trains; its reply, and the
    baseline step, the steps from request to reply and the training time they added."""
    flag = Path(tempfile.mkstemp(prefix="bench-agent-flag-")[1])
    agent.ask_nowait(op="run_until", flag=str(flag))
    time.sleep(1.0)  # a baseline before the request
    t_request = time.monotonic()
    reply = ask()
    t_reply = time.monotonic()
    time.sleep(0.5)
    flag.unlink()
    log = json.loads(agent.proc.stdout.readline())["log"]
    before = [e - s for s, e in log if e < t_request]
    baseline = statistics.median(before[-200:])
    during = [e - s for s, e in log if s >= t_request and e <= t_reply + baseline]
    return reply, {"baseline_step_s": baseline, "steps_during": len(during),
                   "added_s": sum(d - baseline for d in during),
                   "request_to_reply_s": t_reply - t_request}


def capture_cost(agent: Child, out_dir: str) -> dict:
    """One capture while the agent child trains: hook time, and added time overall."""
    from gputop.client import agents as client

    reply, cost = _while_training(agent, lambda: client.request(
        agent.pid, {"cmd": "capture", "steps": 3, "warmup": 1, "out": out_dir}, timeout=60))
    return {**cost, "hook_blocked_s": reply["summary"]["blocked_s"],
            "trace_bytes": reply["bytes"]}


def flop_count_cost(agent: Child) -> dict:
    """One FLOP count asked for while the agent child trains: its step, and the time added."""
    from gputop.client import agents as client

    reply, cost = _while_training(agent, lambda: client.request_flop_count(agent.pid,
                                                                           timeout=60))
    return {**cost, "counted_step_s": reply["counted_step_s"], "agent_cost_s": reply["cost_s"],
            "flops_per_step": reply["flops_per_step"]}


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report_ratios(label: str, plain: list[float], agent: list[float], ratios: list[float]) -> None:
    """Several estimators: interference from other processes only ever adds time, so the
    fastest steps (p10) are the least disturbed view of the intrinsic cost."""
    q1, q3 = _quantile(ratios, 0.25), _quantile(ratios, 0.75)
    print(
        f"  {label}: ratio {statistics.median(ratios):.4f} (median of per-round ratios, IQR "
        f"{q1:.4f}..{q3:.4f}); p10 steps {_quantile(agent, 0.1) / _quantile(plain, 0.1):.4f}; "
        f"totals {sum(agent) / sum(plain):.4f}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=150)
    parser.add_argument("--block", type=int, default=30, help="steps per block")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_main()
        return 0

    sys.path.insert(0, str(REPO))
    runtime = Path(tempfile.mkdtemp(prefix="bench-agent-xdg-"))
    os.chmod(runtime, 0o700)
    os.environ["XDG_RUNTIME_DIR"] = str(runtime)
    out_dir = tempfile.mkdtemp(prefix="bench-agent-captures-")
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    )
    agent = Child(env)
    try:
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        print(f"machine: {os.cpu_count()} CPUs, load average {load} (other work adds noise)")
        print(
            f"step-time ratio with/without the agent: {args.rounds} rounds of {args.block}-step "
            "blocks, alternating, in one training process (MLP 512-512-512-10, batch 64, "
            "in-memory DataLoader, 1 thread)"
        )
        p, a, ratios = interleaved(agent, args.rounds, args.block)
        print(
            f"  step time without {statistics.median(p) * 1e3:.3f} ms, "
            f"with {statistics.median(a) * 1e3:.3f} ms (medians)"
        )
        report_ratios("idle agent (goodput ledger on, its FLOP count done)", p, a, ratios)
        short = max(20, args.rounds // 3)
        p, a, ratios = interleaved(agent, short, args.block, poll_hz=10.0)
        report_ratios("agent polled for status at 10 Hz", p, a, ratios)
        p, a, ratios = interleaved(agent, short, args.block, agent_on=(False, False))
        report_ratios("control, no agent either way (noise floor)", p, a, ratios)

        direct = agent.ask(op="overhead")
        per_step = direct["hook_s"] + direct["dataloader_timer_s"]
        base = statistics.median(p)
        print(
            f"  measured directly: optimizer hook {direct['hook_s'] * 1e6:.2f} us (of which the "
            f"goodput ledger {direct['ledger_s'] * 1e6:.2f} us) + DataLoader "
            f"timer {direct['dataloader_timer_s'] * 1e6:.2f} us = {per_step * 1e6:.2f} us per "
            f"step = {per_step / base * 100:.3f}% of this model's step"
        )
        print(
            f"  device-sync timers: {direct['sync_passthrough_s'] * 1e6:.2f} us per call on a CPU "
            f"tensor (not timed), {direct['sync_timing_s'] * 1e6:.2f} us per sync of a CUDA "
            "tensor (timed)"
        )
        auto = agent.auto_count
        if auto.get("ok"):
            print(f"  the automatic FLOP count after warm-up: step {auto['step']}, counted in "
                  f"{auto['counted_step_s'] * 1e3:.2f} ms against {auto['typical_step_s'] * 1e3:.2f}"
                  f" ms typical (cost {auto['cost_s'] * 1e3:.2f} ms, once per process)")
        else:
            print(f"  the automatic FLOP count after warm-up did not run: {auto}")

        from gputop.client.agents import agent_status

        lat = []
        for _ in range(200):
            t0 = time.perf_counter()
            assert agent_status(agent.pid) is not None
            lat.append(time.perf_counter() - t0)
        lat.sort()
        print(
            f"agent_status() latency while training: median {statistics.median(lat) * 1e3:.2f}"
            f" ms, p95 {lat[int(0.95 * len(lat))] * 1e3:.2f} ms"
        )

        cost = capture_cost(agent, out_dir)
        print(
            f"one capture (1 warm-up + 3 recorded steps, baseline step "
            f"{cost['baseline_step_s'] * 1e3:.2f} ms, trace {cost['trace_bytes'] / 1024:.0f} KiB"
            f", request to reply {cost['request_to_reply_s'] * 1e3:.0f} ms):"
        )
        print(
            f"  training thread blocked in the agent's hook (profiler start/step/stop): "
            f"{cost['hook_blocked_s'] * 1e3:.2f} ms"
        )
        print(
            f"  training time added from request to trace written ({cost['steps_during']} "
            f"steps; profiling overhead and export included): {cost['added_s'] * 1e3:.1f} ms"
        )
        flops = flop_count_cost(agent)
        print(
            f"one FLOP count (FlopCounterMode on one step, {flops['flops_per_step'] / 1e6:.0f} "
            f"MFLOP; request to reply {flops['request_to_reply_s'] * 1e3:.0f} ms):"
        )
        print(
            f"  the counted step {flops['counted_step_s'] * 1e3:.2f} ms against "
            f"{flops['baseline_step_s'] * 1e3:.2f} ms typical "
            f"({flops['counted_step_s'] / flops['baseline_step_s']:.1f}x); the agent's own "
            f"figure of its cost {flops['agent_cost_s'] * 1e3:.2f} ms"
        )
        print(
            f"  training time added from request to reply ({flops['steps_during']} steps): "
            f"{flops['added_s'] * 1e3:.1f} ms, once; nothing after (the mode is gone)"
        )
    finally:
        try:
            agent.close()
        except Exception:
            agent.proc.kill()
        shutil.rmtree(runtime, ignore_errors=True)
        shutil.rmtree(out_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
