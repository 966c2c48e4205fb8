"""What a capture costs the job, and what it gives: the default capture against the profiler
with ``with_stack=True`` (the old default), on each test job of tests/test_capture_bounded.py
(tests/scripts/capture_jobs.py: one copy for both).

For each job, started with `gputop run` under a private agent directory, and each way of
capturing it (`gputop capture PID --steps 3 --json`, then the same with `--with-stack`), it
prints:

- capture s: the command's wall time, start to exit (Python start-up, waiting for a step
  boundary, warm-up and 3 recorded steps, export, py-spy's start and stop, the analysis);
- trace MB: the trace as written (gzip) and its JSON, and the JSON the profiler exported
  before the agent cut it to its budget (32 MB per recorded step);
- step ratio: the job's mean step time during the capture (the steps that overlap the time
  from the profiler's start to the agent's reply: the start, warm-up and recorded steps, the
  stop, the trace written on another thread) over its mean step time outside it (up to 30
  steps before and 15 after); goal <= 1.5 for the default. In brackets, the longest step
  during it over the same mean, and the mean ratio over the whole command's run (its Python
  start-up, py-spy and the analysis share the machine's cores with the job);
- verdict and where: what the capture named, and the line (py-spy, or the tracer's frames).

Then the figures of the former bench_capture_cli.py: how soon a capture reports a job that
exits in the middle of it (from the job's exit), and that a hung agent's status returns at
its timeout.

Usage: python benchmarks/bench_capture.py [--jobs NAME,...] [--no-baseline] [--device cuda]

On a GPU machine, `--device cuda` runs the same jobs with the model and the batches on the GPU
(`--jobs getitem-nw0,getitem-nw2,pin-memory,compile,step-2s,exits --no-baseline` first: the
baseline's tracer is the one that hurt the H200 job of issue 24).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
JOBS_SCRIPT = REPO / "tests" / "scripts" / "capture_jobs.py"
TIMEOUT_S = 600.0
DEVICE = ["cpu"]  # --device

# name -> (arguments of capture_jobs.py, steps to wait for before capturing)
JOBS = {
    "getitem-nw0": (["--kind", "getitem"], 20),
    "getitem-nw2": (["--kind", "getitem", "--workers", "2"], 20),
    "pin-memory": (["--kind", "getitem", "--pin-memory"], 20),
    "compile": (["--kind", "compile"], 20),
    "step-2s": (["--kind", "slow", "--step-s", "2"], 8),
    "exits": (["--kind", "exits", "--item-ms", "15"], 12),
}
# Jobs the baseline is not run on, and why (measured once; not worth a machine).
NO_BASELINE = {
    "step-2s": "not run: its logging loop makes millions of Python calls a second; traced, the "
               "job grew to 24 GB in seconds and the kernel's OOM killer ended it",
}
MODES = {"default": [], "with_stack": ["--with-stack"]}


def gputop(*args: str) -> list[str]:
    return [sys.executable, "-m", "gputop", *args]


def end(proc: subprocess.Popen) -> None:
    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.Error:
        tree = []
    for p in tree:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(tree, timeout=30)
    proc.wait()


def agent_steps(pid: int) -> int:
    from gputop.client.agents import agent_status

    return (agent_status(pid, timeout=10.0) or {}).get("steps") or 0


def wait_steps(pid: int, steps: int, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"job {pid} ended early")
        if agent_steps(pid) >= steps:
            return
        time.sleep(0.1)
    raise TimeoutError(f"job {pid} did not reach {steps} steps")


def steps_of(log: Path) -> list[tuple[float, float]]:
    out = []
    for line in log.read_text().splitlines():
        parts = line.split()
        if len(parts) == 3:
            out.append((float(parts[1]), float(parts[2])))
    return out


def step_ratio(log: Path, t0: float, t1: float) -> tuple[float | None, float | None, int]:
    """(mean step time of the steps that overlap [t0, t1], and the longest of them, each over
    the mean step time outside (up to 30 steps before, 15 after); how many steps)."""
    steps = steps_of(log)[3:]  # the first steps are start-up (compile, workers)
    during = [e - s for s, e in steps if e > t0 and s < t1]
    before = [e - s for s, e in steps if e <= t0][-30:]
    after = [e - s for s, e in steps if s >= t1][:15]
    outside = before + after
    if not during or not outside:
        return None, None, len(during)
    # Means, not medians: with DataLoader workers steps come in pairs (one waits for a batch,
    # the next finds one ready), and a median picks one of the two.
    usual = statistics.fmean(outside)
    return statistics.fmean(during) / usual, max(during) / usual, len(during)


def json_mb(trace: str) -> float:
    with gzip.open(trace, "rb") as f:
        return sum(len(c) for c in iter(lambda: f.read(1 << 20), b"")) / 1e6


def where_of(report: dict) -> str:
    top = next((f for f in report.get("findings", []) if f["id"] == report.get("verdict")), None)
    if top is not None and top.get("where"):
        return top["where"].split(": ", 1)[0]
    traced = [s for s in report.get("source_lines", []) if s.get("from") != "py-spy"]
    if traced and traced[0]["lines"]:
        return traced[0]["lines"][0]["frame"] + " (tracer)"
    return "-"


def capture(pid: int, env: dict, log: Path, mode: list[str], stop: Path | None,
            proc: subprocess.Popen) -> dict:
    t0 = time.time()
    cli = subprocess.Popen(gputop("capture", str(pid), "--steps", "3", "--json", *mode),
                           env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    exited_at = None
    if stop is not None:  # end the job once the capture records
        from gputop.client.agents import agent_status

        while cli.poll() is None:
            state = (agent_status(pid, timeout=10.0) or {}).get("capture") or {}
            if state.get("state") == "recording" and state.get("steps_done", 0) >= 1:
                stop.touch()
                proc.wait(TIMEOUT_S)
                exited_at = time.monotonic()
                break
            time.sleep(0.02)
    out, err = cli.communicate(timeout=TIMEOUT_S)
    t1 = time.time()
    last = err.strip().splitlines()[-1] if err.strip() else f"exit {cli.returncode}"
    row = {"capture_s": t1 - t0, "ok": cli.returncode == 0, "error": last[:300]}
    if exited_at is not None:
        row["exit_report_s"] = time.monotonic() - exited_at
    if cli.returncode != 0:
        return row
    report = json.loads(out)
    cap = report["capture"]
    row.update(gz_mb=(cap.get("bytes") or 0) / 1e6, json_mb=json_mb(report["trace"]),
               profiler_mb=(cap.get("profiler_json_bytes") or 0) / 1e6,
               verdict=report.get("verdict"), where=where_of(report),
               cut=len(report.get("cut") or []))
    time.sleep(0.5)
    if stop is None:
        steps_after = agent_steps(pid) + 15
        try:
            wait_steps(pid, steps_after, proc)
        except (RuntimeError, TimeoutError):
            pass
    # The capture acts on the job from the profiler's start (at a step boundary: the step
    # that ends there pays for the start) to the agent's reply (the steps recorded, the
    # profiler's stop, the trace written on another thread); py-spy samples from the request
    # on (it only reads the job's memory); the command's own work runs beside it all.
    start = cap.get("profiler_started_wall") or t0
    row["ratio"], row["worst"], row["steps_during"] = step_ratio(
        log, start, cap.get("replied_wall") or t1)
    row["ratio_cmd"], _, _ = step_ratio(log, t0, t1)
    return row


def run_job(name: str, modes: dict[str, list[str]], env: dict, work: Path) -> dict[str, dict]:
    """Every mode's capture of the job: one job for all of them, except the job that exits
    (a fresh one per capture)."""
    args, warm = JOBS[name]
    args = [*args, "--device", DEVICE[0]]
    rows: dict[str, dict] = {}
    modes = {m: a for m, a in modes.items() if m == "default" or name not in NO_BASELINE}
    runs = [[m] for m in modes] if name == "exits" else [list(modes)]
    for run in runs:
        log = work / f"{name}-{run[0]}.log"
        stop = work / f"{name}-{run[0]}.stop" if name == "exits" else None
        extra = ["--stop-file", str(stop)] if stop is not None else []
        job = subprocess.Popen(gputop("run", "--", sys.executable, str(JOBS_SCRIPT), *args,
                                      "--step-log", str(log), *extra),
                               env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        try:
            wait_steps(job.pid, warm, job)
            for i, mode_name in enumerate(run):
                rows[mode_name] = capture(job.pid, env, log, modes[mode_name], stop, job)
                if stop is None and i + 1 < len(run):  # the job back at its pace
                    wait_steps(job.pid, agent_steps(job.pid) + 15, job)
        finally:
            end(job)
    return rows


def hung_status_s() -> float:
    from gputop.client import agents as client

    directory = client.socket_dir(create=True)
    path = directory / f"{os.getpid()}.sock"
    hung = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    hung.bind(str(path))
    hung.listen(1)
    try:
        t0 = time.monotonic()
        assert client.agent_status(os.getpid(), timeout=0.3) is None
        return time.monotonic() - t0
    finally:
        hung.close()
        path.unlink(missing_ok=True)


def fmt(row: dict) -> str:
    if not row.get("ok"):
        return f"FAILED: {row.get('error')}"
    def x(key: str) -> str:
        return f"x{row[key]:.2f}" if row.get(key) is not None else "n/a"

    ratio, worst, ratio_cmd = x("ratio"), x("worst"), x("ratio_cmd")
    return (f"{row['capture_s']:6.1f} s  {row['gz_mb']:7.2f} MB gz {row['json_mb']:7.1f} MB JSON "
            f"(profiler {row['profiler_mb']:7.1f})  {ratio:>7} ({row['steps_during']} steps, "
            f"worst {worst}; command {ratio_cmd})  "
            f"{row['verdict']}: {row['where']}"
            + (f"  [cut: {row['cut']} notes]" if row.get("cut") else "")
            + (f"  [reported {row['exit_report_s']:.2f} s after the exit]"
               if "exit_report_s" in row else ""))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", default=",".join(JOBS), help="comma-separated job names")
    parser.add_argument("--no-baseline", action="store_true", help="the default capture only")
    parser.add_argument("--device", default="cpu",
                        help="the jobs' device: cuda runs the same jobs on a GPU (to be run "
                        "on a machine with one)")
    args = parser.parse_args()
    names = [n for n in args.jobs.split(",") if n]
    unknown = [n for n in names if n not in JOBS]
    if unknown:
        parser.error(f"unknown job(s): {', '.join(unknown)}; known: {', '.join(JOBS)}")
    modes = {"default": []} if args.no_baseline else MODES
    DEVICE[0] = args.device
    work = Path(tempfile.mkdtemp(prefix="gputop-bench-capture-"))
    os.chmod(work, 0o700)
    runtime = work / "xdg"
    runtime.mkdir(mode=0o700)
    os.environ["XDG_RUNTIME_DIR"] = str(runtime)  # the client in this process looks there
    env = dict(os.environ, XDG_RUNTIME_DIR=str(runtime), GPUTOP_CAPTURE_DIR=str(work / "caps"),
               PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    sys.path.insert(0, str(REPO))
    print(f"gputop capture --steps 3: {psutil.cpu_count()} cores, load "
          f"{os.getloadavg()[0]:.2f} at the start", flush=True)
    print(f"{'job':12s} {'capture':22s} {'capture s':>9s}  trace as written, JSON, the "
          "profiler's JSON  step ratio  verdict: where", flush=True)
    try:
        for name in names:
            rows = run_job(name, modes, env, work)
            for mode_name in modes:
                label = "default" if mode_name == "default" else "with_stack=True"
                text = fmt(rows[mode_name]) if mode_name in rows else NO_BASELINE[name]
                print(f"{name:12s} {label:22s} {text}", flush=True)
        print(f"hung agent: status returned after {hung_status_s():.2f} s (timeout 0.3 s)")
        print(f"load {os.getloadavg()[0]:.2f} at the end")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
