"""What a newcomer met in their first hour: py-spy timing out on a busy host, a report's cut
name, an escape dropped instead of shown, --help texts that point to the wrong page."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gputop.core.agent_status import parse_status
from gputop.core.compile_health import compile_health
from gputop.recording.render import GONE, process_label
from gputop.stacks import pyspy
from tests.conftest import run_cli
from tests.scripts.stacks_testkit import stacks_readable  # noqa: F401 (the fixture)


@pytest.mark.usefixtures("stacks_readable")
def test_a_py_spy_timeout_is_tried_again_then_says_what_to_do(monkeypatch):
    """A grace below nothing: py-spy cannot record 1 s within half a second, so both tries time
    out whatever the machine's speed (what a load of 46 did to the default grace), and the line
    says what to do."""
    target = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.1)"])
    started: list[int] = []
    real = pyspy._start_records

    def counted(*args, **kw):
        started.append(1)
        return real(*args, **kw)

    monkeypatch.setattr(pyspy, "START_GRACE_S", -0.5)
    monkeypatch.setattr(pyspy, "_start_records", counted)  # counts the real runs
    try:
        with pytest.raises(pyspy.StacksError) as raised:
            pyspy.sample_stacks(target.pid, seconds=1, dump=False)
    finally:
        target.kill()
        target.wait()
    assert len(started) == 2
    line = str(raised.value)
    assert "in time, twice" in line and "load" in line
    assert f"gputop stacks {target.pid} --seconds 1" in line


def test_a_process_not_in_proc_is_named_as_the_monitor_names_it():
    assert process_label("(not visible: other pid namespace?)") == GONE == "(not in /proc)"
    assert process_label("a-very-long-process-name") == "a-very-long-pro…"
    assert process_label("python") == "python" and process_label(None) == "?"


def test_an_escape_in_a_compiled_function_is_shown_not_dropped():
    health = compile_health(parse_status({"compile": {"compiles": 1, "functions": [
        {"function": "fwd\x1b[2J", "compiles": 1}]}}))
    assert health is not None and health.functions
    assert health.functions[0].function == "fwd\\x1b[2J"


@pytest.mark.parametrize("command, page", [
    ("snapshot", "docs/monitor.md"), ("stream", "docs/fleet.md"), ("exporter", "docs/exporter.md"),
    ("stacks", "docs/stacks.md"), ("watch", "docs/watch.md"), ("replay", "docs/watch.md")])
def test_help_names_the_docs_page(command, page):
    done = run_cli(command, "--help")
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    assert page in text and "the README" not in text
    assert "%%" not in text
    if command in ("watch", "replay"):
        assert "job, rank" in text
