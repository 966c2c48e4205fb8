"""The `?` screen: every key, what it does, and what q never does."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

KEYS: tuple[tuple[str, str], ...] = (
    ("q, Ctrl-C", "quit (never signals any process)"),
    ("space", "pause the display (sampling goes on)"),
    ("1 2 3 4", "chart window: 1 min, 10 min, 1 h, whole run"),
    ("c", "compact mode: one line per GPU"),
    ("s / S", "sort by the next column / reverse"),
    ("/", "filter by pid, user or command (Esc clears)"),
    ("t", "DataLoader workers as a tree / flat list"),
    ("Enter", "process view: CPU, workers' CPU, GPU memory"),
    ("k", "send SIGTERM to the process (asks first)"),
    ("p", "capture 3 steps (all ranks of a job) or Python stacks"),
    ("m", "memory: what grows by line, the peak's parts (agent)"),
    ("M", "the last out-of-memory report (a process that died)"),
    ("F", "count the FLOPs of the next step again (MFU; agent)"),
    ("f", "findings: every one, the selected one in full"),
    ("Tab", "keys to the findings panel (↑ ↓ select) and back"),
    ("?", "this help"),
    ("Esc", "close a view or this help"),
)


def help_text() -> Text:
    text = Text()
    for i, (key, what) in enumerate(KEYS):
        text.append(("\n" if i else "") + f"{key:<10}", style="bold")
        text.append(f"  {what}")
    return text


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > Vertical {
        width: auto; max-width: 90%; height: auto; max-height: 90%;
        border: round $accent; padding: 0 1; background: $surface;
    }
    HelpScreen Static { width: auto; }
    """
    BINDINGS = [
        Binding("escape,question_mark,q", "dismiss", "close", show=False),
    ]

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = "gputop keys"
            yield Static(help_text())
            yield Static(Text("\nCharts have fixed ranges (0-100 %, 0-power limit,\n"
                              "0-memory, 0-PCIe link max): GPUs compare at a glance.",
                              style="dim"))

    def action_dismiss(self) -> None:
        self.dismiss(None)
