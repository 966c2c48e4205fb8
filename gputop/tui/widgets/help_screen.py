"""The `?` screen: every key, what it does, and what q never does."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

KEYS: tuple[tuple[str, str], ...] = (
    ("q, Ctrl-C", "quit (never signals any process)"),
    ("space", "pause / resume the display (sampling and history go on)"),
    ("1 2 3 4", "chart window: 1 min, 10 min, 1 h, the whole run"),
    ("c", "compact mode on/off (one line per GPU)"),
    ("s / S", "sort by the next column / reverse the order"),
    ("/", "filter processes by pid, user, command (Esc clears)"),
    ("t", "tree of DataLoader workers / flat list"),
    ("Enter", "process view: CPU of the process and its workers, GPU memory"),
    ("k", "send SIGTERM to the selected process (asks first)"),
    ("p", "capture a profile of the selected training process (needs the agent)"),
    ("?", "this help"),
    ("Esc", "close a view or this help"),
)


def help_table() -> Table:
    table = Table(box=None, show_header=False, padding=(0, 2, 0, 0))
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    for key, what in KEYS:
        table.add_row(key, what)
    return table


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll {
        width: auto; max-width: 90%; height: auto; max-height: 90%;
        border: round $accent; padding: 0 1; background: $surface;
    }
    HelpScreen Static { width: auto; }
    """
    BINDINGS = [
        Binding("escape,question_mark,q", "dismiss", "close", show=False),
    ]

    def compose(self) -> ComposeResult:
        with VerticalScroll() as box:
            box.border_title = "gputop keys"
            yield Static(help_table())
            yield Static(Text("\nCharts share fixed ranges (0-100 %, 0-power limit, 0-memory, "
                              "0-PCIe link max) so GPUs compare at a glance.", style="dim"))

    def action_dismiss(self) -> None:
        self.dismiss(None)
