"""`gputop top --replay DIR`: a recording on the monitor's screen, in a real terminal (tmux), and
the replay feed's keys under Textual's pilot.

The recording is a real one (tests/data/realgpu/starved: an H200 job starved by its DataLoader):
the screen shows its GPU, its training process and the finding the live rules raise over it;
space pauses, the arrow keys step one sample, Home and End go to either end."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gputop.recording.replay import open_replay
from gputop.tui.monitor.app import GputopApp
from gputop.tui.monitor.replay_feed import ReplayFeed
from tests.conftest import SLOW, run_cli, wait_for
from tests.test_tui_app import run_async, until
from tests.test_tui_terminal import start, terminal  # noqa: F401  (the tmux fixture)

pytestmark = pytest.mark.timeout(4 * SLOW)

STARVED = Path(__file__).parent / "data" / "realgpu" / "starved"
POSITION = re.compile(r"(PAUSED|REPLAY) (\d+)/(\d+)")


def position(screen: str) -> tuple[str, int, int] | None:
    found = POSITION.search(screen)
    return (found.group(1), int(found.group(2)), int(found.group(3))) if found else None


def test_in_a_terminal_the_replay_shows_the_gpu_processes_and_findings(terminal):  # noqa: F811
    snaps = list(open_replay(STARVED).snapshots())
    job = next(p.pid for s in snaps for g in s.gpus for p in g.processes if p.visible)
    term = terminal(120, 40)
    proc = start(term, f"top --replay {STARVED}")
    wait_for(lambda: "NVIDIA H200" in term.capture() and position(term.capture()),
             timeout=SLOW)
    # Played at its own pace: the job appears on the GPU, and the live rules' finding raises.
    wait_for(lambda: str(job) in term.capture(), timeout=SLOW, interval=0.2)
    wait_for(lambda: "dataloader-stall" in term.capture(), timeout=SLOW, interval=0.2)
    term.keys("Space")
    wait_for(lambda: (position(term.capture()) or ("",))[0] == "PAUSED", timeout=SLOW)
    paused = position(term.capture())
    term.keys("Right")
    wait_for(lambda: position(term.capture())[1] == paused[1] + 1, timeout=SLOW)
    # One key at a time: two arrows' escape sequences sent at once can reach a busy app split,
    # and ESC, "[", "D" is Escape and then the seek key "[".
    term.keys("Left")
    wait_for(lambda: position(term.capture())[1] == paused[1], timeout=SLOW)
    term.keys("Left")
    wait_for(lambda: position(term.capture())[1] == paused[1] - 1, timeout=SLOW)
    term.keys("End")
    wait_for(lambda: position(term.capture())[1:] == (paused[2], paused[2]), timeout=SLOW)
    assert "dataloader-stall" in term.capture()
    term.keys("Home")
    wait_for(lambda: position(term.capture())[1] == 1, timeout=SLOW)
    wait_for(lambda: "dataloader-stall" not in term.capture(), timeout=SLOW)  # not yet raised
    term.keys("q")
    proc.wait(timeout=SLOW)
    wait_for(lambda: "exit=0" in term.capture(), timeout=SLOW)


def test_a_bad_recording_is_one_line_before_any_screen(tmp_path):
    done = run_cli("top", "--replay", str(tmp_path / "nothing"))
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


@run_async
async def test_the_replay_keys_under_the_pilot():
    replay = open_replay(STARVED)
    snaps = list(replay.snapshots())
    feed = ReplayFeed(lambda frame: None, snaps, own_pid=replay.own_pid)
    app = GputopApp(interval=replay.interval, replay=feed)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.frames_rendered >= 1)
        await pilot.press("end")
        await until(pilot, lambda: feed.index == len(snaps) - 1)
        # The findings at the end are those the live rules raised over the whole recording,
        # as `gputop replay` prints them.
        assert [f.id for f in feed.findings] == ["dataloader-stall"]
        await until(pilot, lambda: app.frame.snapshot is snaps[-1])
        assert feed.position == f"{len(snaps)}/{len(snaps)} END"  # the recording's end, marked
        await pilot.press("left")
        await until(pilot, lambda: feed.index == len(snaps) - 2 and app.paused)
        await pilot.press("home")
        await until(pilot, lambda: feed.index == 0 and feed.findings == ())
        await pilot.press("right_square_bracket")  # a minute on: past the end of this one
        await until(pilot, lambda: feed.index == len(snaps) - 1)
        await pilot.press("left_square_bracket")
        await until(pilot, lambda: feed.index == 0)
        # Nothing here acts on live processes: p says why (issue 38), and captures nothing.
        await pilot.press("p")
        await until(pilot, lambda: any("recording played back" in str(n.message)
                                       for n in app._notifications))
        await pilot.press("q")
