"""torch.compile's health on a real GPU (issue 41): what a CPU run cannot show.

    python benchmarks/gpu/compile_check.py               # under 90 s on one GPU
    python benchmarks/gpu/compile_check.py --device cpu  # the dry run: same path, no GPU

A child trains a small MLP compiled with ``mode="reduce-overhead"`` (inductor's CUDA-graph
trees) under `gputop run`; its batch size cycles 64 -> 48 -> 32 every ``--change-every`` steps,
so dynamo recompiles (64 -> 48, then the size goes dynamic) and the cudagraph trees record a
new graph for each new size under the same compile id (a re-record). One `gputop watch --json`
looks on. The parent polls the agent's ``compile`` status and prints JSON lines:

* ``status``: the agent's compile figures once a few seconds (compiles, recompiles,
  cudagraph recordings / re-recordings / skips, seconds blocked after warm-up);
* ``finding``: each compile finding `gputop watch` raised for the job;
* ``result``: what was collected against what is expected, and PASS/FAIL per item.

Exit 0 when the recompile (with its changing dimension) was collected and `recompiles` raised;
on CUDA also when CUDA-graph recordings and a re-record were collected. On the CPU (``--device
cpu``) the backend is aot_eager (inductor's CPU compile is minutes on a small machine and has
no CUDA graphs): the cudagraph items are reported as not applicable.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
COMPILE_IDS = {"recompiles", "graph-breaks", "compile-fallback", "compile-stall",
               "cudagraph-rerecord"}


def emit(kind: str, **data) -> None:
    print(json.dumps({"check": kind, **data}, default=str), flush=True)


# --- child: the compiled training job -----------------------------------------------------------


def child(args: argparse.Namespace) -> int:
    import torch
    from torch import nn

    torch.manual_seed(0)
    if hasattr(torch._dynamo.config, "automatic_dynamic_local_pgo"):
        torch._dynamo.config.automatic_dynamic_local_pgo = False  # no memory of other runs
    device = torch.device(args.device)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                          nn.Linear(256, 10)).to(device)
    if args.device == "cpu":
        compiled = torch.compile(model, backend="aot_eager")
    else:
        compiled = torch.compile(model, mode="reduce-overhead")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    sizes = (64, 48, 32)
    end = time.monotonic() + args.seconds
    step = 0
    while time.monotonic() < end:
        batch = sizes[(step // args.change_every) % len(sizes)]
        x = torch.randn(batch, 256, device=device)
        y = torch.randint(0, 10, (batch,), device=device)
        if args.device != "cpu":
            torch.compiler.cudagraph_mark_step_begin()
        loss = nn.functional.cross_entropy(compiled(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        step += 1
        if step == 1:
            print("training", flush=True)
        time.sleep(args.step_ms / 1000)
    return 0


# --- parent: run it under gputop, look from outside ------------------------------------------


def _compile_of(pid: int) -> dict | None:
    from gputop.client.agents import agent_status

    try:
        status = agent_status(pid, timeout=5.0)
    except Exception:
        return None
    return (status or {}).get("compile")


def parent(args: argparse.Namespace) -> int:
    runtime = Path(tempfile.mkdtemp(prefix="gputop-compile-check-"))
    os.chmod(runtime, 0o700)
    os.environ["XDG_RUNTIME_DIR"] = str(runtime)  # our agents only, for us and the watch
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p),
        TORCHINDUCTOR_CACHE_DIR=str(runtime / "inductor"), PYTHONUNBUFFERED="1")
    job = subprocess.Popen(
        [sys.executable, "-m", "gputop", "run", "--", sys.executable, __file__, "--child",
         "--device", args.device, "--seconds", str(args.seconds), "--change-every",
         str(args.change_every), "--step-ms", str(args.step_ms)],
        env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watch = subprocess.Popen([sys.executable, "-m", "gputop", "watch", "--json"], env=env,
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             text=True)
    events: list[dict] = []

    def read() -> None:
        for line in watch.stdout:
            try:
                events.append(json.loads(line))
            except ValueError:
                pass

    threading.Thread(target=read, daemon=True).start()
    errors: list[str] = []
    threading.Thread(target=lambda: errors.extend(job.stderr.readlines()[-20:]),
                     daemon=True).start()
    t0 = time.monotonic()
    last: dict | None = None
    shown: set[tuple] = set()
    cuda = args.device != "cpu"
    try:
        while job.poll() is None and time.monotonic() - t0 < args.seconds + 30:
            time.sleep(1.0)
            compiled = _compile_of(job.pid)
            if compiled is not None:
                last = compiled
                graphs = compiled.get("cudagraph") or {}
                emit("status", t=round(time.monotonic() - t0, 1),
                     compiles=compiled.get("compiles"), recompiles=compiled.get("recompiles"),
                     recordings=graphs.get("recordings"), rerecords=graphs.get("rerecords"),
                     skips=graphs.get("skips"),
                     blocked_after_warmup_s=compiled.get("blocked_after_warmup_s"),
                     compile_s=compiled.get("compile_s"))
            for e in list(events):
                key = (e.get("id"), e.get("state"), e.get("time"))
                if e.get("pid") == job.pid and e.get("id") in COMPILE_IDS and key not in shown:
                    shown.add(key)
                    emit("finding", state=e.get("state"), id=e.get("id"),
                         evidence=e.get("evidence"), t=round(time.monotonic() - t0, 1))
            raised = {e["id"] for e in events if e.get("pid") == job.pid
                      and e.get("state") == "raised"}
            rerecorded = bool(((last or {}).get("cudagraph") or {}).get("rerecords"))
            if "recompiles" in raised and (not cuda or rerecorded):
                break  # everything expected is in: done early
    finally:
        for proc in (job, watch):
            proc.terminate()
        for proc in (job, watch):
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(runtime, ignore_errors=True)
    return report(last, events, job.pid, cuda, errors)


def report(last: dict | None, events: list[dict], pid: int, cuda: bool,
           errors: list[str]) -> int:
    last = last or {}
    graphs = last.get("cudagraph") or {}
    changes = [e.get("change") or "" for e in last.get("events", [])
               if e.get("kind") == "recompile"]
    raised = {e["id"]: e for e in events if e.get("pid") == pid and e.get("state") == "raised"}
    items = {
        "recompile collected": bool(last.get("recompiles")),
        "changing dim named": any("dim 0 changed 64 -> 48" in c for c in changes),
        "recompiles raised": "recompiles" in raised,
    }
    if cuda:
        items["cudagraph recordings collected"] = bool(graphs.get("recordings"))
        items["cudagraph re-record collected"] = bool(graphs.get("rerecords"))
    emit("result", torch=last.get("torch"), compiles=last.get("compiles"),
         recompiles=last.get("recompiles"), changes=changes[:4], cudagraph=graphs or None,
         blocked_after_warmup_s=last.get("blocked_after_warmup_s"),
         unavailable=last.get("unavailable"), findings=sorted(raised),
         recompiles_evidence=(raised.get("recompiles") or {}).get("evidence"),
         rerecord_evidence=(raised.get("cudagraph-rerecord") or {}).get("evidence"),
         items={k: "PASS" if v else "FAIL" for k, v in items.items()},
         cudagraph_items="checked" if cuda else "not applicable on the CPU",
         job_stderr_tail=[line.rstrip()[:300] for line in errors[-5:]] if not all(
             items.values()) else None)
    return 0 if all(items.values()) else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (dry run)")
    parser.add_argument("--seconds", type=float, default=60.0,
                        help="the job's longest run; the check ends as soon as all is in")
    parser.add_argument("--change-every", type=int, default=20,
                        help="steps between batch-size changes")
    parser.add_argument("--step-ms", type=float, default=10.0)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    return child(args) if args.child else parent(args)


if __name__ == "__main__":
    sys.exit(main())
