"""The sampling, diagnosis and stacks layers stay importable without Textual (they run in `gputop
snapshot`, `watch`, `record` and inside tests that have no terminal); so do the fleet's ssh
side and the exporter (`watch --hosts`, `stream` and `exporter` draw nothing)."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys

from tests.conftest import REPO, cli_env

PROBE = """
import importlib, json, pkgutil, sys
import gputop.collect, gputop.diagnostics, gputop.stacks, gputop.fleet, gputop.exporter
names = []
for package in (gputop.collect, gputop.diagnostics, gputop.stacks, gputop.fleet, gputop.exporter):
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
    import gputop.collect
    import gputop.diagnostics
    import gputop.exporter
    import gputop.fleet
    import gputop.stacks

    for package in (gputop.collect, gputop.diagnostics, gputop.stacks, gputop.fleet,
                    gputop.exporter):
        files = {p.stem for p in (REPO / package.__name__.replace(".", "/")).glob("*.py")
                 if p.stem != "__init__"}
        walked = {info.name for info in pkgutil.iter_modules(package.__path__)}
        assert files <= walked
