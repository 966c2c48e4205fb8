"""Check `gputop analyze` on real CUDA traces of the trace-diagnosis classes (issue 26), and
record the two classes ``benchmarks/gpu/traces.py`` does not.

    python benchmarks/gpu/traces.py OUT_DIR            # copy_h2d, copy_d2h, final_read, compiled
    python benchmarks/gpu/trace_classes.py OUT_DIR     # + first_batch, cpu_only; then checks all

Recorded here (CUDA needed; skipped with a note when absent, the checks still run):

- ``first_batch``: compute-bound steps, the first of which also uploads 2 GiB once from pageable
  memory: a one-off first step, judged apart, and no copy finding for the steady steps.
- ``cpu_only``: the same steps recorded with activities=[CPU] only: GPU activity not recorded,
  so no device verdict (``not-assessed`` or a host-side finding).

Checked for every ``CASE.pt.trace.json.gz`` in OUT_DIR that has a rule below: ``copy_h2d`` and
``copy_d2h`` give ``copy-bound`` with bytes and GB/s; ``final_read`` no ``host-sync`` at
warning; ``compiled`` ``launch-bound``. One PASS/FAIL line per trace with the figures; exit 1 if
any failed. Keep the traces: they are the test data the issue asks for.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

GIB = 2**30
DEVICE_VERDICTS = {"gpu-idle", "launch-bound", "host-sync", "communication", "copy-bound",
                   "pageable-memcpy", "long-gpu-gaps", "allocator-churn"}


def _record(path: Path, step, cuda: bool = True, steps: int = 5) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities, schedule=schedule(wait=1, warmup=0, active=steps,
                                                          repeat=1)) as prof:
        for i in range(1 + steps):
            step(i)  # i == 1: the first recorded step
            torch.cuda.synchronize()
            prof.step()
    raw = str(path)[: -len(".gz")]
    prof.export_chrome_trace(raw)
    with open(raw, "rb") as src, gzip.open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    os.remove(raw)


def _matmuls():
    import torch

    a = torch.rand(4096, 4096, device="cuda")

    def step(i: int) -> None:
        y = a
        for _ in range(20):
            y = torch.tanh(y @ a) * 0.01

    return step


def first_batch(path: Path) -> None:
    import torch

    compute = _matmuls()

    def step(i: int) -> None:
        if i == 1:
            torch.empty(2 * GIB, dtype=torch.uint8).to("cuda")  # pageable, once
        compute(i)

    _record(path, step)


def cpu_only(path: Path) -> None:
    _record(path, _matmuls(), cuda=False)


RECORD = {"first_batch": first_batch, "cpu_only": cpu_only}


def check(case: str, doc: dict) -> tuple[bool, str] | None:
    m, verdict = doc["metrics"], doc["verdict"]
    raised = {f["id"] for f in doc["findings"] if f["severity"] in ("warning", "critical")}
    if case in ("copy_h2d", "copy_d2h"):
        row = m["busy"]["classes"]["h2d" if case == "copy_h2d" else "d2h"]
        top = next((f for f in doc["findings"] if f["id"] == "copy-bound"), None)
        ok = verdict == "copy-bound" and row["bytes"] > 0 and bool(row["gb_per_s"])
        ok = ok and top is not None and "GB/s" in top["evidence"]
        return ok, (f"{row['bytes'] / GIB:.2f} GiB at {row['gb_per_s']} GB/s, "
                    f"{row.get('link_pct')}% of {(m['busy']['link'] or {}).get('name')}")
    if case == "final_read":
        return "host-sync" not in raised, f"d2h reads blocked {m['sync']['d2h_read_blocked_pct']}%"
    if case == "compiled":
        top = (m.get("idle_attribution", {}).get("launch", {}).get("top") or [["?"]])[0][0]
        return verdict == "launch-bound", f"launch path mostly in {top}"
    if case == "first_batch":
        offs = m["one_offs"]
        ok = bool(offs) and offs[0]["position"] == "first" and "copy-bound" not in raised
        return ok, f"one-offs {offs}"
    if case == "cpu_only":
        ok = verdict != "healthy" and not raised & DEVICE_VERDICTS
        return ok and bool(m["trace"]["gpu_unrecorded"]), str(m["trace"]["gpu_unrecorded"])
    return None


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    try:
        import torch

        cuda = torch.cuda.is_available()
    except ImportError:
        cuda = False
    for name, record in RECORD.items():
        if cuda:
            record(out / f"{name}.pt.trace.json.gz")
        else:
            print(f"trace_classes.py: no CUDA here, {name} not recorded", file=sys.stderr)
    failed = 0
    for trace in sorted(out.glob("*.pt.trace.json.gz")):
        case = trace.name.split(".")[0]
        proc = subprocess.run([sys.executable, "-m", "gputop", "analyze", "--json", str(trace)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            failed += 1
            print(f"FAIL  {case}: {proc.stderr.strip()[:300]}")
            continue
        doc = json.loads(proc.stdout)
        result = check(case, doc)
        if result is None:
            continue
        ok, figures = result
        failed += not ok
        print(f"{'PASS' if ok else 'FAIL'}  {case}: verdict {doc['verdict']}; {figures}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
