"""What the benchmarks share: their command line, spreads over runs, ratios against the peer, and
the markdown tables they print. Each script still measures its own thing; this only keeps the
arithmetic and the shape of the output the same everywhere.

    from harness import markdown_table, parser, ratio, spread
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Sequence


def parser(doc: str | None, runs: int | None = None) -> argparse.ArgumentParser:
    """An ArgumentParser whose --help is the script's docstring; ``runs``: add --runs with
    that default (side-by-side repetitions)."""
    out = argparse.ArgumentParser(description=doc,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    if runs is not None:
        out.add_argument("--runs", type=int, default=runs,
                         help=f"side-by-side runs (default {runs}); figures are min / median / max")
    return out


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile, q a fraction (0.95: p95)."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def spread(values: Sequence[float], fmt: str = "{:.2f}") -> str:
    """min / median / max, formatted."""
    if not values:
        return "-"
    return " / ".join(fmt.format(v) for v in (min(values), statistics.median(values),
                                              max(values)))


def ratio(ours: float, peer: float) -> float:
    """ours / peer; nan where the peer measured nothing."""
    return ours / peer if peer else math.nan


def ratios(ours: Sequence[float], peer: Sequence[float]) -> list[float]:
    """Per-run ratios of paired runs (run i against run i)."""
    return [ratio(a, b) for a, b in zip(ours, peer)]


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A markdown table (what the docs and resolve notes quote)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def side_by_side_ready(name: str) -> bool:
    """Whether the tmux side-by-side runs against nvitop can run here (else says why on stderr):
    tmux on the PATH and nvitop installed (the bench extra)."""
    import shutil
    import sys

    if shutil.which("tmux") is None:
        print(f"{name}: needs tmux", file=sys.stderr)
        return False
    try:
        import nvitop  # noqa: F401
    except ImportError:
        print(f"{name}: needs nvitop: pip install -e '.[bench]'", file=sys.stderr)
        return False
    return True


def warm_start(package: str) -> None:
    """A warm start, as after the first run: the package's modules compiled (an environment with
    PYTHONDONTWRITEBYTECODE would otherwise compile them on every start; nvitop's were compiled
    when pip installed it)."""
    import subprocess
    import sys

    subprocess.run([sys.executable, "-m", "compileall", "-q", package], check=False,
                   capture_output=True)
