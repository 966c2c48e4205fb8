"""What a memory capture costs the job, and what it gives, against the peer (the profiler's
memory events with Python stacks, written as a trace: what one does by hand with
torch.profiler(profile_memory=True, with_stack=True), here `gputop capture --profile-memory
--with-stack`), on the memory test jobs (tests/scripts/memory_jobs.py) and on the capture
benchmark's Python-heavy input pipeline (tests/scripts/capture_jobs.py --kind getitem).

For each job (started with `gputop run` under a private agent directory) and each way:

- s: the command's wall time, start to exit;
- KB: what it wrote (the memory report; the gzip trace for the peer);
- step ratio: the job's mean step time from the instrument's start to the agent's reply over
  its mean step time outside (up to 30 steps before, 15 after), and in brackets the longest
  step then over the same mean;
- blocked ms: the training thread's time in the agent's capture code (start, the tracer's
  stop, the model's storages), and analysis s (reading the events on the agent's thread);
- what it named: the growth line and bytes per step, the peak's largest part.

Then the out-of-memory report: how long the agent takes to build it in a job at its limit.

Usage: python benchmarks/bench_memory.py [--jobs grow,activations,getitem] [--device cuda]
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_capture import end, step_ratio, wait_steps  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
MEMORY_JOBS = REPO / "tests" / "scripts" / "memory_jobs.py"
CAPTURE_JOBS = REPO / "tests" / "scripts" / "capture_jobs.py"
TIMEOUT_S = 600.0

# name -> (the job's command line without the device, steps to wait for before measuring)
JOBS = {
    "grow": ([str(MEMORY_JOBS), "grow", "--grow-mib", "1", "--max-mib", "1024"], 40),
    "activations": ([str(MEMORY_JOBS), "activations"], 20),
    "getitem": ([str(CAPTURE_JOBS), "--kind", "getitem"], 20),
}
WAYS = {
    "memory": ["memory", "--steps", "3", "--json"],
    "peer": ["capture", "--steps", "3", "--json", "--profile-memory", "--with-stack",
             "--no-stacks"],
}


def gputop(*args: str) -> list[str]:
    return [sys.executable, "-m", "gputop", *args]


def measure(pid: int, way: str, env: dict, log: Path, proc: subprocess.Popen) -> dict:
    t0 = time.time()
    done = subprocess.run(gputop(*WAYS[way][:1], str(pid), *WAYS[way][1:]), env=env,
                          cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S)
    t1 = time.time()
    row: dict = {"s": t1 - t0, "ok": done.returncode == 0}
    if done.returncode != 0:
        row["error"] = (done.stderr.strip().splitlines() or ["?"])[-1][:200]
        return row
    out = json.loads(done.stdout)
    cap = out["capture"]
    try:
        wait_steps(pid, (cap.get("recorded_steps") or 0) + 15, proc)
    except (RuntimeError, TimeoutError):
        pass
    if way == "memory":
        start, stop = cap.get("started_wall") or t0, cap.get("replied_wall") or t1
        row["kb"] = (cap.get("bytes") or 0) / 1e3
        row["blocked_ms"] = (cap.get("blocked_s") or 0) * 1e3
        row["analysis_s"] = out.get("analysis_s")
        top = out["growth"][0] if out["growth"] else None
        row["named"] = (f"{os.path.basename(top['file'] or '?')}:{top['line']} "
                        f"+{top['bytes_per_step'] / 2**20:.2f} MiB/step" if top else "no growth")
        parts = (out.get("peak") or {}).get("parts") or {}
        if parts:
            row["named"] += f"; peak mostly {max(parts, key=parts.get)}"
        row["steps"] = out["steps"]
        row["cut"] = len(out.get("cut") or [])
    else:
        start, stop = cap.get("profiler_started_wall") or t0, cap.get("replied_wall") or t1
        row["kb"] = (cap.get("bytes") or 0) / 1e3
        row["named"] = f"a trace of {cap.get('profiler_json_bytes', 0) / 1e6:.1f} MB of JSON"
        row["steps"] = cap.get("recorded_steps")
        row["cut"] = len(out.get("cut") or [])
    row["ratio"], row["worst"], _ = step_ratio(log, start, stop)
    return row


def run_job(name: str, device: str, ways: list[str], env: dict, work: Path) -> dict:
    args, warm = JOBS[name]
    log = work / f"{name}.steps"
    job = subprocess.Popen(gputop("run", "--", sys.executable, *args, "--device", device,
                                  "--step-log", str(log)), env=env, cwd=REPO,
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    rows = {}
    try:
        if not job.stdout.readline().startswith("training"):
            raise RuntimeError(f"{name}: the job did not start")
        wait_steps(job.pid, warm, job)
        for way in ways:
            rows[way] = measure(job.pid, way, env, log, job)
    finally:
        end(job)
    return rows


def oom_report_time(device: str, env: dict, captures: Path) -> dict:
    job = subprocess.run(gputop("run", "--", sys.executable, str(MEMORY_JOBS), "oom",
                                "--grow-mib", "16", "--step-ms", "10", "--device", device),
                         env=env, cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S)
    found = sorted(captures.glob("*.oom.json"))
    if not found:
        return {"ok": False, "exit": job.returncode}
    report = json.loads(found[-1].read_text())
    return {"ok": True, "exit": job.returncode, "report_s": report.get("report_s"),
            "kb": found[-1].stat().st_size / 1e3,
            "held": (report.get("census") or {}).get("held_by", [{}])[0].get("what")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", default=",".join(JOBS))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--no-peer", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gputop-bench-memory-"))
    runtime = work / "run"
    runtime.mkdir(mode=0o700)
    captures = work / "captures"
    # This process asks the agents for their steps too: the same socket directory.
    os.environ.update(XDG_RUNTIME_DIR=str(runtime), GPUTOP_CAPTURE_DIR=str(captures))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    ways = ["memory"] + ([] if args.no_peer else ["peer"])
    print(f"memory captures on {args.device}, load {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} cores")
    print(f"{'job':<12} {'way':<7} {'s':>6} {'KB':>8} {'ratio':>13} {'blocked ms':>11} "
          f"{'analysis s':>10} steps cut  named")
    try:
        for name in args.jobs.split(","):
            rows = run_job(name, args.device, ways, env, work)
            for way, r in rows.items():
                if not r["ok"]:
                    print(f"{name:<12} {way:<7} {r['s']:>6.1f}  failed: {r['error']}")
                    continue
                ratio = ("n/a" if r["ratio"] is None
                         else f"x{r['ratio']:.2f} (x{r['worst']:.1f})")
                blocked = f"{r['blocked_ms']:.1f}" if "blocked_ms" in r else "-"
                analysis = f"{r['analysis_s']:.2f}" if r.get("analysis_s") is not None else "-"
                print(f"{name:<12} {way:<7} {r['s']:>6.1f} {r['kb']:>8.1f} {ratio:>13} "
                      f"{blocked:>11} {analysis:>10} {r['steps']!s:>5} {r['cut']:>3}  "
                      f"{r['named']}")
        oom = oom_report_time(args.device, env, captures)
        if oom["ok"]:
            print(f"out-of-memory report: built in {oom['report_s'] * 1e3:.0f} ms, "
                  f"{oom['kb']:.1f} KB; held by: {oom['held']} (job exit {oom['exit']})")
        else:
            print(f"out-of-memory report: none written (job exit {oom['exit']})")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
