"""The sampling, diagnosis and stacks layers stay importable without Textual (they run in `gputop
snapshot`, `watch`, `record` and inside tests that have no terminal); so do the fleet's ssh
side, the exporter (`watch --hosts`, `stream` and `exporter` draw nothing) and the capture
service (under `gputop capture` as under the TUI's `p`), at run time: the import contracts
(pyproject.toml) read the import statements, this imports for real."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys

from tests.conftest import REPO, cli_env

PROBE = """
import importlib, json, pkgutil, sys
import gputop.collect, gputop.diagnostics, gputop.stacks, gputop.fleet, gputop.exporter
import gputop.capture, gputop.capture.memory
names = []
for package in (gputop.collect, gputop.diagnostics, gputop.stacks, gputop.fleet, gputop.exporter,
                gputop.capture, gputop.capture.memory):
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
    assert {"gputop.capture.memory.report", "gputop.capture.memory.where"} <= set(result["imported"])
    assert result["textual"] == []


def test_the_probe_would_see_textual():
    """The check above can fail: importing the TUI shows up in the same probe."""
    first = "import gputop.collect, gputop.diagnostics, gputop.stacks, gputop.fleet, gputop.exporter"
    assert first in PROBE
    code = PROBE.replace(first, first + ", gputop.tui.monitor.app")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=cli_env(), cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "textual" in json.loads(done.stdout.strip().splitlines()[-1])["textual"]


def test_walk_covers_every_module_file():
    import gputop.capture
    import gputop.capture.memory
    import gputop.collect
    import gputop.diagnostics
    import gputop.exporter
    import gputop.fleet
    import gputop.stacks

    for package in (gputop.collect, gputop.diagnostics, gputop.stacks, gputop.fleet,
                    gputop.exporter, gputop.capture, gputop.capture.memory):
        files = {p.stem for p in (REPO / package.__name__.replace(".", "/")).glob("*.py")
                 if p.stem != "__init__"}
        walked = {info.name for info in pkgutil.iter_modules(package.__path__)}
        assert files <= walked


# -- what the contracts cannot check --------------------------------------------------------
# The layers, the arrows and the circles are import-linter's contracts (pyproject.toml) and
# scripts/layers.py, run in CI. They read import statements; the probe above imports for real
# (an importlib call, a module that pulls textual in at run time). And one fact about the code
# paths: the command line and the TUI's capture controller capture through the same service.


def test_the_cli_and_the_tui_capture_through_one_service():
    import grimp

    graph = grimp.build_graph("gputop")
    service = "gputop.capture.service"
    assert service in graph.find_modules_directly_imported_by("gputop.commands.capture")
    assert service in graph.find_modules_directly_imported_by("gputop.tui.monitor.captures")
