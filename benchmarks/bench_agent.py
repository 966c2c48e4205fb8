"""What the gputop agent costs a training run: idle, polled, and during one capture.

    python benchmarks/bench_agent.py [--rounds 30] [--block 150]

Two child processes run the same small CPU training loop (an MLP fed by an in-memory
DataLoader, one thread), one with the agent installed and one without. The parent makes them
run blocks of steps in turn, never at the same time, alternating which goes first, so machine
noise and drift hit both alike. It prints:

- the step-time ratio agent / plain with the agent idle (goal <= 1.005), and with the parent
  polling the agent's `status` at 10 Hz (ten times what the monitor does);
- the agent's own cost per step measured directly (optimizer hook + DataLoader timer);
- the latency of `agent_status()`, which the monitor calls once per tick per process;
- for one capture (1 warm-up + 3 recorded steps): the time the training thread spends in the
  agent's hook (profiler start, steps, stop) and the training time added overall from the
  request until the trace is written (profiling overhead and the export thread included).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


# --- child: the training loop ----------------------------------------------------------------


def child_main(with_agent: bool) -> None:
    if with_agent:
        import gputop.agent

        gputop.agent.install()
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    torch.set_num_threads(1)
    if hasattr(os, "sched_setaffinity"):  # both children on one core: they never overlap
        os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
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

    for _ in range(100):  # warm up allocator and caches
        step()
    print(json.dumps({"ready": os.getpid()}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "run":
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
        elif cmd["op"] == "overhead" and with_agent:
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
    loader = DataLoader(TensorDataset(torch.zeros(20 * n, 1)), batch_size=None)
    it = iter(loader)
    wrapped = type(it).__next__
    original = getattr(wrapped, "_gputop_original", wrapped)
    t_wrapped = best(lambda: wrapped(it))
    t_original = best(lambda: original(it))
    return {"hook_s": hook - empty, "dataloader_timer_s": max(0.0, t_wrapped - t_original)}


# --- parent ------------------------------------------------------------------------------------


class Child:
    def __init__(self, with_agent: bool, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--child", "agent" if with_agent else "plain"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=REPO,
        )
        self.pid = json.loads(self.proc.stdout.readline())["ready"]

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


def interleaved(plain: Child, agent: Child, rounds: int, block: int, poll_hz: float = 0.0):
    """Alternate blocks; returns (plain step times, agent step times, per-round ratios)."""
    from gputop.ipc import agent_status

    all_plain, all_agent, ratios = [], [], []
    for r in range(rounds):
        order = (plain, agent) if r % 2 == 0 else (agent, plain)
        result = {}
        for child in order:
            stop = threading.Event()
            poller = None
            if child is agent and poll_hz:

                def poll(stop: threading.Event = stop) -> None:
                    while not stop.wait(1.0 / poll_hz):
                        agent_status(agent.pid)

                poller = threading.Thread(target=poll, daemon=True)
                poller.start()
            result[child] = child.ask(op="run", steps=block)["times"]
            stop.set()
            if poller:
                poller.join()
        all_plain += result[plain]
        all_agent += result[agent]
        ratios.append(statistics.median(result[agent]) / statistics.median(result[plain]))
    return all_plain, all_agent, ratios


def capture_cost(agent: Child, out_dir: str) -> dict:
    """One capture while the agent child trains: hook time, and added time overall."""
    from gputop import ipc

    flag = Path(tempfile.mkstemp(prefix="bench-agent-flag-")[1])
    agent.ask_nowait(op="run_until", flag=str(flag))
    time.sleep(1.0)  # a baseline before the request
    t_request = time.monotonic()
    reply = ipc.request(
        agent.pid, {"cmd": "capture", "steps": 3, "warmup": 1, "out": out_dir}, timeout=60
    )
    t_reply = time.monotonic()
    time.sleep(0.5)
    flag.unlink()
    log = json.loads(agent.proc.stdout.readline())["log"]
    before = [e - s for s, e in log if e < t_request]
    baseline = statistics.median(before[-200:])
    during = [e - s for s, e in log if s >= t_request and e <= t_reply + baseline]
    added = sum(d - baseline for d in during)
    return {
        "baseline_step_s": baseline,
        "steps_during": len(during),
        "added_s": added,
        "hook_blocked_s": reply["summary"]["blocked_s"],
        "request_to_reply_s": t_reply - t_request,
        "trace_bytes": reply["bytes"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--block", type=int, default=150, help="steps per block")
    parser.add_argument("--child", choices=("plain", "agent"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_main(args.child == "agent")
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
    plain, agent = Child(False, env), Child(True, env)
    try:
        print(
            f"agent/plain step-time ratio, {args.rounds} interleaved rounds of {args.block} "
            "steps each (MLP 512-512-512-10, batch 64, in-memory DataLoader, 1 thread)"
        )
        p, a, ratios = interleaved(plain, agent, args.rounds, args.block)
        ratios.sort()
        q1, q3 = ratios[len(ratios) // 4], ratios[3 * len(ratios) // 4]
        print(
            f"  step time plain {statistics.median(p) * 1e3:.3f} ms, "
            f"agent {statistics.median(a) * 1e3:.3f} ms (medians)"
        )
        print(
            f"  idle agent: ratio {statistics.median(ratios):.4f} (median of per-round "
            f"median ratios; IQR {q1:.4f}..{q3:.4f}); ratio of totals {sum(a) / sum(p):.4f}; "
            "goal <= 1.005"
        )
        _, _, polled = interleaved(plain, agent, max(10, args.rounds // 2), args.block, 10.0)
        print(f"  agent polled for status at 10 Hz: ratio {statistics.median(polled):.4f}")

        direct = agent.ask(op="overhead")
        per_step = direct["hook_s"] + direct["dataloader_timer_s"]
        base = statistics.median(p)
        print(
            f"  measured directly: optimizer hook {direct['hook_s'] * 1e6:.2f} us + DataLoader "
            f"timer {direct['dataloader_timer_s'] * 1e6:.2f} us = {per_step * 1e6:.2f} us per "
            f"step = {per_step / base * 100:.3f}% of this model's step"
        )

        from gputop.ipc import agent_status

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
    finally:
        for child in (plain, agent):
            try:
                child.close()
            except Exception:
                child.proc.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
