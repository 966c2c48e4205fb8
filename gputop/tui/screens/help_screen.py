"""The `?` screen: every key of the monitor, what it does, what q never does, and what the
marks and colours on the screen mean. It scrolls (↑↓, PgUp/PgDn) where it does not fit
(80x24)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

KEYS: tuple[tuple[str, str], ...] = (
    ("q, Ctrl-C", "quit (never signals any process)"),
    ("Enter", "process view: CPU, workers' CPU, GPU memory charts"),
    ("↑ ↓ PgUp PgDn", "select a process (Home/End: first/last)"),
    ("k", "signal: TERM, INT or KILL (asks, Cancel first)"),
    ("space", "tag the process (k signals every tagged one)"),
    ("J", "tag every rank of the selected job"),
    ("e", "full command line and environment (secrets masked)"),
    ("s / S", "sort by the next column, in column order / reverse"),
    ("/", "filter by pid, user or command (Esc clears)"),
    ("t", "DataLoader workers as a tree / flat list"),
    ("a", "also processes on no GPU (others' CPU jobs)"),
    ("c", "compact: one line per GPU (c again: the size decides)"),
    ("1 2 3 4", "chart window: 1 min, 10 min, 1 h, whole run"),
    ("P", "pause the display (sampling goes on)"),
    ("p", "capture 3 steps (all ranks of a job) or Python stacks"),
    ("m", "memory: what grows by line, the peak's parts (agent)"),
    ("M", "the last out-of-memory report (a process that died)"),
    ("F", "count the FLOPs of the next step again (MFU; agent)"),
    ("h", "hang report: every rank's collective and stack"),
    ("f", "findings: every one, the selected one in full"),
    ("Tab", "keys to the findings panel (↑ ↓ select) and back"),
    ("?", "this help"),
    ("Esc", "close a view or this help"),
)
REPLAY_KEYS: tuple[tuple[str, str], ...] = (
    ("space", "pause / play"),
    ("← →", "one sample back / forward (pauses)"),
    ("[ ]", "a minute back / forward"),
    ("Home End", "the first / the last sample"),
)
MARKS: tuple[tuple[str, str], ...] = (
    ("‼ ⚠ ℹ", "a finding: critical, warning, info (f reads it)"),
    ("⚠ slowed:", "clocks held down: power cap, too hot, HW slowdown"),
    ("cyan bars", "work: utilization, power, PCIe (busy is fine)"),
    ("green→red", "memory and temperature near their limits"),
    ("red", "only a problem: a critical finding, a lost GPU"),
    ("* »", "a tagged process (» under the cursor)"),
)


def _section(text: Text, title: str, rows: tuple[tuple[str, str], ...]) -> None:
    text.append(("\n\n" if text.plain else "") + title, style="bold underline")
    for key, what in rows:
        text.append(f"\n{key:<13}", style="bold")
        text.append(f" {what}")


def help_text(readonly: bool = False) -> Text:
    text = Text()
    _section(text, "keys", KEYS)
    _section(text, "a recording played back (--replay)", REPLAY_KEYS)
    _section(text, "marks and colours", MARKS)
    if readonly:
        text.append("\n\n--readonly: k, p, m, F and h are refused", style="bold")
    text.append("\n\nCharts have fixed ranges (0-100 %, 0-power limit, 0-memory,\n"
                "0-PCIe link max): GPUs compare at a glance.", style="dim")
    return text


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll {
        width: auto; max-width: 100%; height: auto; max-height: 100%;
        border: round $accent; padding: 0 1; background: $surface;
    }
    HelpScreen Static { width: auto; }
    """
    BINDINGS = [
        Binding("escape,question_mark,q", "close", "close", show=False),
    ]

    def __init__(self, readonly: bool = False) -> None:
        super().__init__()
        self.readonly = readonly

    def compose(self) -> ComposeResult:
        with VerticalScroll() as box:
            box.border_title = "gputop keys"
            box.border_subtitle = "↑↓ PgUp PgDn scroll · Esc close"
            yield Static(help_text(self.readonly))

    def on_mount(self) -> None:
        self.query_one(VerticalScroll).focus()

    def action_close(self) -> None:
        self.dismiss(None)
