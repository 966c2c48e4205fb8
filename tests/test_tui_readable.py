"""Acceptance of the readable monitor in a real terminal (tmux), `gputop --demo tour` at
80x24, 120x40 and 200x60: every active finding's title, evidence and fix can be read in full
without leaving the monitor (the panel at 120 columns and wider, `f` everywhere), no card line
is clipped, and a resize lays the screen out again (how fast: benchmarks/bench_tui.py)."""

from __future__ import annotations

import re
import time

import pytest

from tests.conftest import SLOW, wait_for
from tests.test_tui_terminal import quit_and_check_shell, start, terminal, wait_for_monitor

__all__ = ["terminal"]  # the fixture, used by name
pytestmark = pytest.mark.timeout(8 * SLOW)

BORDERS = "│┃"
STATUS_PART = re.compile(r"(⚠ .*|LOST.*|tensor \d+%|SM act \d+%|tx \S+|P\d+|temp .*|SM \S+.*)")


def panel_text(screen: str, title: str) -> list[str]:
    """The lines inside the bordered box whose top border carries ``title``."""
    lines = screen.splitlines()
    top = next(i for i, line in enumerate(lines) if title in line)
    left = lines[top].index("╭")
    right = lines[top].index("╮", left)
    out = []
    for line in lines[top + 1:]:
        if line[left:left + 1] == "╰":
            break
        out.append(line[left + 1:right])
    return out


def detail_of(lines: list[str]) -> dict[str, str]:
    """The selected finding's detail, its wrapped sections joined: title, evidence, fix."""
    text = [line.rstrip().rstrip("▁▂▃▄▅▆▇█ ") for line in lines]
    sep = next(i for i, line in enumerate(text) if line.strip().startswith("────"))
    body = text[sep + 1:]
    sections: dict[str, list[str]] = {"head": [body[0].strip()], "title": [body[1].strip()]}
    current = "title"
    for line in body[2:]:
        stripped = line.strip()
        for label in ("where", "evidence", "fix", "next"):
            if stripped.startswith(label + ": "):
                current = label
                stripped = stripped[len(label) + 2:]
                break
        sections.setdefault(current, []).append(stripped)
    return {k: " ".join(" ".join(v).split()) for k, v in sections.items()}


def assert_detail_complete(lines: list[str]) -> None:
    detail = detail_of(lines)
    assert "…" not in " ".join(detail.values())
    assert detail["title"] and detail["evidence"] and detail["fix"]
    # The next step closes the detail: seeing it means evidence and fix above are whole.
    assert detail.get("next"), "\n".join(lines)


def detail_head(lines: list[str]) -> str | None:
    """The selected finding's head line (severity, id, GPU / pid) once its detail shows whole
    (down to its next step), else None."""
    try:
        detail = detail_of(lines)
    except (StopIteration, IndexError):
        return None
    return detail["head"] if detail.get("title") and detail.get("next") else None


def read_all(term, grab, count: int) -> None:
    """Select each of ``count`` findings in turn, from the first; each one's detail must show
    whole. Findings are told apart by their detail's head, not by list position: the list
    scrolls when the list and a tall detail do not both fit."""
    term.keys(*["Up"] * count)  # to the first finding

    def settled() -> str | None:
        first = detail_head(grab())
        time.sleep(0.5)
        return first if first is not None and detail_head(grab()) == first else None

    head = wait_for(settled, timeout=SLOW)
    seen = [head]
    assert_detail_complete(grab())
    for _ in range(count - 1):
        term.keys("Down")
        try:
            head = wait_for(lambda prev=head: (h := detail_head(grab())) is not None
                            and h != prev and h, timeout=SLOW)
        except AssertionError:
            raise AssertionError(f"Down after {seen} of {count} did not change the detail:\n"
                                 + "\n".join(grab()) + "\n--- the screen:\n"
                                 + term.capture()) from None
        assert_detail_complete(grab())
        seen.append(head)
    assert len(set(seen)) == count, seen


def listed_findings(lines: list[str]) -> list[str]:
    """The list's lines (before the separator), each its title."""
    out = []
    for line in lines:
        if line.strip().startswith("────"):
            break
        out.append(line)
    return out


def paused(term) -> None:
    """Freeze the display (`P`; sampling goes on): a live list is walked as one list, not as
    findings that raise and clear meanwhile (on a busy host they do)."""
    term.keys("P")
    wait_for(lambda: "PAUSED" in term.capture() or "display is frozen" in term.capture(),
             timeout=SLOW)


def resumed(term) -> None:
    term.keys("P")
    wait_for(lambda: "PAUSED" not in term.capture(), timeout=SLOW)


def read_every_finding(term, title: str) -> int:
    """Select each finding of the panel in turn; its detail must be complete on screen."""
    paused(term)
    count = len(listed_findings(panel_text(term.capture(), title)))
    assert count >= 3
    read_all(term, lambda: panel_text(term.capture(), title), count)
    resumed(term)
    return count


def findings_screen(screen: str) -> list[str]:
    """The `f` screen's lines between its title line and its footer."""
    return [line[1:] for line in screen.splitlines()[1:-1]]


def assert_cards_whole(screen: str) -> None:
    """Every line of a card ends on its border, and its footer has whole parts only."""
    lines = screen.splitlines()
    for top, line in enumerate(lines):
        if "─  " not in line and "━  " not in line:
            continue
        corners = [m.start() for m in re.finditer("[╮┓]", line)]
        if not corners:
            continue
        bottom = next(i for i in range(top + 1, len(lines)) if lines[i][:1] in "╰┗")
        for row in lines[top + 1:bottom]:
            for col in corners:
                assert row[col:col + 1] in BORDERS, (row, col)
        starts = [m.start() for m in re.finditer("[╭┏]", line)]
        for left, right in zip(starts, corners):
            footer = lines[bottom - 1][left + 1:right].strip()
            for part in footer.split("  "):
                if part:
                    assert STATUS_PART.fullmatch(part.strip()), f"cut part {part!r}"


def test_findings_readable_and_cards_whole_at_every_size(terminal):
    term = terminal(80, 24)
    proc = start(term)
    wait_for_monitor(term)
    # At 80x24: a banner names the worst finding and f shows them all.
    wait_for(lambda: "f: read them" in term.capture() and "findings:" in term.capture(),
             timeout=2 * SLOW)
    # Let the tour's findings raise (they hold for 4 s first).
    wait_for(lambda: re.search(r"[6-9] findings:", term.capture()), timeout=2 * SLOW)
    paused(term)  # on the main screen, where `P` is; the full list is then the frozen one
    term.keys("f")
    wait_for(lambda: "Esc back" in term.capture(), timeout=SLOW)
    count = int(re.search(r"findings \((\d+)\)", term.capture()).group(1))
    assert count >= 6
    read_all(term, lambda: findings_screen(term.capture()), count)
    term.keys("Escape")
    wait_for(lambda: "f: read them" in term.capture(), timeout=SLOW)
    resumed(term)

    for width, height in ((120, 40), (200, 60)):
        term.tmux("resize-window", "-t", "main", "-x", str(width), "-y", str(height))

        def laid_out(screen: str, width=width, height=height) -> bool:
            lines = screen.splitlines()
            return (len(lines) == height and "q Quit" in lines[-1]
                    and any("─ findings (" in line for line in lines)
                    and (width < 160 or any(len(line.rstrip()) > width - 10
                                            for line in lines[2:12])))

        def whole(laid_out=laid_out) -> bool:
            # tmux can be captured while a frame is being written after the resize: the new
            # top lines over the old ones. A frame that stays torn fails below.
            screen = term.capture()
            if not laid_out(screen):
                return False
            try:
                assert_cards_whole(screen)
            except AssertionError:
                return False
            return True

        try:
            wait_for(whole, timeout=SLOW)
        except AssertionError:
            screen = term.capture()
            assert laid_out(screen), screen
            assert_cards_whole(screen)
            raise
        term.keys("Tab")  # the findings panel takes the keys
        wait_for(lambda: "╭─ findings (" in term.capture(), timeout=SLOW)
        read_every_finding(term, "─ findings (")
        term.keys("Tab")
    quit_and_check_shell(term, proc)
