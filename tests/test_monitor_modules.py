"""The monitor loads only what it uses (issue 40): `gputop top` at its first frame and `gputop
--demo tour snapshot` never load pandas, pyarrow, numpy, msgspec, torch, the trace engine, the
recording store or the training-side agent; and `gputop top` still loads no numpy once its
history records and its charts are drawn (the rings and charts are pure Python since issue 40).

Checked on the real app in a fresh interpreter: `gputop top`'s start (the early sampler, then
the App) under Textual's Pilot, and the modules listed at the moment the app tells the sampler
that the first frame is on screen; `snapshot` under `python -X importtime`, as a user would.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

from tests.conftest import REPO, SLOW, cli_env

# `gputop top`'s start as commands/top.py makes it; the modules are listed when the app sets
# feed.first_shown (after the first frame is painted; the sampler waits on it before it
# records the first sample, which brings the history in), then again once a few frames drew
# charts from the history.
TOP_PROBE = """
import gc, json, sys, threading
from gputop.tui.monitor.early_start import EarlySampler

gc.disable()
early = EarlySampler("tour", None, 0).start()
from gputop.tui.textual_fixes.lean_imports import lean_imports

with lean_imports():
    from gputop.tui.monitor.app import GputopApp
import asyncio

app = GputopApp(demo="tour", gpus=None, interval=1.0, seed=0, auto_capture=False, early=early)
at_first_frame = []


class Noted(threading.Event):
    def set(self):
        if not at_first_frame:
            at_first_frame.append(sorted(sys.modules))
        super().set()


app.feed.first_shown = Noted()


async def main():
    async with app.run_test(size=(160, 50)) as pilot:
        for _ in range(1200):
            if at_first_frame:
                break
            await pilot.pause(0.05)
        for _ in range(1200):
            if (app.frames_rendered >= 4 and "gputop.core.history" in sys.modules
                    and "gputop.tui.widgets.chart" in sys.modules):
                break
            await pilot.pause(0.05)
        print(json.dumps({"modules": at_first_frame[0] if at_first_frame else None,
                          "later": sorted(sys.modules),
                          "frames": app.frames_rendered, "gpus": list(app.gpu_indices)}))


asyncio.run(main())
early.stop()
"""

# Third-party packages the monitor needs for its first frame (top-level names).
ALLOWED_THIRD_PARTY = {
    "textual", "rich", "psutil", "pynvml", "typing_extensions",
    "markdown_it", "mdit_py_plugins", "mdurl", "pygments", "linkify_it", "uc_micro",
}
# gputop's parts on the monitor's path: sampling, live rules, the simulated driver of a demo,
# the agents' client side, the TUI. Anything else (the training-side agent, the trace engine,
# recording, capture, memory reports, stacks, fleet, exporter) loads when a feature asks.
ALLOWED_GPUTOP = {
    "gputop", "gputop.__main__", "gputop.cli", "gputop.commands", "gputop.commands.top",
    "gputop.demo", "gputop.demo.attach", "gputop.demo.standins", "gputop.diagnostics",
    "gputop.diagnostics.findings", "gputop.diagnostics.next_steps",
    "gputop.core", "gputop.core.protocol", "gputop.core.gpu_family",
    "gputop.core.efficiency", "gputop.core.errors", "gputop.core.format", "gputop.core.job_groups",
    "gputop.core.mig_view", "gputop.core.model", "gputop.core.pcie", "gputop.core.peaks", "gputop.core.process_info",
    "gputop.client.session", "gputop.core.agent_status", "gputop.core.boards", "gputop.core.compile_health",
    "gputop.core.pidns", "gputop.core.validate",
}
# ... and these packages, whole.
ALLOWED_GPUTOP_PACKAGES = ("gputop.collect", "gputop.sim", "gputop.diagnostics.live",
                           "gputop.client", "gputop.tui")
# Never on the monitor's way to its first frame, with why, for the failure message.
HEAVY = {"pandas": "record/report", "pyarrow": "record/report", "numpy": "record/report",
         "msgspec": "traces and recordings", "torch": "the training job",
         "gputop.agent": "the training process", "gputop.recording": "record/report",
         "gputop.diagnostics.trace": "the trace engine (capture, analyze)"}


def allowed(name: str) -> bool:
    top = name.split(".")[0]
    if top == "gputop":
        return name in ALLOWED_GPUTOP or any(name == p or name.startswith(p + ".")
                                             for p in ALLOWED_GPUTOP_PACKAGES)
    # The interpreter's own (and an editable install's finder, _sysconfigdata, ...).
    return top in sys.stdlib_module_names or top.startswith("_") or top in ALLOWED_THIRD_PARTY


def not_allowed(modules: list[str]) -> list[str]:
    return sorted(m for m in modules if not allowed(m))


def heavy(modules: list[str]) -> list[str]:
    return sorted(m for m in modules for h in HEAVY if m == h or m.startswith(h + ".")
                  or (h == "gputop.diagnostics.trace" and m.startswith(h)))


def top_modules() -> dict:
    done = subprocess.run([sys.executable, "-c", TOP_PROBE], capture_output=True, text=True,
                          env=cli_env(), cwd=REPO, timeout=SLOW)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["modules"] is not None, f"no first frame: {result}"
    assert result["frames"] >= 1 and len(result["gpus"]) >= 8  # the tour's GPUs drawn
    return result


def test_top_loads_only_allowed_modules_at_its_first_frame_and_never_numpy():
    result = top_modules()
    later = result["later"]
    assert "gputop.core.history" in later and "gputop.tui.widgets.chart" in later, result["frames"]
    assert [m for m in later if m.split(".")[0] in ("numpy", "pandas", "pyarrow")] == []
    modules = result["modules"]
    assert "textual.app" in modules and "gputop.tui.monitor.app" in modules  # it is the real app
    assert "gputop.collect.sampler" in modules
    assert heavy(modules) == [], {m: HEAVY[next(h for h in HEAVY if m.startswith(h))]
                                  for m in heavy(modules)}
    assert not_allowed(modules) == []
    assert "ssl" not in modules and "_ssl" not in modules  # asyncio's TLS: libcrypto, ~3 MiB
    # Textual's command palette (off in the monitor), screenshot folders, CSS suggestions.
    assert [m for m in modules if m.split(".")[0] in ("platformdirs", "difflib", "platform")
            or m in ("textual.command", "textual.types")
            or m.startswith("textual.widgets._directory_tree")] == []


def test_what_the_interface_is_imported_without_still_loads_and_works_later():
    """asyncio takes the blocked ssl as "no TLS"; a later `import ssl` (an https request of a
    feature) loads it as usual. The stand-ins Textual bound answer from the real modules when
    called, and each module imports for real afterwards."""
    code = """
import sys
from gputop.tui.textual_fixes.lean_imports import lean_imports
with lean_imports():
    import asyncio, textual.app, textual.theme, textual.suggestions
stand_ins = ("ssl", "textual.command", "platformdirs", "difflib", "platform")
assert [m for m in stand_ins if m in sys.modules] == [], sys.modules.keys() & set(stand_ins)
assert asyncio.base_events.ssl is None
# What Textual bound, called: the real functions answer (and load their module).
print(textual.suggestions.get_suggestion("bakground", ["background", "color"]))
print(type(textual.app.user_downloads_path()).__name__)
print(sys.modules["difflib"].__file__.endswith("difflib.py"),
      "platformdirs.unix" in sys.modules)
import ssl, platform, textual.command
print(ssl.OPENSSL_VERSION.split()[0], platform.system(), textual.command.CommandPalette.__module__)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=cli_env(), cwd=REPO, timeout=SLOW)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["background", "PosixPath", "True", "True", "OpenSSL",
                                   "Linux", "textual.command"]


def test_snapshot_imports_no_pandas_pyarrow_torch_or_training_side_agent():
    """Acceptance 2 as written: `python -X importtime -m gputop --demo tour snapshot`."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "gputop", "--demo",
                           "tour", "snapshot"], capture_output=True, text=True, env=cli_env(),
                          cwd=REPO, timeout=SLOW)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "GPU" in done.stdout
    imported = [m.group(1) for m in re.finditer(r"^import time:.*\|\s*(\S+)\s*$", done.stderr,
                                                re.M)]
    assert "gputop.collect.sampler" in imported
    loaded = [m for m in imported if m.split(".")[0] in ("pandas", "pyarrow", "torch", "numpy",
                                                           "msgspec")
              or m == "gputop.agent" or m.startswith("gputop.agent.")
              or m.startswith("gputop.diagnostics.trace") or m.startswith("gputop.recording")]
    assert loaded == []


def test_the_checks_would_see_a_heavy_or_unlisted_module():
    """The checks above can fail: what pandas, the agent or an unlisted package would add."""
    assert heavy(["pandas.core.frame", "gputop.agent.profiling", "gputop.diagnostics.trace_load",
                  "gputop.tui.monitor.app"]) == ["gputop.agent.profiling",
                                          "gputop.diagnostics.trace_load", "pandas.core.frame"]
    assert not_allowed(["json", "textual.app", "requests", "gputop.recording.store",
                        "gputop.collect.nvml", "gputop.demo.train", "gputop.capture.service",
                        "_distutils_hack"]) == [
        "gputop.capture.service", "gputop.demo.train", "gputop.recording.store", "requests"]
