"""Another user's command line reaches the live monitor's screen escaped, never as escapes."""

from __future__ import annotations

import asyncio

from gputop.core.model import ProcSample
from gputop.tui.monitor.app import GputopApp
from tests.tui_data import scenario_snapshots, screen_text, with_process

HOSTILE = "python train.py \x1b]0;owned\x07\x1b[2J\u202eevil"


def test_a_hostile_command_line_is_drawn_escaped():
    async def scenario() -> str:
        proc = ProcSample(pid=424242, name="python", cpu_percent=1.0, user="mallory",
                          state="sleeping", cmdline=HOSTILE)
        app = GputopApp(snapshots=with_process(scenario_snapshots("tour", 10), proc))
        async with app.run_test(size=(160, 50)) as pilot:
            for _ in range(3000):
                if app.frames_rendered and "424242" in screen_text(app):
                    break
                await pilot.pause(0.01)
            return screen_text(app)

    text = asyncio.run(scenario())
    assert "424242" in text
    row = next(line for line in text.splitlines() if "424242" in line)
    assert "\x1b" not in row and "\x07" not in row and "\u202e" not in row
    assert "\\x1b]0;owned" in row  # visible for what it is
