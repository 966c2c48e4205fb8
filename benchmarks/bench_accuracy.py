"""Accuracy of `gputop analyze` on the labelled real traces in ../shared/traces.

For every trace in ``MANIFEST.tsv`` with an ``expected`` column, run ``gputop analyze --json``
exactly as a user would (one process for all traces) and check each token of that column, as
``../shared/README.md`` defines them:

- ``ID``            the finding is raised at warning or worse;
- ``not:ID``        the finding is absent or info only (a tempting false alarm);
- ``healthy``       the verdict is healthy;
- ``verdict:A|B``   the verdict is one of these ids;
- a trace with ``ID`` tokens and no ``verdict:`` token: the verdict is one of its ``ID``s;
- an empty column: the trace loads and the report says what it assessed and what it did not.

Tokens may be short forms of catalogue ids (``sync`` for ``host-sync``, ``dataloader`` for
``dataloader-stall``): a token names the one id that has it as a hyphen-separated part.

Prints one line per check (PASS/FAIL with what was found) and the score.

    python benchmarks/bench_accuracy.py [--traces DIR] [--json]

Exit status 0 when every check passes, 1 otherwise, 2 when the traces are missing.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gputop.diagnostics.findings import CATALOGUE  # noqa: E402

DEFAULT_TRACES = REPO.parent / "shared" / "traces"
ACTIONABLE = {"warning", "critical"}


def resolve_id(token: str) -> str:
    """The catalogue id a manifest token names: the id itself, or the one id that has the token
    as a hyphen-separated part (``sync`` -> ``host-sync``)."""
    if token in CATALOGUE:
        return token
    matches = [fid for fid in CATALOGUE if token in fid.split("-")]
    if len(matches) != 1:
        raise SystemExit(f"bench_accuracy: manifest token {token!r} names no single finding id")
    return matches[0]


@dataclass
class Check:
    trace: str
    what: str
    ok: bool
    found: str


def checks_for(name: str, expected: str, result: dict | None, error: str | None) -> list[Check]:
    if result is None:
        return [Check(name, "loads", False, error or "no result")]
    findings = result["findings"]
    raised = {f["id"] for f in findings if f["severity"] in ACTIONABLE}
    shown = ", ".join(f"{f['id']}:{f['severity']}" for f in findings) or "no findings"
    found = f"verdict {result['verdict']}; {shown}"
    tokens = [t.strip() for t in expected.split(",") if t.strip()]
    out: list[Check] = []
    if not tokens:
        ok = bool(result.get("assessed")) and bool(result.get("not_assessed"))
        return [Check(name, "loads and says what it assessed and what not", ok, found)]
    plain: list[str] = []
    has_verdict = False
    for tok in tokens:
        if tok == "healthy":
            out.append(Check(name, "verdict healthy", result["verdict"] == "healthy", found))
        elif tok.startswith("not:"):
            fid = resolve_id(tok[4:])
            out.append(Check(name, f"no {fid} at warning or worse", fid not in raised, found))
        elif tok.startswith("verdict:"):
            has_verdict = True
            allowed = [resolve_id(t) for t in tok[8:].split("|")]
            out.append(
                Check(name, f"verdict in {'|'.join(allowed)}", result["verdict"] in allowed, found)
            )
        else:
            fid = resolve_id(tok)
            plain.append(fid)
            out.append(Check(name, f"{fid} at warning or worse", fid in raised, found))
    if plain and not has_verdict:
        out.append(
            Check(name, f"verdict in {'|'.join(plain)}", result["verdict"] in plain, found)
        )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=Path, default=DEFAULT_TRACES, help="folder with MANIFEST.tsv")
    ap.add_argument("--json", action="store_true", help="print the checks as JSON Lines")
    args = ap.parse_args()
    manifest = args.traces / "MANIFEST.tsv"
    if not manifest.is_file():
        print(f"bench_accuracy: {manifest} not found", file=sys.stderr)
        return 2
    with manifest.open(newline="") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    paths = [str(args.traces / row["file"]) for row in rows]
    proc = subprocess.run(
        [sys.executable, "-m", "gputop", "analyze", "--json", *paths],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    results: dict[str, dict] = {}
    for line in proc.stdout.splitlines():
        doc = json.loads(line)
        results[doc["file"]] = doc
    errors = {line.split(":", 1)[0]: line for line in proc.stderr.splitlines() if line}
    checks: list[Check] = []
    for row, path in zip(rows, paths):
        checks.extend(
            checks_for(row["file"], row.get("expected") or "", results.get(path), errors.get(path))
        )
    width = max(len(c.trace) for c in checks)
    for c in checks:
        if args.json:
            print(json.dumps(c.__dict__))
        else:
            print(f"{'PASS' if c.ok else 'FAIL'}  {c.trace:<{width}}  {c.what:<44}  {c.found}")
    passed = sum(c.ok for c in checks)
    traces_ok = sum(
        all(c.ok for c in checks if c.trace == row["file"]) for row in rows
    )
    print(
        f"score: {passed}/{len(checks)} checks pass ({100 * passed / len(checks):.1f}%), "
        f"{traces_ok}/{len(rows)} traces fully right"
    )
    return 0 if passed == len(checks) else 1


if __name__ == "__main__":
    sys.exit(main())
