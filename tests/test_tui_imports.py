"""The sampling, diagnosis and stacks layers stay importable without Textual (they run in `gputop
snapshot`, `watch`, `record` and inside tests that have no terminal); so do the fleet's ssh
side, the exporter (`watch --hosts`, `stream` and `exporter` draw nothing) and the capture
service (under `gputop capture` as under the TUI's `p`). And the import arrows run one way."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys

from tests.conftest import REPO, cli_env

PROBE = """
import importlib, json, pkgutil, sys
import gputop.collect, gputop.diagnostics, gputop.stacks, gputop.fleet, gputop.exporter
import gputop.capture, gputop.memory
names = []
for package in (gputop.collect, gputop.diagnostics, gputop.stacks, gputop.fleet, gputop.exporter,
                gputop.capture, gputop.memory):
    names.append(package.__name__)
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        names.append(info.name)
for name in names:
    importlib.import_module(name)
print(json.dumps({"imported": names, "textual": sorted(m for m in sys.modules
                  if m == "textual" or m.startswith("textual."))}))
"""


def probe() -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          env=cli_env(), cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_collect_and_diagnostics_never_import_textual():
    result = probe()
    expected = {"gputop.collect.nvml", "gputop.collect.host", "gputop.collect.sampler"}
    assert expected <= set(result["imported"])
    assert any(name.startswith("gputop.diagnostics.") for name in result["imported"])
    assert "gputop.stacks.pyspy" in result["imported"]
    assert {"gputop.fleet.monitor", "gputop.exporter.metrics"} <= set(result["imported"])
    assert "gputop.capture.service" in result["imported"]  # under the CLI and the TUI alike
    assert {"gputop.memory.report", "gputop.memory.where"} <= set(result["imported"])
    assert result["textual"] == []


def test_the_probe_would_see_textual():
    """The check above can fail: importing the TUI shows up in the same probe."""
    first = "import gputop.collect, gputop.diagnostics, gputop.stacks, gputop.fleet, gputop.exporter"
    assert first in PROBE
    code = PROBE.replace(first, first + ", gputop.tui.app")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=cli_env(), cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "textual" in json.loads(done.stdout.strip().splitlines()[-1])["textual"]


def test_walk_covers_every_module_file():
    import gputop.capture
    import gputop.collect
    import gputop.diagnostics
    import gputop.exporter
    import gputop.fleet
    import gputop.memory
    import gputop.stacks

    for package in (gputop.collect, gputop.diagnostics, gputop.stacks, gputop.fleet,
                    gputop.exporter, gputop.capture, gputop.memory):
        files = {p.stem for p in (REPO / package.__name__.replace(".", "/")).glob("*.py")
                 if p.stem != "__init__"}
        walked = {info.name for info in pkgutil.iter_modules(package.__path__)}
        assert files <= walked


# -- import arrows: tui/ and commands/ sit on the services, never on each other ----------------

CAPTURE_MODULES = ("gputop.capture", "gputop.commands.capture", "gputop.commands.capture_job",
                   "gputop.client.agents", "gputop.client.jobs", "gputop.agent.profiling",
                   "gputop.agent.trace_budget", "gputop.stacks.timeline",
                   "gputop.stacks.trace_join", "gputop.fleet.capture", "gputop.tui.app",
                   "gputop.agent.memory", "gputop.agent.oom", "gputop.memory",
                   "gputop.commands.memory", "gputop.tui.widgets.memory_screen")


def import_graph(root) -> dict[str, set[str]]:
    """Module -> the package's modules it imports, anywhere in it (inside functions too: a
    lazy import is still an arrow), read from the source with ``ast``."""
    import ast

    mods = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = path
    top = root.name
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                deps.add(module)
                deps.update(f"{module}.{a.name}" for a in node.names)
        graph[name] = {d for d in deps if d in mods and d != name and d.startswith(top)}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The import circles: strongly connected groups of two or more modules (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(group)

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_tui_module_imports_the_commands_and_no_capture_module_is_in_a_circle():
    graph = import_graph(REPO / "gputop")
    assert "gputop.capture.service" in graph and "gputop.tui.app" in graph
    tui_to_commands = sorted((m, d) for m, deps in graph.items() if m.startswith("gputop.tui")
                             for d in deps if d.startswith("gputop.commands"))
    assert tui_to_commands == []
    # Both the command line and the TUI call the capture service.
    assert "gputop.capture.service" in graph["gputop.tui.app"]
    assert "gputop.capture.service" in graph["gputop.commands.capture"]
    circles = [c for c in cycles(graph) if any(m.startswith(CAPTURE_MODULES) for m in c)]
    assert circles == []


def test_the_import_checks_see_a_circle_and_an_arrow_up(tmp_path):
    """The checks above can fail: a package with both faults shows both."""
    pkg = tmp_path / "gputop"
    for folder in ("tui", "commands", "capture"):
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "tui" / "app.py").write_text("def f():\n    from gputop.commands import capture\n")
    (pkg / "commands" / "capture.py").write_text("from ..capture import service\n")
    (pkg / "capture" / "service.py").write_text("import gputop.commands.capture\n")
    graph = import_graph(pkg)
    assert "gputop.commands.capture" in graph["gputop.tui.app"]
    assert {"gputop.commands.capture", "gputop.capture.service"} in cycles(graph)
