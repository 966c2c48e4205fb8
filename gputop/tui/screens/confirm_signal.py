"""Asks which signal to send, naming the process (or the tagged processes) it would go to.

TERM asks a process to stop (a training script may checkpoint first), INT is Ctrl-C's
(KeyboardInterrupt in Python), KILL cannot be caught. The focus starts on Cancel: Enter
pressed once too often sends nothing.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static

# (signal, the key that sends it, what it does), in the dialog's order.
SIGNALS: tuple[tuple[str, str, str], ...] = (
    ("SIGTERM", "t", "ask it to stop"),
    ("SIGINT", "i", "Ctrl-C: KeyboardInterrupt"),
    ("SIGKILL", "9", "stop it at once, no clean-up"),
)


class ConfirmSignalScreen(ModalScreen[str | None]):
    """Dismisses with the name of the signal to send, or None to leave the process alone."""

    DEFAULT_CSS = """
    ConfirmSignalScreen { align: center middle; }
    ConfirmSignalScreen > Vertical {
        width: 76; max-width: 95%; height: auto; border: thick $error; padding: 0 1;
        background: $surface;
    }
    ConfirmSignalScreen Horizontal { height: auto; align: center middle; margin-top: 1; }
    ConfirmSignalScreen Button { margin: 0 1; min-width: 10; }
    ConfirmSignalScreen #meaning { color: $text-muted; }
    """
    BINDINGS = [
        Binding("y,t", "answer('SIGTERM')", "TERM", show=False),
        Binding("i", "answer('SIGINT')", "INT", show=False),
        Binding("9", "answer('SIGKILL')", "KILL", show=False),
        Binding("n,escape", "answer(None)", "cancel", show=False),
        Binding("left", "app.focus_previous", show=False),
        Binding("right", "app.focus_next", show=False),
    ]

    def __init__(self, pid: int, description: str, signal_name: str = "SIGTERM",
                 count: int = 1) -> None:
        """``count``: how many processes (tagged ones) the signal would go to; ``pid`` and
        ``description`` then name the first."""
        super().__init__()
        self.pid = pid
        self.description = description
        self.signal_name = signal_name
        self.count = count

    def compose(self) -> ComposeResult:
        target = (f"process {self.pid}" if self.count == 1
                  else f"{self.count} tagged processes")
        with Vertical() as box:
            box.border_title = "send a signal?"
            yield Static(f"Send a signal to {target}?", id="question")
            yield Static(self.description, id="process")
            yield Static("  ".join(f"{name[3:]} ({key}): {what}"
                                   for name, key, what in SIGNALS), id="meaning")
            with Horizontal():
                for name, key, _ in SIGNALS:
                    yield Button(f"{name[3:]} ({key})", variant="error", id=name.lower())
                yield Button("Cancel (n)", variant="primary", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#cancel", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        button = event.button.id or "cancel"
        self.dismiss(None if button == "cancel" else button.upper())

    def action_answer(self, signal_name: str | None) -> None:
        self.dismiss(signal_name)
