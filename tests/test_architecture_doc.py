"""docs/ARCHITECTURE.md describes the house as it is: every file or folder it names in backticks
exists, and it does not open by pointing outside the repository."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "ARCHITECTURE.md"
# `collect/nvml.py`, `gputop/agent/`, `tests/test_mig.py`, `pyproject.toml`, `memory*.py`...
PATH = re.compile(r"`([A-Za-z0-9_.*/-]+(?:\.(?:py|md|toml|tcss|sh|txt)|/))`")


def _exists(name: str) -> bool:
    name = name.rstrip("/")
    bases = [REPO, REPO / "gputop", REPO / "gputop" / "diagnostics"]
    if "/" not in name:  # a module named in its package's paragraph: it exists in the package
        return any(REPO.joinpath("gputop").rglob(name)) or any(b.glob(name) for b in bases)
    return any(list(b.glob(name)) for b in bases)


def test_every_path_it_names_exists():
    text = DOC.read_text(encoding="utf-8")
    names = sorted({m.group(1) for m in PATH.finditer(text)})
    assert len(names) > 50, names  # it does name the house's rooms
    missing = [n for n in names if not _exists(n)]
    assert not missing, f"docs/ARCHITECTURE.md names paths that do not exist: {missing}"


def test_it_opens_inside_the_repository():
    opening = DOC.read_text(encoding="utf-8").split("\n## ", 1)[0]
    assert "../" not in opening and "shared/" not in opening, opening
