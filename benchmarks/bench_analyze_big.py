"""`gputop analyze` on real traces of 1 GB and more: wall time and peak memory.

The trace is made by a real profiler run, not by repeating a file's events: the Python-heavy
input pipeline of tests/scripts/capture_jobs.py (``decode_sample`` in ``__getitem__``, a tiny
model) trained under ``torch.profiler.profile(with_stack=True)`` for as many steps as the size
asks (measured with a one-step probe first), exported with ``export_chrome_trace``. The
profiler holds ~7 bytes of memory per byte of JSON it will write, so a trace larger than
``--part-gb`` is made of several such runs, one process each, whose events are written one
after the other into one trace (each run's own events, at their own times; nothing repeated).

Then `gputop analyze --json TRACE` runs in a fresh process (start-up included, as a user runs
it) and the script prints its wall time, its peak RSS (wait4), the events it read and what it
cut to stay within its memory bound (--max-events, 3 000 000 by default).

    python benchmarks/bench_analyze_big.py [--gb 1] [--part-gb 1] [--out DIR] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PROFILE = r"""
import os, sys, time
sys.path.insert(0, sys.argv[4])
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile
from torch.utils.data import DataLoader
from capture_jobs import FEATURES, PythonDataset

steps, work, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
batches = iter(DataLoader(PythonDataset(work), batch_size=16, num_workers=0))
with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
    for _ in range(steps):
        x, y = next(batches)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        prof.step()
prof.export_chrome_trace(out)
print(os.path.getsize(out))
"""

LAUNCHER = """
import json, os, sys, time
cmd, report = json.loads(sys.argv[1]), sys.argv[2]
start = time.perf_counter()
with open(report + ".out", "wb") as out:
    pid = os.posix_spawn(cmd[0], cmd, os.environ, file_actions=[(os.POSIX_SPAWN_DUP2,
                         out.fileno(), 1)])
    _, status, usage = os.wait4(pid, 0)
with open(report, "w") as fh:
    json.dump({"wall": time.perf_counter() - start, "rss_kib": usage.ru_maxrss,
               "cpu": usage.ru_utime + usage.ru_stime,
               "code": os.waitstatus_to_exitcode(status)}, fh)
"""

WORK = 20000  # decoder iterations per sample: ~180 MB of JSON per step with the tracer


def profile_run(steps: int, out: Path) -> int:
    done = subprocess.run([sys.executable, "-c", PROFILE, str(steps), str(WORK), str(out),
                           str(REPO / "tests" / "scripts")],
                          capture_output=True, text=True, env=dict(os.environ,
                                                                    OMP_NUM_THREADS="1"))
    if done.returncode != 0:
        raise RuntimeError(f"profiler run failed: {done.stderr.strip()[-500:]}")
    return int(done.stdout.strip().splitlines()[-1])


def merge(parts: list[Path], out: Path) -> None:
    """One trace of every part's events, in order, with the first part's header."""
    import msgspec

    from gputop.core.trace_stream import EventSplitter

    raws = msgspec.json.Decoder(list[msgspec.Raw])
    header = None
    with open(out, "wb") as sink:
        sink.write(b'{"traceEvents": [\n')
        first = True
        for part in parts:
            with open(part, "rb") as fh:
                splitter = EventSplitter(fh.read, raws.decode)
                for batch in splitter:
                    for raw in batch:
                        sink.write((b"" if first else b",\n") + bytes(raw))
                        first = False
                if header is None:
                    header = json.loads(splitter.header)
            part.unlink()
        header.pop("traceEvents", None)
        sink.write(b"\n],\n" + json.dumps(header)[1:].encode())


def build(gb: float, part_gb: float, directory: Path) -> Path:
    probe = directory / "probe.json"
    per_step = profile_run(1, probe)
    probe.unlink()
    target = gb * 1e9
    parts, made = [], 0
    while made < target:
        size = min(part_gb * 1e9, target - made)
        steps = max(1, round(size / per_step + 0.49))
        part = directory / f"part{len(parts)}.json"
        t0 = time.monotonic()
        made += profile_run(steps, part)
        print(f"  profiler run {len(parts) + 1}: {steps} steps, {part.stat().st_size / 1e9:.2f} "
              f"GB of JSON in {time.monotonic() - t0:.0f} s", flush=True)
        parts.append(part)
    if len(parts) == 1:
        return parts[0].rename(directory / "trace.json")
    out = directory / "trace.json"
    merge(parts, out)
    return out


def analyze(trace: Path) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "r.json"
        cmd = [sys.executable, "-m", "gputop", "analyze", "--json", str(trace)]
        env = dict(os.environ, PYTHONPATH=str(REPO))
        subprocess.run([sys.executable, "-S", "-c", LAUNCHER, json.dumps(cmd), str(report)],
                       env=env, cwd=tmp, check=True)
        r = json.loads(report.read_text())
        out = (Path(tmp) / "r.json.out").read_text()
    analysis = json.loads(out.splitlines()[-1]) if out.strip() else {}
    return {**r, "analysis": analysis}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gb", type=float, default=1.0, help="size of the trace's JSON")
    parser.add_argument("--part-gb", type=float, default=1.0,
                        help="JSON per profiler run (the run holds ~7x this in memory)")
    parser.add_argument("--out", type=Path, default=None, help="directory for the trace")
    parser.add_argument("--keep", action="store_true", help="keep the trace")
    parser.add_argument("--trace", type=Path, default=None, help="analyse this trace instead")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    directory = Path(tempfile.mkdtemp(prefix="gputop-big-", dir=args.out))
    try:
        if args.trace is None:
            print(f"building a {args.gb:g} GB trace with real profiler runs (with_stack=True)",
                  flush=True)
            trace = build(args.gb, args.part_gb, directory)
        else:
            trace = args.trace
        size = trace.stat().st_size
        r = analyze(trace)
        a = r["analysis"]
        print(f"gputop analyze {trace.name}: {size / 1e9:.2f} GB of JSON, "
              f"{(a.get('metrics') or {}).get('trace', {}).get('events', 0):,} events")
        print(f"  exit {r['code']}, wall {r['wall']:.1f} s, CPU {r['cpu']:.1f} s, "
              f"peak RSS {r['rss_kib'] / 1024:.0f} MiB")
        print(f"  verdict: {a.get('verdict')}; cut: {'; '.join(a.get('cut') or []) or 'nothing'}")
        if args.keep and args.trace is None:
            print(f"  kept: {trace}")
    finally:
        if not args.keep:
            shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
