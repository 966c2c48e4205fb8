"""The house's shape, checked: module-level import circles and product files over 600 lines.

    python scripts/layers.py          # prints what it finds; exit status 1 when anything

Uses grimp (import-linter's engine). Every import counts, at the top of a module or inside a
function: an import inside a function still makes an arrow, it only hides a circle until load
time. Imports made only for type checking (``if TYPE_CHECKING:``) count too: a circle that only
the type checker walks is still two modules that cannot be read apart. A package counts as the module of its ``__init__``. CI runs this after
lint-imports (import-linter's contracts in pyproject.toml hold the layers).
"""

from __future__ import annotations

import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "gputop"
MAX_LINES = 600


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    modules = sorted(graph.modules)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in modules:
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            targets = edges.get(node, [])
            if i < len(targets):
                work.append((node, i + 1))
                target = targets[i]
                if target not in index:
                    work.append((target, 0))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            for target in targets:  # children finished: take their low links
                if target in on_stack:
                    low[node] = min(low[node], low[target])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def long_files() -> list[tuple[str, int]]:
    out = []
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_LINES:
            out.append((str(path.relative_to(ROOT)), lines))
    return out


def main() -> int:
    sys.path.insert(0, str(ROOT))
    graph = grimp.build_graph(PACKAGE, exclude_type_checking_imports=False, cache_dir=None)
    # A package imports its own modules and they import it back (``from gputop import x``):
    # that is how packages load, not a circle between rooms. Only edges between modules count.
    for module in list(graph.modules):
        for imported in graph.find_modules_directly_imported_by(module):
            if module.startswith(imported + "."):
                graph.remove_import(importer=module, imported=imported)
    found = cycles(graph)
    for component in found:
        print(f"circle: {' <-> '.join(component)}")
    files = long_files()
    for path, lines in files:
        print(f"over {MAX_LINES} lines: {path} ({lines})")
    print(f"{len(graph.modules)} modules: {len(found)} circles, {len(files)} files over "
          f"{MAX_LINES} lines")
    return 1 if found or files else 0


if __name__ == "__main__":
    sys.exit(main())
