"""Asks before a signal is sent, naming the process it would go to."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static


class ConfirmSignalScreen(ModalScreen[bool]):
    """Dismisses with True to send the signal, False to leave the process alone."""

    DEFAULT_CSS = """
    ConfirmSignalScreen { align: center middle; }
    ConfirmSignalScreen > Vertical {
        width: 70; max-width: 95%; height: auto; border: thick $error; padding: 0 1;
        background: $surface;
    }
    ConfirmSignalScreen Horizontal { height: auto; align: center middle; margin-top: 1; }
    ConfirmSignalScreen Button { margin: 0 1; }
    """
    BINDINGS = [
        Binding("y", "answer(True)", "send", show=False),
        Binding("n,escape", "answer(False)", "cancel", show=False),
    ]

    def __init__(self, pid: int, description: str, signal_name: str = "SIGTERM") -> None:
        super().__init__()
        self.pid = pid
        self.description = description
        self.signal_name = signal_name

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = f"send {self.signal_name}?"
            yield Static(f"Send {self.signal_name} to process {self.pid}?", id="question")
            yield Static(self.description, id="process")
            with Horizontal():
                yield Button(f"Send {self.signal_name} (y)", variant="error", id="send")
                yield Button("Cancel (n)", variant="primary", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#cancel", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "send")

    def action_answer(self, send: bool) -> None:
        self.dismiss(send)
