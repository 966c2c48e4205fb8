"""Which ranks gputop and PyTorch's own analyzer (torchfrtrace) name on real hung jobs.

    python benchmarks/bench_hang_attribution.py [DIR ...]

For every fixture of tests/data/fr/moe16 (16-rank Megatron-shaped gloo jobs recorded with
tests/scripts/record_moe_fixtures.py, faults injected on known ranks), and every DIR given
(a folder of dumps; "injected" unknown), it runs:

* ``gputop analyze --json`` (the cause finding's ``ranks``);
* ``python -m torch.distributed.flight_recorder.fr_trace`` from the installed torch (the ranks
  it lists as missing, or that it names in a mismatch). Gloo leaves a dump's pg_config empty,
  which fr_trace cannot read: it is given copies with each rank's groups filled in as NCCL
  states them (the job wrote them beside its dumps, groups/<rank>.json);

and prints per fixture the injected ranks, the ranks each names, and the time each took (for
torchfrtrace: the missing ranks of its first mismatch, "of" all the ranks it lists missing).
nvidia-resiliency-ext's attribution needs CUDA to install: not run here.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "data" / "fr" / "moe16"
INJECTED = {"sleep": [12], "sigstop": [5], "gil": [9], "two": [3, 14], "killed": [7]}
TIMEOUT_S = 300


def gputop(folder: Path) -> tuple[list[int] | str, float]:
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "gputop", "analyze", "--json", str(folder)],
                         capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT)
    took = time.perf_counter() - t0
    try:
        report = json.loads(out.stdout.splitlines()[0])
    except (IndexError, ValueError):
        return f"error: {(out.stderr.strip().splitlines() or ['no output'])[-1][:80]}", took
    findings = report.get("findings") or []
    return (sorted(findings[0]["ranks"]) if findings else []), took


def with_groups(folder: Path, groups: Path | None, into: Path) -> Path:
    """Copies of the pickles with pg_config filled from the job's groups/<rank>.json."""
    into.mkdir(parents=True, exist_ok=True)
    for f in sorted(folder.glob("nccl_trace_rank_*")):
        data = f.read_bytes()
        cfg = groups / f"{f.name.rsplit('_', 1)[-1]}.json" if groups else None
        if cfg is not None and cfg.exists():
            raw = pickle.loads(data)  # our own recording: trusted here
            raw["pg_config"] = json.loads(cfg.read_text())
            data = pickle.dumps(raw)
        (into / f.name).write_bytes(data)
    return into


_MISSING = re.compile(r"missing ranks?:?\s*\{([\d,\s]*)\}", re.I)


def torchfrtrace(folder: Path) -> tuple[list[int] | str, float, str]:
    t0 = time.perf_counter()
    try:
        out = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace",
                              str(folder), "-p", "nccl_trace_rank_", "--allow-incomplete-ranks"],
                             capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return "timeout", TIMEOUT_S, ""
    took = time.perf_counter() - t0
    text = out.stdout + out.stderr
    if out.returncode != 0 and "Traceback" in text:
        last = text.strip().splitlines()[-1]
        return f"error: {last[:80]}", took, text
    named: set[int] = set()
    first: list[int] | None = None
    for m in _MISSING.finditer(text):
        ranks = [int(x) for x in m.group(1).replace(",", " ").split()]
        first = sorted(ranks) if first is None else first
        named.update(ranks)
    return (f"{first or []} of {sorted(named)}" if named else []), took, text


def main(argv: list[str]) -> int:
    try:
        import torch  # noqa: F401
    except ImportError:
        print("torch is not installed: pip install torch==2.13.0 (CPU)")
        return 1
    cases: list[tuple[str, Path, Path | None, list[int] | None]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for scenario, injected in INJECTED.items():
            archive = FIXTURES / f"{scenario}.tar.xz"
            if not archive.exists():
                continue
            with tarfile.open(archive) as tar:
                tar.extractall(tmp, filter="data")  # file times kept
            base = Path(tmp) / scenario
            groups = base / "groups" if (base / "groups").is_dir() else None
            cases.append((f"{scenario}/pickle", base / "pickle", groups, injected))
            cases.append((f"{scenario}/json", base / "json", None, injected))
        for d in argv:
            cases.append((os.path.basename(d.rstrip("/")) or d, Path(d), None, None))
        print(f"{'fixture':<16} {'injected':<10} {'gputop':<12} {'s':>5}  "
              f"{'torchfrtrace: first of all missing':<50} {'s':>5}")
        ok = True
        for label, folder, groups, injected in cases:
            g_ranks, g_s = gputop(folder)
            if label.endswith("/json"):
                t_ranks, t_s = "(reads pickles only)", 0.0
            else:
                fed = with_groups(folder, groups, Path(tmp) / "fed" / label.replace("/", "_"))
                t_ranks, t_s, _ = torchfrtrace(fed)
            good = injected is None or g_ranks == injected
            ok &= good
            print(f"{label:<16} {str(injected or '?'):<10} {str(g_ranks):<12} {g_s:5.1f}  "
                  f"{str(t_ranks)[:50]:<50} {t_s:5.1f}" + ("" if good else "  <- wrong"))
    print("gputop names exactly the injected ranks on every fixture" if ok else
          "gputop is wrong on some fixture")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
