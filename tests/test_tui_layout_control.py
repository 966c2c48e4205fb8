"""In a real terminal (tmux) on `gputop --demo tour`: a layout that cannot get stuck (compact on,
off, then a resize to 80x24: the process table is there with the selected row on screen) and
nvitop's process control on a selected process (`e` shows its environment with secrets masked,
`k` offers TERM, INT and KILL with Cancel first, `--readonly` refuses k)."""

from __future__ import annotations

import pytest

from tests.conftest import SLOW, wait_for
from tests.test_tui_terminal import quit_and_check_shell, start, terminal, wait_for_monitor

__all__ = ["terminal"]  # the fixture, used by name
pytestmark = pytest.mark.timeout(6 * SLOW)

HEADER = "PID USER"


def table_on_screen(screen: str) -> bool:
    """The table's header and the selected row (its › mark) on screen."""
    lines = screen.splitlines()
    top = next((i for i, line in enumerate(lines) if HEADER in line), None)
    return top is not None and any(line.lstrip().startswith(("›", "»"))
                                   for line in lines[top + 1:])


def resize(term, width: int, height: int) -> None:
    term.tmux("resize-window", "-t", "main", "-x", str(width), "-y", str(height))
    wait_for(lambda: len(term.capture().splitlines()) == height
             and "q Quit" in term.capture().splitlines()[-1], timeout=SLOW)


def test_compact_on_off_then_80x24_keeps_the_table_and_the_selection(terminal):
    term = terminal(200, 60)
    proc = start(term)
    wait_for_monitor(term)
    wait_for(lambda: table_on_screen(term.capture()), timeout=SLOW)
    term.keys(*["Down"] * 6)  # a row down the table: it must stay in view
    term.keys("c")
    wait_for(lambda: "┏━" not in term.capture() and table_on_screen(term.capture()),
             timeout=SLOW)
    term.keys("c")
    wait_for(lambda: "┏━" in term.capture(), timeout=SLOW)  # cards again
    for width, height in ((80, 24), (120, 40), (80, 24)):
        resize(term, width, height)
        wait_for(lambda: table_on_screen(term.capture()), timeout=SLOW)
    screen = term.capture()
    assert "┏━" not in screen  # at 80x24 the ten GPUs are a line each: the size decides
    quit_and_check_shell(term, proc)


def test_e_and_the_signal_dialog_on_a_selected_process(terminal):
    term = terminal(120, 40, HF_TOKEN="s3cr3t-in-the-env", GPUTOP_TEST_PLAIN="plain-value")
    proc = start(term)
    wait_for_monitor(term)
    wait_for(lambda: table_on_screen(term.capture()), timeout=SLOW)
    term.keys("Down")
    term.keys("e")
    wait_for(lambda: "environment (" in term.capture(), timeout=SLOW)
    screen = term.capture()
    assert "command: " in screen and "masked" in screen
    for _ in range(40):
        screen = term.capture()
        if "HF_TOKEN=" in screen:
            break
        term.keys("PageDown")
    assert "HF_TOKEN=******" in screen and "s3cr3t" not in screen
    term.keys("Escape")
    wait_for(lambda: "environment (" not in term.capture(), timeout=SLOW)
    term.keys("k")
    wait_for(lambda: "Cancel (n)" in term.capture(), timeout=SLOW)
    screen = term.capture()
    assert all(f"{name} (" in screen for name in ("TERM", "INT", "KILL"))
    term.keys("n")
    wait_for(lambda: "Cancel (n)" not in term.capture(), timeout=SLOW)
    quit_and_check_shell(term, proc)


def test_readonly_refuses_k(terminal):
    term = terminal(120, 40)
    proc = start(term, "--demo tour --readonly")
    wait_for_monitor(term)
    wait_for(lambda: table_on_screen(term.capture()), timeout=SLOW)
    term.keys("k")
    wait_for(lambda: "--readonly" in term.capture(), timeout=SLOW)
    assert "Cancel (n)" not in term.capture()
    quit_and_check_shell(term, proc)
