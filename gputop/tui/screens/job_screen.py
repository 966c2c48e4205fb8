"""After `p` on a rank of a job (or the job row): the ranks side by side.

One bar per rank, its step time split into compute, waiting for a late rank inside
collectives, communication that moves data, and the rest; the straggler and what it did
instead; then the cross-rank report and where the traces are. Everything was computed off the
event loop (``gputop.client.jobs`` captured, ``gputop.diagnostics.trace.ranks`` compared); this
screen only lays it out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Static

from gputop.core.format import safe_text
from gputop.diagnostics.trace.ranks import CrossRank
from gputop.diagnostics.trace.reporting.report import format_cross_rank
from gputop.tui.screens.diagnosis_screen import PERFETTO
from gputop.tui.widgets.key_footer import KeyFooter
from gputop.tui.widgets.text_line import TextLine

# (part, style, legend): the order the segments are drawn in.
PARTS = (
    ("compute", "green", "compute"),
    ("waiting", "red", "waiting for a late rank"),
    ("bandwidth", "yellow", "communication moving data"),
    ("other", "grey50", "the rest (input, host, idle)"),
)
BAR = "█"


@dataclass
class JobResult:
    """What the capture thread hands to the screen."""

    job_id: str
    directory: str
    first_step: int | None
    cross: CrossRank | None
    failed: list[str] = field(default_factory=list)  # one line per rank with no trace
    warnings: list[str] = field(default_factory=list)


def rank_parts(row) -> dict[str, float]:
    """A rank's step (ms) split into the bar's parts; they add up to its step time."""
    compute = max(0.0, row.compute_ms)
    waiting = max(0.0, row.exposed_wait_ms)
    bandwidth = max(0.0, row.exposed_bandwidth_ms)
    other = max(0.0, row.step_ms - compute - waiting - bandwidth)
    return {"compute": compute, "waiting": waiting, "bandwidth": bandwidth, "other": other}


def bars_text(cross: CrossRank, width: int) -> Text:
    """One stacked bar per rank, scaled to the longest step, with its score and cause."""
    label_w = max(len(r.label) for r in cross.rows) + 1
    tail_w = 34
    bar_w = max(10, width - label_w - tail_w)
    longest = max((r.step_ms for r in cross.rows), default=0.0) or 1.0
    text = Text()
    for row in cross.rows:
        straggler = row is cross.straggler
        text.append(f"{row.label:<{label_w}}", style="bold red" if straggler else "bold")
        parts = rank_parts(row)
        cells = round(bar_w * row.step_ms / longest)
        drawn = 0
        for name, style, _ in PARTS:
            n = round(cells * parts[name] / row.step_ms) if row.step_ms else 0
            n = min(n, cells - drawn)
            text.append(BAR * n, style=style)
            drawn += n
        text.append(" " * (bar_w - drawn))
        text.append(f" {row.step_ms:7.1f} ms  score {row.straggler_score:4.2f}")
        if straggler:
            text.append("  ◀ straggler", style="bold red")
        text.append("\n")
    for _name, style, legend in PARTS:
        text.append(f"{BAR} ", style=style)
        text.append(f"{legend}   ")
    return text


def headline(result: JobResult) -> Text:
    cross = result.cross
    text = Text(f"job {safe_text(result.job_id)}: ", style="bold")
    if cross is None:
        text.append("no two ranks to compare", style="bold yellow")
        return text
    text.append(f"{len(cross.rows)} ranks, {len(cross.steps)} common steps"
                + (f" from {result.first_step}" if result.first_step is not None else "") + "  ")
    if cross.straggler is None:
        text.append("no straggler", style="bold green")
    else:
        text.append(f"straggler {cross.straggler.label}", style="bold red")
        text.append(f" ({cross.cause or 'no cause of its own stands out'}): the others wait "
                    f"{cross.others_wait_ms:.1f} ms per step")
    return text


class JobScreen(Screen[None]):
    DEFAULT_CSS = """
    JobScreen { layout: vertical; }
    JobScreen #job-title { height: 1; padding: 0 1; background: $panel; }
    JobScreen #job-bars { height: auto; padding: 0 1; border: round $secondary; }
    JobScreen #job-report {
        height: 1fr; border: round $secondary; padding: 0 1; scrollbar-size-vertical: 1;
    }
    """
    BINDINGS = [Binding("escape,q", "close", "back")]

    def __init__(self, result: JobResult) -> None:
        super().__init__()
        self.result = result
        self.bars = Static(id="job-bars")
        self.report = Static(id="job-report-body", expand=True)
        self._width = 0

    def compose(self) -> ComposeResult:
        yield TextLine(headline(self.result), id="job-title")
        yield self.bars
        with VerticalScroll(id="job-report") as box:
            box.border_title = "ranks of the job, the same steps (scroll: arrows, PgUp/PgDn)"
            yield self.report
        yield KeyFooter()

    def on_mount(self) -> None:
        self.bars.border_title = "per-rank step time"
        self.query_one("#job-report", VerticalScroll).focus()
        self._fit(self.app.size.width)

    def on_resize(self, event) -> None:
        self._fit(event.size.width)

    def _fit(self, screen_width: int) -> None:
        width = max(60, screen_width - 5)
        if width == self._width:
            return
        self._width = width
        r = self.result
        if r.cross is not None and r.cross.rows:
            self.bars.update(bars_text(r.cross, width))
        else:
            self.bars.update(Text("no two ranks of the job gave a trace to compare"))
        lines = [f"rank without a trace: {line}" for line in r.failed]
        lines += [f"warning: {line}" for line in r.warnings]
        body = "\n".join(safe_text(line) for line in lines)
        if r.cross is not None:
            body = (body + "\n\n" if body else "") + format_cross_rank(r.cross, width).rstrip()
        directory = safe_text(r.directory)
        body += (f"\n\ntraces: {directory}\nopen them: {PERFETTO} (Open trace file)  or  "
                 f"tensorboard --logdir {directory}  or  gputop analyze {directory}/*")
        self.report.update(Text(body))

    def action_close(self) -> None:
        self.dismiss(None)
