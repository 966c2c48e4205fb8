"""`gputop analyze` now against an earlier commit, on the same traces in the same run.

The gap-attribution engine replaced the step-role engine of commit 8cbd636; its cost must stay
within 1.2x of that engine's time and memory on every trace in ../shared/traces. This script
checks out REF in a temporary git worktree, then runs ``python -m gputop analyze --json TRACE``
from both trees, interleaved, ``--repeat`` times each (a fresh process per run, so times and
peak RSS include start-up and imports, as a user sees them), and prints per trace the best CPU
time (user + system: unlike wall time, it does not grow when other work shares the cores),
the best wall time, the median peak RSS, and the ratios new/old; then the worst and
geometric-mean ratios.

    python benchmarks/bench_analyze_change.py [--against REF] [--repeat N] [TRACE ...]

Peak RSS is read with wait4() from a small launcher, as benchmarks/bench_analyze.py does.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO.parent / "shared" / "traces"
BASELINE = "8cbd636"  # the last commit with the step-role engine

LAUNCHER = """
import json, os, sys, time
cmd, report = json.loads(sys.argv[1]), sys.argv[2]
start = time.perf_counter()
pid = os.posix_spawn(cmd[0], cmd, os.environ)
_, status, usage = os.wait4(pid, 0)
with open(report, "w") as fh:
    json.dump({"wall": time.perf_counter() - start, "rss_kib": usage.ru_maxrss,
               "cpu": usage.ru_utime + usage.ru_stime,
               "code": os.waitstatus_to_exitcode(status)}, fh)
"""


def measure(tree: Path, trace: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "r.json"
        cmd = [sys.executable, "-m", "gputop", "analyze", "--json", str(trace)]
        subprocess.run([sys.executable, "-S", "-c", LAUNCHER, json.dumps(cmd), str(report)],
                       env=env, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       check=True)
        r = json.loads(report.read_text())
    return {"wall": r["wall"], "cpu": r["cpu"], "rss": r["rss_kib"] / 1024, "ok": r["code"] == 0}


def geo(values: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="*", type=Path, help=f"default: all in {TRACES}")
    ap.add_argument("--against", default=BASELINE, help=f"git ref to compare with ({BASELINE})")
    ap.add_argument("--repeat", type=int, default=5, help="runs per tree and trace (5)")
    args = ap.parse_args()
    traces = args.traces or sorted(p for p in TRACES.glob("*.json*") if p.is_file())
    if not traces:
        print(f"bench_analyze_change: no traces given and none in {TRACES}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "old"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(old),
                        args.against], check=True)
        try:
            return compare(traces, old, args)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(old)],
                           check=False)


def compile_tree(tree: Path) -> None:
    """Byte-compile a tree's package, as `pip install` does: otherwise (with
    PYTHONDONTWRITEBYTECODE set, or a read-only tree) every run would pay for compiling the
    sources, and the larger tree would look slower for it."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "gputop")], check=True)


def compare(traces: list[Path], old: Path, args) -> int:
    compile_tree(old)
    compile_tree(REPO)
    print(f"gputop analyze, working tree vs {args.against}: best wall of {args.repeat} "
          f"interleaved runs, median peak RSS; load {os.getloadavg()[0]:.2f} on "
          f"{os.cpu_count()} CPUs")
    print(f"{'trace':<40} {'cpu old':>7} {'new':>6} {'ratio':>6} {'wall old':>8} {'new':>6} "
          f"{'MiB old':>8} {'new':>6} {'ratio':>6}")
    cpus, walls, mems = [], [], []
    for trace in traces:
        runs = {"old": [], "new": []}
        for _ in range(args.repeat):
            runs["old"].append(measure(old, trace))
            runs["new"].append(measure(REPO, trace))
        if not all(r["ok"] for rs in runs.values() for r in rs):
            print(f"{trace.name[:40]:<40} a run failed")
            continue
        o_c, n_c = (min(r["cpu"] for r in runs[k]) for k in ("old", "new"))
        o_w, n_w = (min(r["wall"] for r in runs[k]) for k in ("old", "new"))
        o_m, n_m = (statistics.median(r["rss"] for r in runs[k]) for k in ("old", "new"))
        cpus.append(n_c / o_c)
        walls.append(n_w / o_w)
        mems.append(n_m / o_m)
        print(f"{trace.name[:40]:<40} {o_c:7.2f} {n_c:6.2f} {n_c / o_c:6.2f} {o_w:8.2f} "
              f"{n_w:6.2f} {o_m:8.0f} {n_m:6.0f} {n_m / o_m:6.2f}")
    if cpus:
        print(f"CPU time ratio: geometric mean {geo(cpus):.2f}, worst {max(cpus):.2f}; wall "
              f"time ratio: geometric mean {geo(walls):.2f}, worst {max(walls):.2f}; memory "
              f"ratio: geometric mean {geo(mems):.2f}, worst {max(mems):.2f} (goal: worst <= 1.2)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
