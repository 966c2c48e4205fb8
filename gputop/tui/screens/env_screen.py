"""`e` on a process: its full command line (wrapped) and its environment, secrets masked by
name (gputop/collect/environ.py). Read once in a thread worker, never on the event loop;
↑↓, PgUp/PgDn scroll, Esc closes."""

from __future__ import annotations

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Static

from gputop.collect.environ import ProcessEnvironment, read_environment
from gputop.tui.widgets.key_footer import KeyFooter
from gputop.tui.widgets.text_line import TextLine


def environment_text(env: ProcessEnvironment) -> Text:
    text = Text()
    if env.error:
        text.append(env.error, style="bold red")
        return text
    text.append("command: ", style="bold")
    text.append(env.command or "(none: a kernel thread or a zombie)")
    text.append("\n\n")
    text.append(f"environment ({len(env.variables)} variables", style="bold")
    if env.masked:
        text.append(f", {env.masked} masked: their names say they hold secrets", style="bold")
    text.append(")\n", style="bold")
    for name, value in env.variables:
        text.append(name, style="bold cyan")
        text.append(f"={value}\n")
    if env.cut:
        text.append(f"… {env.cut} more not shown\n", style="dim")
    return text


class EnvironmentScreen(Screen[None]):
    DEFAULT_CSS = """
    EnvironmentScreen { layout: vertical; }
    EnvironmentScreen #env-title { height: 1; padding: 0 1; background: $panel; }
    EnvironmentScreen VerticalScroll { height: 1fr; padding: 0 1; }
    """
    BINDINGS = [Binding("escape,e,q", "close", "back")]

    def __init__(self, pid: int) -> None:
        super().__init__()
        self.pid = pid
        self.environment: ProcessEnvironment | None = None
        self.title_line = TextLine(id="env-title")
        self.body = Static(Text("reading…", style="dim"), id="env-body")

    def compose(self) -> ComposeResult:
        yield self.title_line
        with VerticalScroll(id="env-scroll"):
            yield self.body
        yield KeyFooter()

    def on_mount(self) -> None:
        self.title_line.set_text(Text(f"pid {self.pid}: command line and environment   "
                                      "↑↓ PgUp PgDn scroll · Esc back", style="bold"))
        self.query_one("#env-scroll").focus()
        self._read()

    @work(thread=True, exit_on_error=False, group="environment")
    def _read(self) -> None:
        env = read_environment(self.pid)
        self.app.call_from_thread(self._show, env)

    def _show(self, env: ProcessEnvironment) -> None:
        self.environment = env
        self.body.update(environment_text(env))

    def action_close(self) -> None:
        self.dismiss(None)
