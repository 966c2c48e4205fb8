"""Memory captures and out-of-memory reports on a real GPU, through gputop as a user runs it
(issue 31, acceptance 1 and 3 on CUDA). Prints PASS/FAIL lines; exits 1 on any FAIL.

    python benchmarks/gpu/memory_check.py            # on a CUDA machine (< 60 s on an H200)
    python benchmarks/gpu/memory_check.py --device cpu   # the same checks without a GPU

1. growth: a CUDA job (tests/scripts/memory_jobs.py grow) under `gputop run` keeps a new
   64 MiB tensor every step (16 MiB with --device cpu); `gputop memory PID --steps 3 --json` must name the appending line
   and 64 MiB per step, from the CUDA caching allocator's history, with what keeps it, and
   the allocator's segments (reserved versus allocated);
2. oom: a CUDA job capped at 2 % of the GPU's memory (torch.cuda.set_per_process_memory_fraction)
   keeps 256 MiB a step until torch.cuda.OutOfMemoryError ends it; `gputop memory --last-oom PID
   --json` must read the report the agent wrote from the allocator's out-of-memory observer
   (then marked fatal by the uncaught error), naming the failing line, the size asked for and
   what held the memory.

With ``--device cpu`` the same jobs run on the CPU (the profiler's route; the OOM from an
address-space limit): a dry run of the script. What differs on CUDA is printed beside each
check (the instrument, the allocator's figures, the timings).
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

REPO = Path(__file__).resolve().parents[2]
JOBS = REPO / "tests" / "scripts" / "memory_jobs.py"
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(JOBS.parent))
from memory_jobs import APPEND_LINE  # noqa: E402

MIB = 1 << 20
DEADLINE_S = 55.0  # the whole check, on an H200
failures: list[str] = []


def report(ok: bool, name: str, detail: str) -> None:
    print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
    if not ok:
        failures.append(name)


def gputop(*args: str) -> list[str]:
    return [sys.executable, "-m", "gputop", *args]


def left(started: float) -> float:
    return max(5.0, DEADLINE_S - (time.monotonic() - started))


def check_growth(device: str, env: dict, started: float) -> None:
    # 64 MiB a step on the GPU (the H200 job of the issue); a quarter of it on a CPU's RAM.
    grow_mib = 64 if device.startswith("cuda") else 16
    job = subprocess.Popen(gputop("run", "--", sys.executable, str(JOBS), "grow", "--device",
                                  device, "--grow-mib", str(grow_mib),
                                  "--max-mib", str(64 * grow_mib), "--step-ms", "100"),
                           env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    try:
        first = job.stdout.readline().strip()
        if first != "training":
            report(False, "growth", f"the job did not start: {job.stderr.read()[-300:]}")
            return
        from gputop.client.agents import agent_status

        deadline = time.monotonic() + left(started) / 2
        while time.monotonic() < deadline and (agent_status(job.pid, 5.0) or {}).get(
                "steps", 0) < 5:
            time.sleep(0.1)
        t0 = time.monotonic()
        done = subprocess.run(gputop("memory", str(job.pid), "--steps", "3", "--json"),
                              env=env, cwd=REPO, capture_output=True, text=True,
                              timeout=left(started))
        took = time.monotonic() - t0
    finally:
        job.kill()
        job.wait(30)
    if done.returncode != 0:
        report(False, "growth", f"gputop memory exited {done.returncode}: "
                                f"{done.stderr.strip()[-300:]}")
        return
    out = json.loads(done.stdout)
    top = out["growth"][0] if out["growth"] else {}
    expected_source = "allocator-history" if device.startswith("cuda") else "profiler"
    report(out["source"] == expected_source, "growth: instrument",
           f"source {out['source']} on {out['device']} (expected {expected_source})")
    report(Path(top.get("file") or "") == JOBS and top.get("line") == APPEND_LINE,
           "growth: the appending line",
           f"{top.get('file')}:{top.get('line')} {top.get('function')} "
           f"(expected {JOBS.name}:{APPEND_LINE})")
    report(top.get("bytes_per_step") == grow_mib * MIB, "growth: bytes per step",
           f"{(top.get('bytes_per_step') or 0) / MIB:.2f} MiB per step over "
           f"{out['steps']} step(s) (expected {grow_mib}); kept by: {top.get('kept_by')}")
    alloc = out.get("allocator") or {}
    if device.startswith("cuda"):
        segments = alloc.get("segments") or {}
        report(bool(alloc.get("reserved")) and segments.get("count", 0) > 0,
               "growth: reserved vs allocated",
               f"reserved {alloc.get('reserved', 0) / MIB:.0f} MiB, allocated "
               f"{alloc.get('allocated', 0) / MIB:.0f} MiB, {segments.get('count')} segments, "
               f"non-releasable {alloc.get('inactive_split', 0) / MIB:.0f} MiB; "
               f"verdicts: {[v['id'] for v in out['verdicts']]}")
    cap = out.get("capture") or {}
    print(f"     timings: command {took:.1f} s, training thread blocked "
          f"{(cap.get('blocked_s') or 0) * 1e3:.1f} ms, analysis {out.get('analysis_s')} s, "
          f"{out.get('events')} events, report {cap.get('bytes')} bytes; cut: {out['cut']}")


def check_oom(device: str, env: dict, started: float, captures: Path) -> None:
    args = ["oom", "--device", device, "--step-ms", "10"]
    args += ["--grow-mib", "256", "--fraction", "0.02"] if device.startswith("cuda") else [
        "--grow-mib", "64", "--headroom-mib", "512"]
    job = subprocess.run(gputop("run", "--", sys.executable, str(JOBS), *args), env=env,
                         cwd=REPO, capture_output=True, text=True, timeout=left(started))
    pid_files = sorted(captures.glob("*.oom.json"))
    died = job.returncode != 0 and ("OutOfMemoryError" in job.stderr
                                    or "can't allocate memory" in job.stderr)
    report(died, "oom: the job died of it",
           f"exit {job.returncode}, {(job.stderr.strip().splitlines() or ['?'])[-1][:160]}")
    if not pid_files:
        report(False, "oom: report written", f"no *.oom.json in {captures}")
        return
    pid = int(pid_files[-1].name.split("_", 1)[1].split(".", 1)[0])
    done = subprocess.run(gputop("memory", "--last-oom", str(pid), "--json"), env=env,
                          cwd=REPO, capture_output=True, text=True, timeout=left(started))
    if done.returncode != 0:
        report(False, "oom: --last-oom reads it", done.stderr.strip()[-300:])
        return
    out = json.loads(done.stdout)
    oom = out.get("oom") or {}
    where = oom.get("where") or {}
    report(out["kind"] == "oom" and oom.get("fatal") is True, "oom: --last-oom reads it",
           f"{out['report']} ({out['device']}, {oom.get('exception')}, fatal {oom.get('fatal')},"
           f" built in {out.get('report_s')} s)")
    report(where.get("line") == APPEND_LINE, "oom: the failing line",
           f"{where.get('file')}:{where.get('line')} {where.get('function')}")
    asked = 256 * MIB if device.startswith("cuda") else 64 * MIB
    report(oom.get("requested") == asked, "oom: the size asked for",
           f"{(oom.get('requested') or 0) / MIB:.0f} MiB (expected {asked // MIB})")
    held = ((out.get("census") or {}).get("held_by") or [{}])[0]
    report("history" in (held.get("what") or ""), "oom: what held the memory",
           f"{(held.get('bytes') or 0) / MIB:.0f} MiB in {held.get('what')}")
    if device.startswith("cuda"):
        alloc = out.get("allocator") or {}
        report(out["source"] == "allocator-state" and bool(alloc.get("device_total")),
               "oom: the allocator at the error",
               f"source {out['source']}, reserved {alloc.get('reserved', 0) / MIB:.0f} MiB, "
               f"allocated {alloc.get('allocated', 0) / MIB:.0f} MiB, device free "
               f"{(oom.get('device_free') or 0) / MIB:.0f} MiB of "
               f"{(oom.get('device_total') or 0) / MIB:.0f}; verdicts "
               f"{[v['id'] for v in out['verdicts']]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (a dry run)")
    args = parser.parse_args()
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="gputop-memory-check-"))
    runtime = work / "run"
    runtime.mkdir(mode=0o700)
    captures = work / "captures"
    os.environ.update(XDG_RUNTIME_DIR=str(runtime), GPUTOP_CAPTURE_DIR=str(captures))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    try:
        check_growth(args.device, env, started)
        check_oom(args.device, env, started, captures)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    total = time.monotonic() - started
    report(total < 60.0, "time", f"{total:.1f} s in all (goal: under 60 s on an H200)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
