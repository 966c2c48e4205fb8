"""Real CUDA traces of the trace-diagnosis classes of issue 26, recorded on a GPU and checked with
`gputop analyze --json` (run on a machine with a CUDA GPU and a CUDA build of torch).

    python benchmarks/gpu/trace_classes.py OUT_DIR [CASE ...]

Cases (each a few seconds of GPU time; all by default):

- ``h2d_bound``: each step copies 1 GiB from pinned host memory, runs a few small kernels and
  synchronizes (the H200 job of the issue): expect ``copy-bound`` with the bytes and GB/s and
  the PCIe link's share.
- ``final_read``: a GPU kept busy by queued matmuls while the host waits in a final ``.cpu()``
  of the output, nothing launched after it: expect no ``host-sync`` at warning.
- ``first_batch``: compute-bound steps, the first of which also uploads 2 GiB once from pageable
  memory: expect a one-off first step and no copy finding.
- ``cpu_only_activities``: the same steps recorded with activities=[CPU] only: expect
  ``not-assessed`` or a host-side finding, never a device verdict.
- ``compiled``: torch.compile(mode="default") of a chain of small elementwise ops at batch 1:
  expect ``launch-bound`` (Inductor's wrapper and Triton's launcher are the launch path).

Each trace is kept in OUT_DIR (bring them back as test data); the script prints one line per
case, PASS/FAIL with the verdict and the figures, and exits 1 if any case failed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

GIB = 2**30
CUDA = [ProfilerActivity.CPU, ProfilerActivity.CUDA]


def _record(out: Path, step, steps: int = 3, activities=CUDA, warmup: int = 1) -> Path:
    with profile(activities=activities, with_stack=True,
                 schedule=schedule(wait=1, warmup=warmup, active=steps, repeat=1)) as prof:
        for i in range(1 + warmup + steps):
            step(i)  # i == 1 + warmup: the first recorded step
            prof.step()
    prof.export_chrome_trace(str(out))
    return out


def h2d_bound(out: Path) -> Path:
    host = torch.empty(GIB, dtype=torch.uint8).pin_memory()
    dev = torch.empty(GIB, dtype=torch.uint8, device="cuda")
    x = torch.rand(1024, 1024, device="cuda")

    def step(i):
        dev.copy_(host, non_blocking=True)
        for _ in range(10):
            x.mul_(1.0001)
        torch.cuda.synchronize()

    return _record(out, step)


def final_read(out: Path) -> Path:
    a = torch.rand(4096, 4096, device="cuda")
    torch.cuda.synchronize()
    with profile(activities=CUDA) as prof:
        y = a
        for _ in range(200):
            y = torch.tanh(y @ a) * 0.01
        y.cpu()  # the host waits here while the GPU runs the 200 queued matmuls
    prof.export_chrome_trace(str(out))
    return out


def first_batch(out: Path) -> Path:
    a = torch.rand(4096, 4096, device="cuda")

    def step(i):
        if i == 1:  # the first recorded step (wait=1, warmup=0)
            torch.empty(2 * GIB, dtype=torch.uint8).to("cuda")  # pageable, once
        y = a
        for _ in range(20):
            y = torch.tanh(y @ a) * 0.01
        torch.cuda.synchronize()

    return _record(out, step, steps=5, warmup=0)


def cpu_only_activities(out: Path) -> Path:
    a = torch.rand(4096, 4096, device="cuda")

    def step(i):
        y = a
        for _ in range(20):
            y = torch.tanh(y @ a) * 0.01
        torch.cuda.synchronize()

    return _record(out, step, activities=[ProfilerActivity.CPU])


def compiled(out: Path) -> Path:
    def chain(x):
        for i in range(60):
            x = torch.sin(x) * (1 + i * 1e-3) if i % 7 else torch.relu(x + 1)
            if i % 10 == 9:
                x = x.sum(dim=-1, keepdim=True) + x  # breaks fusion: many small kernels
        return x

    fn = torch.compile(chain)
    x = torch.rand(1, 64, device="cuda")
    for _ in range(3):
        fn(x)  # compile outside the recording
    torch.cuda.synchronize()
    return _record(out, lambda i: fn(x), steps=5)


CASES = {"h2d_bound": h2d_bound, "final_read": final_read, "first_batch": first_batch,
         "cpu_only_activities": cpu_only_activities, "compiled": compiled}


def check(case: str, doc: dict) -> tuple[bool, str]:
    m, verdict = doc["metrics"], doc["verdict"]
    raised = {f["id"] for f in doc["findings"] if f["severity"] in ("warning", "critical")}
    if case == "h2d_bound":
        h2d = m["busy"]["classes"]["h2d"]
        ok = verdict == "copy-bound" and h2d["bytes"] >= 3 * GIB and bool(h2d["gb_per_s"])
        return ok, (f"h2d {h2d['bytes'] / GIB:.2f} GiB at {h2d['gb_per_s']} GB/s "
                    f"({h2d.get('link_pct')}% of {(m['busy']['link'] or {}).get('name')})")
    if case == "final_read":
        return "host-sync" not in raised, f"d2h read blocked {m['sync']['d2h_read_blocked_pct']}%"
    if case == "first_batch":
        offs = m["one_offs"]
        ok = bool(offs) and offs[0]["position"] == "first" and "copy-bound" not in raised
        return ok, f"one-offs {offs}"
    if case == "cpu_only_activities":
        device = {"gpu-idle", "launch-bound", "host-sync", "communication", "copy-bound"}
        ok = verdict != "healthy" and not raised & device and bool(m["trace"]["gpu_unrecorded"])
        return ok, f"gpu_unrecorded: {m['trace']['gpu_unrecorded']}"
    if case == "compiled":
        top = (m.get("idle_attribution", {}).get("launch", {}).get("top") or [[""]])[0][0]
        return verdict == "launch-bound", f"launch path top: {top}"
    return False, "unknown case"


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    names = sys.argv[2:] or list(CASES)
    failed = 0
    for name in names:
        trace = CASES[name](out_dir / f"{name}.pt.trace.json")
        proc = subprocess.run([sys.executable, "-m", "gputop", "analyze", "--json", str(trace)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            failed += 1
            print(f"FAIL  {name}: {proc.stderr.strip()[:300]}")
            continue
        doc = json.loads(proc.stdout)
        ok, figures = check(name, doc)
        failed += not ok
        print(f"{'PASS' if ok else 'FAIL'}  {name}: verdict {doc['verdict']}; {figures}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
