"""benchmarks/README.md names every benchmark script, and the shared harness computes what the
scripts print."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"


def test_the_readme_names_every_script():
    text = (BENCH / "README.md").read_text(encoding="utf-8")
    scripts = [p for p in BENCH.rglob("*") if p.suffix in (".py", ".sh")]
    assert len(scripts) > 40
    missing = [str(p.relative_to(BENCH)) for p in scripts
               if f"`{p.relative_to(BENCH)}`" not in text]
    assert not missing, f"benchmarks/README.md does not name {missing}"


def test_the_harness_spreads_and_ratios():
    sys.path.insert(0, str(BENCH))
    try:
        import harness
    finally:
        sys.path.remove(str(BENCH))
    assert harness.spread([3.0, 1.0, 2.0]) == "1.00 / 2.00 / 3.00"
    assert harness.percentile([float(i) for i in range(100)], 0.95) == 95.0
    assert harness.ratios([2.0, 3.0], [1.0, 0.0])[0] == 2.0
    table = harness.markdown_table(["a", "b"], [[1, 2]])
    assert table.splitlines() == ["| a | b |", "|---|---|", "| 1 | 2 |"]
