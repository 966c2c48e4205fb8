"""Benchmark `gputop analyze` against Holistic Trace Analysis on the same real traces.

Every run is a fresh Python process, so wall time and peak memory include interpreter start-up,
imports and parsing: what a user waits for. For each trace it runs

- ``gputop analyze --json TRACE``: the CLI as users run it;
- the gputop engine alone: ``diagnostics.trace.analyze_trace`` in a bare interpreter (what
  ``gputop capture`` runs after a capture), which shows the CLI's own start-up cost apart;
- Holistic Trace Analysis: its temporal breakdown and idle-time breakdown
  (``pip install 'gputop[bench]'``),

``--repeat`` times each, interleaved, and prints the best wall time (as timeit does: background
load only ever adds time), the median peak RSS, the ratios, and both GPU-idle percentages
(gputop's ``metrics.temporal.idle_pct`` is defined as HTA's ``idle_time_pctg``).
Goal: at least 5x faster, at most half the memory, idle within 2 points.

    python benchmarks/bench_analyze.py [TRACE ...] [--repeat N]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
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

ENGINE = """
import json, sys
from gputop.diagnostics.trace import analyze_trace
a = analyze_trace(sys.argv[1])
with open(sys.argv[2], "w") as fh:
    json.dump({"idle": a.metrics["temporal"]["idle_pct"],
               "gpu": a.metrics["trace"]["gpu_activity"], "verdict": a.verdict}, fh)
"""

HTA = """
import json, os, sys, tempfile, warnings
warnings.filterwarnings("ignore")
from hta.trace_analysis import TraceAnalysis
trace, result = sys.argv[1], sys.argv[2]
with tempfile.TemporaryDirectory() as d:
    # HTA reads a directory of traces; give it one holding just this file.
    os.symlink(os.path.abspath(trace), os.path.join(d, os.path.basename(trace)))
    analyzer = TraceAnalysis(trace_dir=d)
    temporal = analyzer.get_temporal_breakdown(visualize=False)
    rank = int(temporal["rank"].iloc[0])
    idle, _ = analyzer.get_idle_time_breakdown(ranks=[rank], visualize=False)
    with open(result, "w") as fh:
        json.dump({"idle": float(temporal["idle_time_pctg"].iloc[0]), "rank": rank}, fh)
"""

# Peak RSS is taken by a tiny launcher, not by this process: on Linux a child's ru_maxrss
# includes the image it was forked from, so the measured program must be forked from a small
# process. The launcher (no site, no subprocess module) is a few MiB; both tools pay it.
LAUNCHER = """
import json, os, sys, time
cmd, report = json.loads(sys.argv[1]), sys.argv[2]
start = time.perf_counter()
pid = os.posix_spawn(cmd[0], cmd, os.environ)
_, status, usage = os.wait4(pid, 0)
wall = time.perf_counter() - start
with open(report, "w") as fh:
    json.dump({"wall": wall, "rss_kib": usage.ru_maxrss,
               "code": os.waitstatus_to_exitcode(status)}, fh)
"""


def measured(cmd: list[str], env: dict) -> dict:
    """Run ``cmd`` through the launcher: wall seconds, peak RSS MiB, exit code, stdout, and the
    last line of stderr."""
    with tempfile.TemporaryDirectory() as tmp:
        report, out, err = (Path(tmp) / n for n in ("report.json", "out", "err"))
        with out.open("wb") as fo, err.open("wb") as fe:
            subprocess.run(
                [sys.executable, "-S", "-c", LAUNCHER, json.dumps(cmd), str(report)],
                stdout=fo,
                stderr=fe,
                env=env,
                cwd=REPO,
                check=True,
            )
        r = json.loads(report.read_text())
        tail = err.read_text(errors="replace").strip().splitlines()[-1:] or [""]
        return {
            "wall": r["wall"],
            "rss": r["rss_kib"] / 1024,
            "ok": r["code"] == 0,
            "stdout": out.read_text(errors="replace"),
            "error": tail[0],
        }


def run_tool(tool: str, trace: Path, env: dict) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        if tool == "cli":
            cmd = [sys.executable, "-m", "gputop", "analyze", "--json", str(trace)]
        elif tool == "engine":
            cmd = [sys.executable, "-c", ENGINE, str(trace), str(result)]
        else:
            cmd = [sys.executable, "-c", HTA, str(trace), str(result)]
        row = measured(cmd, env)
        if row["ok"] and tool == "cli":
            metrics = json.loads(row["stdout"])["metrics"]
            row["idle"] = metrics["temporal"]["idle_pct"]
            row["gpu"] = metrics["trace"]["gpu_activity"]
            row["events"] = metrics["trace"]["events"]
        elif row["ok"]:
            row.update(json.loads(result.read_text()))
        return row


def best_of(rows: list[dict]) -> dict:
    ok = [r for r in rows if r["ok"]]
    if not ok:
        return {"ok": False, "error": rows[-1]["error"]}
    out = dict(ok[-1])
    out["wall"] = min(r["wall"] for r in ok)
    out["rss"] = statistics.median(r["rss"] for r in ok)
    return out


def fmt_idle(row: dict) -> str:
    if row.get("gpu") is False:
        return "n/a (no GPU)"
    return f"{row['idle']:.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", nargs="*", type=Path, help=f"default: all in {TRACES}")
    parser.add_argument("--repeat", type=int, default=3, help="runs per tool and trace")
    args = parser.parse_args()
    if importlib.util.find_spec("hta") is None:
        print(
            "Holistic Trace Analysis is not installed: pip install 'gputop[bench]'", file=sys.stderr
        )
        return 2
    traces = args.traces or sorted(p for p in TRACES.glob("*.json*") if p.is_file())
    if not traces:
        print(f"no traces given and none in {TRACES}", file=sys.stderr)
        return 2
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    hta_version = importlib.metadata.version("holistictraceanalysis")
    baseline = measured([sys.executable, "-c", "pass"], env)

    print(f"gputop analyze vs Holistic Trace Analysis {hta_version}, a fresh process per run:")
    print(f"best wall time of {args.repeat} interleaved runs (start-up, imports and parsing")
    print("included) and median peak RSS.")
    print(
        f"Load average at start {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; an empty "
        f"Python start-up here: {baseline['wall']:.2f} s, {baseline['rss']:.0f} MiB.\n"
    )
    header = f"{'trace':<36} {'tool':<16} {'wall s':>7} {'peak MiB':>9} {'GPU idle %':>13}"
    print(header)
    print("-" * len(header))

    summary = []
    labels = {"cli": "gputop analyze", "engine": "gputop engine", "hta": "HTA"}
    for trace in traces:
        runs: dict[str, list[dict]] = {tool: [] for tool in labels}
        for _ in range(args.repeat):
            for tool in runs:
                runs[tool].append(run_tool(tool, trace, env))
        res = {tool: best_of(rows) for tool, rows in runs.items()}
        size = trace.stat().st_size / 2**20
        events = f", {res['cli']['events']:,} events" if res["cli"].get("events") else ""
        print(f"{trace.name[:36]:<36} ({size:.1f} MiB{events})")
        for tool, label in labels.items():
            r = res[tool]
            if r["ok"]:
                print(f"{'':<36} {label:<16} {r['wall']:>7.2f} {r['rss']:>9.0f} {fmt_idle(r):>13}")
            else:
                print(f"{'':<36} {label:<16} failed: {r['error'][:70]}")
        cli, eng, hta = res["cli"], res["engine"], res["hta"]
        if cli["ok"] and eng["ok"] and hta["ok"]:
            speed, mem = hta["wall"] / cli["wall"], cli["rss"] / hta["rss"]
            e_speed, e_mem = hta["wall"] / eng["wall"], eng["rss"] / hta["rss"]
            gpu = cli.get("gpu") is not False
            diff = abs(cli["idle"] - hta["idle"]) if gpu else float("nan")
            diff_txt = f"{diff:.2f} points" if gpu else "n/a"
            print(
                f"{'':<36} ratios: analyze {speed:.1f}x faster, {mem:.2f}x the memory; "
                f"engine {e_speed:.1f}x faster, {e_mem:.2f}x the memory; idle diff {diff_txt}"
            )
            summary.append((trace.name, speed, mem, e_speed, e_mem, diff))
        else:
            print(f"{'':<36} ratios: n/a (a tool could not analyse this trace)")
        print()

    if summary:
        _summarise(summary, len(traces))
    return 0


def _summarise(summary: list[tuple], n_traces: int) -> None:
    def geo(values) -> float:
        values = list(values)
        return math.exp(statistics.fmean(math.log(v) for v in values))

    print(f"Summary over the {len(summary)} of {n_traces} traces both tools analysed:")
    for label, si, mi in (("gputop analyze", 1, 2), ("gputop engine", 3, 4)):
        print(
            f"  {label:<15} {geo(s[si] for s in summary):.1f}x faster (geometric mean; "
            f"slowest {min(s[si] for s in summary):.1f}x), memory "
            f"{geo(s[mi] for s in summary):.2f}x HTA's (worst {max(s[mi] for s in summary):.2f}x)"
        )
    diffs = [s[5] for s in summary if not math.isnan(s[5])]
    if diffs:
        print(
            f"  GPU idle: largest difference {max(diffs):.2f} points over {len(diffs)} GPU traces"
        )
    for label, si, mi in (("gputop analyze", 1, 2), ("gputop engine", 3, 4)):
        met = [
            s for s in summary if s[si] >= 5 and s[mi] <= 0.5 and (math.isnan(s[5]) or s[5] <= 2)
        ]
        print(
            f"  goal (>=5x faster, <=0.5x memory, idle within 2 points) met by {label} on "
            f"{len(met)} of {len(summary)}"
        )


if __name__ == "__main__":
    raise SystemExit(main())
