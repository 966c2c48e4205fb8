"""The live monitor: a Textual app fed by one sampling thread.

Data flow: the sampler thread (a Textual thread worker) samples every interval, records into the
History, cuts the chart windows and posts an immutable ``FrameReady``; the handler on the UI
thread updates the existing widgets inside ``batch_update()``. A frame older than the newest one
posted is dropped on arrival, and consecutive frames in the queue collapse (``can_replace``), so
a slow terminal skips frames rather than falling behind. The layout changes only on a resize or
the compact toggle. Nothing on the event loop touches NVML, psutil, sockets or files: signals and
agent lookups run in short thread workers too.

The live rules run on the sampler thread and each frame carries the active findings; the
handler shows them in the findings panel and marks the GPU card / row and the process row they
are about. A capture (`p`, or `--auto-capture` when a stall raises) runs in a thread worker that
talks to the agent, waits for the trace and analyzes it; the UI shows its progress on a status
line above the process table and the diagnosis on a screen of its own.

Built with ``snapshots=[...]`` the app shows a fixed sequence (no sampler, no thread): the
snapshot tests and the screenshots use that. Built with ``replay=...`` it plays a recording
(``tui/replay_feed.py``): space pauses, the arrow keys step a sample, [ and ] seek a minute,
Home and End go to either end; the keys that act on live processes (k, p) are off.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import os
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.segment import Segment
from rich.text import Text
from textual import events, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.filter import LineFilter
from textual.message import Message
from textual.worker import get_current_worker

from gputop.diagnostics.findings import finding_key
from gputop.format import safe_text
from gputop.job_groups import jobs_in
from gputop.model import Snapshot
from gputop.tui.auto_capture import STALL_IDS, AutoCapturePolicy
from gputop.tui.frames import WINDOWS, FixedFeed, Frame, FrameLog, SamplerFeed
from gputop.tui.layout import Plan, plan_layout
from gputop.tui.replay_feed import ReplayFeed
from gputop.tui.rows import groups
from gputop.tui.severity import worst_severity
from gputop.tui.terminal import HangupSafeDriver, TerminalLost, exit_soon_anyway
from gputop.tui.widgets.findings import (
    FindingsBanner,
    FindingsPanel,
    FindingsScreen,
    findings_lines,
    needed_width,
)
from gputop.tui.widgets.gpu_panel import GpuPanel
from gputop.tui.widgets.header import StatusHeader
from gputop.tui.widgets.host_panel import HostPanel
from gputop.tui.widgets.key_footer import KeyFooter
from gputop.tui.widgets.process_table import ProcessTable
from gputop.tui.widgets.text_line import TextLine

if TYPE_CHECKING:
    from gputop.stacks.where import WhereFinder

NO_DRIVER_HINT = "try `gputop --demo tour` to see gputop on simulated GPUs"
CAPTURE_STEPS = 3
# Findings that stay up but whose numbers change are redrawn every FINDINGS_PERIOD seconds of
# snapshot time (their evidence is a 10 s window: a 5 s refresh reads the same, and the panel
# costs 2.5x less than redrawn with the table's numbers); a finding that raises or clears, or
# changes severity, shows at once.
FINDINGS_PERIOD = 4.9


def freeze_startup_objects() -> None:
    """Move what start-up built (Textual's DOM, styles, modules: ~90 000 objects) out of the
    garbage collector's sight: each full collection walked them all, ~25 ms every 15 s. A
    tick makes a few thousand short-lived containers: with the default threshold (700) that
    was ~3 young collections a second and a middle one every 4 s; now a tenth as many."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(7000, 10, 10)
    gc.enable()  # `gputop top` starts with it off (commands/top.py)


def where_finder(auto_capture: bool) -> WhereFinder | None:
    """The findings' "where" lines (py-spy), when py-spy is installed; with --auto-capture
    every stall on a process without the agent gets one (stacks stand in for a capture).
    Made by the feed after the first frame: the stacks modules are not needed before."""
    from gputop.stacks.pyspy import find_py_spy
    from gputop.stacks.where import WhereFinder

    if find_py_spy() is None:
        return None
    return WhereFinder(ids_without_agent=STALL_IDS if auto_capture else ())


def showing_process(screen) -> bool:
    """Whether ``screen`` is a process's screen (Enter). Its module, and numpy with it, is
    imported on first use: before that no screen can be one."""
    module = sys.modules.get("gputop.tui.widgets.process_view")
    return module is not None and isinstance(screen, module.ProcessScreen)


def home_short(path: str) -> str:
    """``path`` with the home directory as ~ (the findings panel is narrow)."""
    home = os.path.expanduser("~")
    if home not in ("", "/") and path.startswith(home + os.sep):
        return "~" + path[len(home):]
    return path


@dataclass
class CaptureRun:
    """A capture in flight: which process, for which finding (None: the `p` key), since when."""

    pid: int
    finding: tuple | None
    started: float
    stage: str = "asking the agent"


class FrameReady(Message):
    """A new frame from the sampler. A newer one waiting in the queue replaces it."""

    def __init__(self, frame: Frame) -> None:
        super().__init__()
        self.frame = frame

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, FrameReady)


class SamplerFailed(Message):
    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


class PlainText(LineFilter):
    """NO_COLOR: drop every style, not just the colours. Textual's own filter keeps grey
    tones, and any attribute (bold, reverse) makes terminals emit colour resets too."""

    def apply(self, segments: list[Segment], background) -> list[Segment]:
        return [Segment(text, None, control) for text, _, control in segments]


class GputopApp(App[int]):
    CSS_PATH = "gputop.tcss"
    TITLE = "gputop"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True),
        Binding("f", "show_findings", "Findings"),
        Binding("question_mark", "help", "Help"),
        Binding("space", "toggle_pause", "Pause"),
        Binding("1", "window(0)", "Window", key_display="1-4"),
        Binding("2", "window(1)", "10 min", show=False),
        Binding("3", "window(2)", "1 h", show=False),
        Binding("4", "window(3)", "whole run", show=False),
        Binding("c", "toggle_compact", "Compact"),
        Binding("s", "cycle_sort", "Sort"),
        Binding("S", "reverse_sort", "Reverse", show=False),
        Binding("slash", "filter", "Filter"),
        Binding("t", "toggle_tree", "Tree"),
        Binding("enter", "open_process", "Process"),
        Binding("k", "signal_process", "Kill"),
        Binding("p", "request_capture", "Capture"),
        Binding("m", "memory_capture", "Memory"),
        Binding("M", "last_oom", "Last OOM", show=False),
        Binding("F", "count_flops", "FLOPs", show=False),
        Binding("escape", "escape", show=False),
        # A recording played back (--replay): step, seek, either end.
        Binding("left", "step(-1)", "Step", key_display="←→", priority=True),
        Binding("right", "step(1)", "Step", show=False, priority=True),
        Binding("left_square_bracket", "seek(-60)", "Seek 1 min", key_display="[ ]"),
        Binding("right_square_bracket", "seek(60)", "Seek", show=False),
        Binding("home", "seek_to(0)", "Start", show=False, priority=True),
        Binding("end", "seek_to(-1)", "End", show=False, priority=True),
    ]
    # Keys of the main screen only: other screens (diagnosis, findings, a process, the
    # stacks) neither act on them nor list them in their footers.
    MAIN_ONLY = frozenset({"toggle_pause", "window", "toggle_compact", "cycle_sort",
                           "reverse_sort", "filter", "toggle_tree", "open_process",
                           "signal_process", "request_capture", "help", "escape",
                           "show_findings", "count_flops", "step", "seek", "seek_to",
                           "memory_capture", "last_oom"})
    REPLAY_ONLY = frozenset({"step", "seek", "seek_to"})
    LIVE_ONLY = frozenset({"signal_process", "request_capture",
                           "count_flops", "memory_capture"})  # act on a live process

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in self.MAIN_ONLY and self.screen is not self.screen_stack[0]:
            return False
        replaying = isinstance(self.feed, ReplayFeed)
        if action in self.REPLAY_ONLY:
            # Not while typing in the filter box: its cursor takes the arrow keys.
            return replaying and self.focused is not self._filter_box()
        if action in self.LIVE_ONLY and replaying:
            return False
        return True

    def __init__(
        self,
        *,
        demo: str | None = None,
        gpus: list[int] | None = None,
        interval: float = 1.0,
        seed: int = 0,
        snapshots: Sequence[Snapshot] | None = None,
        frame_log: str | None = None,
        diagnose: bool | None = None,
        auto_capture: bool = False,
        capture_timeout: float = 60.0,
        early=None,
        replay: ReplayFeed | None = None,
    ) -> None:
        """``diagnose``: run the live rules (default: on for live sampling, off for a fixed
        sequence of ``snapshots``). ``auto_capture``: capture a process with an agent by
        itself when a stall finding raises on it. ``capture_timeout``: how long the agent
        may take to record the steps. ``early``: an EarlySampler already opening the driver
        (gputop top starts it before importing the interface). ``replay``: a recording to
        play back instead of sampling (its feed, made with ``self._post_frame`` as ``post``
        by ``replay_app``)."""
        super().__init__(driver_class=HangupSafeDriver)
        self.early = early
        self.demo, self.gpus, self.seed, self.interval = demo, gpus, seed, interval
        self.frame_log = FrameLog(frame_log or os.environ.get("GPUTOP_FRAME_LOG"))
        if replay is not None:
            replay.post = self._post_frame
            self.feed: SamplerFeed | FixedFeed | ReplayFeed = replay
        elif snapshots is not None:
            self.feed = FixedFeed(self._post_frame, snapshots, diagnose=bool(diagnose))
        else:
            self.feed = SamplerFeed(self._post_frame, interval, self.frame_log,
                                    diagnose=diagnose is not False,
                                    make_where=functools.partial(where_finder, auto_capture))
        self.auto_capture = AutoCapturePolicy() if auto_capture else None
        self.capture_timeout = capture_timeout
        self.captures: dict[int, CaptureRun] = {}
        self.job_captures: dict[str, CaptureRun] = {}  # by job id
        self.capture_notes: dict[tuple, str] = {}  # finding key -> the line under it
        # Out-of-memory reports of processes with the agent that ended (`M` shows the last).
        self._agent_pids: dict[int, float | None] = {}  # pid -> create time, last frame
        self.ooms: dict[int, tuple] = {}  # pid -> (MemoryReport, path)
        self.last_oom: int | None = None
        self._capture_timer = None
        self._findings_shown: tuple | None = None
        self._findings_layout: tuple = (0, 0, False)
        self._layout_key: tuple | None = None
        self._findings_time = 0.0
        self.paused = False
        self._leaving = False
        self.compact_choice: bool | None = None  # None: the terminal size decides
        self.plan: Plan | None = None
        self.frame: Frame | None = None
        self.frames_rendered = 0
        self.frames_dropped = 0
        self.error: str | None = None
        self.exit_signal: int | None = None
        self.gpu_indices: tuple[int, ...] = ()
        self.gpu_panel = GpuPanel(id="gpu-panel")  # every GPU: cards, or a line each
        self.header = StatusHeader(interval, id="header")
        self.host = HostPanel(id="host")
        self.table = ProcessTable(id="processes")
        self.findings = FindingsPanel(id="findings")
        self.banner = FindingsBanner(id="findings-banner")
        self.gpu_message = TextLine("starting the sampler…", id="gpu-message")
        self.capture_line = TextLine(id="capture-status")

    # -- composition and layout -------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield self.header
        with Vertical(id="gpus"):
            yield self.gpu_message
            yield self.gpu_panel
        yield self.host
        with Horizontal(id="lower"):
            with Vertical(id="procs"):
                yield self.capture_line
                yield self.banner
                yield self.table
                # The filter box (/) is made on first use: start-up.
            yield self.findings
        yield KeyFooter()

    def get_line_filters(self):
        if self.no_color:
            return [PlainText()]
        return super().get_line_filters()

    def on_mount(self) -> None:
        self.table.focus()
        self._apply_layout()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGHUP, signal.SIGTERM):
            try:
                loop.add_signal_handler(signum, self._on_terminal_signal, signum)
            except (RuntimeError, ValueError, NotImplementedError):
                pass  # not the main thread (tests) or not Unix
        if isinstance(self.feed, FixedFeed):
            self.feed.request_frame()

    def on_load(self) -> None:
        # Start sampling (and the demo's processes) while the terminal and widgets are being
        # set up: the first frame is then ready about when the screen is.
        if isinstance(self.feed, SamplerFeed):
            if self.early is not None:
                self.early.attach(self.feed, lambda error: self.post_message(
                    SamplerFailed(error)), self._standin_failed)
            else:
                self._run_sampler()
        elif isinstance(self.feed, ReplayFeed):
            self._run_replay()

    def _on_terminal_signal(self, signum: int) -> None:
        """SIGHUP (the SSH connection dropped) or SIGTERM: leave like q does."""
        self.exit_signal = signum
        self._leaving = True
        self._stop_feed()
        exit_soon_anyway(128 + signum)
        self.exit(128 + signum)

    def on_terminal_lost(self, _message: TerminalLost) -> None:
        self._on_terminal_signal(signal.SIGHUP)

    def on_resize(self, event: events.Resize) -> None:
        # Runs before App's own handler has stored the new size: use the event's.
        self._apply_layout(event.size)

    def _apply_layout(self, size=None) -> None:
        n = len(self.gpu_indices)
        width, height = size or self.size
        findings = self.findings.findings
        # The list's width (and the panel's border and scrollbar); the lines of the list
        # and of the selected finding for a panel below the table.
        wanted = needed_width(findings) + 3 if findings else 0
        lines = (len(findings_lines(findings, self.capture_notes, self.findings.selected,
                                    max(20, width - 4))[0]) if findings else 0)
        plan = plan_layout(width, height, n, self.compact_choice, wanted, lines)
        self.plan = plan
        panel = self.gpu_panel
        panel.display = bool(n)
        self.gpu_message.display = not n
        if n:
            panel.styles.height = plan.gpu_lines
            panel.set_plan(plan)
        lower = self.query_one("#lower", Horizontal)
        self.findings.display = plan.findings
        self.banner.display = not plan.findings and bool(findings)
        if plan.findings_at == "side":
            lower.styles.layout = "horizontal"
            self.findings.styles.width = plan.findings_size
            self.findings.styles.height = "1fr"
        elif plan.findings_at == "below":
            lower.styles.layout = "vertical"
            self.findings.styles.width = "1fr"
            self.findings.styles.height = plan.findings_size
        self._layout_key = (width, height, plan)
        if self.frame is not None:
            self._render_gpus(self.frame)

    def _set_gpus(self, indices: tuple[int, ...]) -> None:
        """When the first frame names the GPUs (again only if the set changes)."""
        self.gpu_indices = indices
        self._apply_layout()

    # -- frames -----------------------------------------------------------------------------

    def _post_frame(self, frame: Frame) -> None:
        self.post_message(FrameReady(frame))

    @work(thread=True, exclusive=True, exit_on_error=False, name="sampler", group="sampler")
    def _run_sampler(self) -> None:
        from gputop.session import open_sampler

        feed = self.feed
        assert isinstance(feed, SamplerFeed)
        try:
            # No wait for the demo's workers: the first frame comes first, and they show as
            # they are forked.
            with open_sampler(self.demo, self.gpus, self.seed, wait_for_workers=0,
                              on_standin_failure=self._standin_failed) as sampler:
                if not feed.stopped:
                    feed.run(sampler)
        except Exception as exc:  # reported on screen and after exit, never as a traceback
            if not feed.stopped:
                self.post_message(SamplerFailed(f"{type(exc).__name__}: {exc}"))

    @work(thread=True, exclusive=True, exit_on_error=False, name="replay", group="sampler")
    def _run_replay(self) -> None:
        feed = self.feed
        assert isinstance(feed, ReplayFeed)
        try:
            feed.run()
        except Exception as exc:  # reported on screen and after exit, never as a traceback
            if not feed.stopped:
                self.post_message(SamplerFailed(f"{type(exc).__name__}: {exc}"))

    def _standin_failed(self, line: str) -> None:
        """A stand-in of the demo ended on its own (told from the demo's thread: notify only
        posts a message)."""
        self.notify(line, severity="error", timeout=15, markup=False)

    def _stop_feed(self) -> None:
        if isinstance(self.feed, (SamplerFeed, ReplayFeed)):
            self.feed.stop()

    def on_unmount(self) -> None:
        self._stop_feed()

    def on_sampler_failed(self, message: SamplerFailed) -> None:
        self.error = message.error
        self.exit(1)

    async def on_frame_ready(self, message: FrameReady) -> None:
        frame = message.frame
        if self._leaving:
            return  # quitting: do not spend the way out drawing
        if frame.seq < self.feed.latest_seq:
            self.frames_dropped += 1  # a newer frame is on its way
            return
        indices = tuple(g.index for g in frame.snapshot.gpus)
        if indices != self.gpu_indices:
            self._set_gpus(indices)
        started, started_cpu = time.perf_counter(), time.thread_time()
        with self.batch_update():
            self.render_frame(frame)
        if self.frames_rendered == 1 and isinstance(self.feed, SamplerFeed):
            self.call_after_refresh(self.feed.first_shown.set)  # sampling goes on
        if self.frame_log.path:
            handler_ms = (time.perf_counter() - started) * 1000.0
            handler_cpu_ms = (time.thread_time() - started_cpu) * 1000.0
            self.call_after_refresh(lambda: self.frame_log.record(
                handler_ms, handler_cpu_ms, (time.perf_counter() - started) * 1000.0))

    def render_frame(self, frame: Frame) -> None:
        self.frame = frame
        self.frames_rendered += 1
        if self.frames_rendered == 3:
            self.call_after_refresh(freeze_startup_objects)
        snap = frame.snapshot
        if isinstance(self.feed, ReplayFeed):
            self.header.replay_position = self.feed.position
        self.header.show(snap, frame.window, self.paused)
        self.host.update_host(snap.host)
        self._render_gpus(frame)
        self.table.update_snapshot(snap)
        self._render_findings(frame)
        self._watch_agents_end(snap)
        if showing_process(self.screen):
            self.screen.update_frame(frame)

    def _render_gpus(self, frame: Frame) -> None:
        snap = frame.snapshot
        if not snap.gpus:
            d = snap.driver
            text = (f"no GPU driver: {d.error}; {NO_DRIVER_HINT}" if not d.available
                    else "no GPUs visible")
            self.gpu_message.set_text(text)
            return
        self.gpu_panel.show(snap.gpus, frame.gpu_series, frame.start, frame.end)

    # -- findings -----------------------------------------------------------------------------

    def _render_findings(self, frame: Frame) -> None:
        findings = frame.findings
        if self.auto_capture is not None:
            with_agent = {g.proc.pid for g in groups(frame.snapshot) if g.proc.agent}
            for f in self.auto_capture.due(findings, with_agent):
                self._start_capture(f.pid, finding_key(f))
        if findings == self._findings_shown:
            return
        same_keys = self._findings_shown is not None and (
            [(finding_key(f), f.severity, f.where) for f in findings]
            == [(finding_key(f), f.severity, f.where) for f in self._findings_shown])
        if same_keys and 0 <= frame.snapshot.time - self._findings_time < FINDINGS_PERIOD:
            return  # only the numbers changed: they wait a little, like the table's
        self._findings_time = frame.snapshot.time
        self._findings_shown = findings
        self.show_findings(findings)

    def show_findings(self, findings: Sequence) -> None:
        """Render ``findings`` and mark the GPU card / row and the process row each is
        about."""
        active = {finding_key(f) for f in findings}
        running = {run.finding for run in self.captures.values()}
        # A note belongs to its finding: it goes when the finding clears.
        self.capture_notes = {k: v for k, v in self.capture_notes.items()
                              if k in active or k in running}
        self.findings.update_findings(findings, self.capture_notes)
        self.banner.show_findings(self.findings.findings)
        if isinstance(self.screen, FindingsScreen):
            self.screen.update_findings(self.findings.findings, self.capture_notes)
        self._relayout_for_findings()
        self._mark_gpus(findings)
        self.table.set_marks(worst_severity(findings, lambda f: f.pid))

    def _relayout_for_findings(self) -> None:
        """The panel's size follows its list: lay out again only when that changes (a
        finding raised or cleared), never for new numbers in the evidence."""
        findings = self.findings.findings
        key = (needed_width(findings) if findings else 0, len(findings), bool(findings),
               self.findings.selected)
        if key != self._findings_layout:
            self._findings_layout = key
            self._apply_layout()

    def action_show_findings(self) -> None:
        """`f`: every active finding, the selected one in full, at the terminal's width."""
        if isinstance(self.screen, FindingsScreen):
            self.screen.dismiss(None)
            return
        self.push_screen(FindingsScreen(self.findings.findings, self.capture_notes,
                                        self.findings.selected))

    def _mark_gpus(self, findings: Sequence) -> None:
        self.gpu_panel.set_marks(worst_severity(findings, lambda f: f.gpu))

    # -- keys -------------------------------------------------------------------------------

    def action_quit(self) -> None:
        self._leaving = True
        self._stop_feed()
        self.exit(0)

    def action_toggle_pause(self) -> None:
        self.paused = not self.paused
        self.header.show(None, self.feed.window, self.paused)
        self.feed.set_paused(self.paused)
        if isinstance(self.feed, ReplayFeed):
            self.notify("paused: ←→ step a sample, [ ] seek a minute" if self.paused
                        else "playing", timeout=2)
            return
        self.notify("paused: the display is frozen, sampling goes on" if self.paused
                    else "live", timeout=2)

    def action_step(self, samples: int) -> None:
        """A recording: one sample back or forward (it pauses there)."""
        assert isinstance(self.feed, ReplayFeed)
        self.paused = True
        self.feed.step(samples)

    def action_seek(self, seconds: float) -> None:
        assert isinstance(self.feed, ReplayFeed)
        self.feed.seek(seconds)

    def action_seek_to(self, index: int) -> None:
        assert isinstance(self.feed, ReplayFeed)
        self.feed.seek_to(index)

    def action_window(self, choice: int) -> None:
        self.feed.window = WINDOWS[choice]
        self.header.show(None, self.feed.window, self.paused)
        self.feed.request_frame()

    def action_toggle_compact(self) -> None:
        current = self.plan.compact if self.plan else False
        self.compact_choice = not current
        self._apply_layout()

    def action_cycle_sort(self) -> None:
        name = self.table.cycle_sort()
        self.notify(f"sorted by {name}", timeout=2)

    def action_reverse_sort(self) -> None:
        self.table.flip_sort()

    def action_toggle_tree(self) -> None:
        tree = self.table.toggle_tree()
        self.notify("workers as a tree" if tree else "flat list", timeout=2)

    def _filter_box(self):
        """The filter box, if / has made it."""
        found = self.query("#filter")
        return found.first() if found else None

    async def action_filter(self) -> None:
        box = self._filter_box()
        if box is None:
            from textual.widgets import Input

            box = Input(placeholder="filter: pid, user or command (Enter keeps, Esc clears)",
                        id="filter")
            await self.query_one("#procs", Vertical).mount(box, after=self.table)
        box.display = True
        box.focus()

    def on_input_changed(self, event) -> None:
        if event.input.id == "filter":
            self.table.set_filter(event.value)

    def on_input_submitted(self, event) -> None:
        if event.input.id == "filter":
            event.input.display = bool(event.value)
            self.table.focus()

    def action_escape(self) -> None:
        box = self._filter_box()
        if box is not None and box.display:
            box.value = ""
            box.display = False
            self.table.set_filter("")
            self.table.focus()

    def action_help(self) -> None:
        from gputop.tui.widgets.help_screen import HelpScreen  # on `?`: not at start-up

        self.push_screen(HelpScreen())

    def _selected_pid(self, training: bool = False) -> int | None:
        """The pid under the cursor; with ``training`` a worker row gives its parent."""
        row = self.table.selected_row()
        if row is None:
            self.notify("no process selected", severity="warning", timeout=3)
            return None
        if training and row.parent is not None:
            return row.parent
        return row.pid

    def on_process_table_row_selected(self, event: ProcessTable.RowSelected) -> None:
        self.action_open_process()

    def action_open_process(self) -> None:
        pid = self._selected_pid(training=True)
        if pid is None or showing_process(self.screen):
            return
        from gputop.tui.widgets.process_view import ProcessScreen  # on first use: start-up

        screen = ProcessScreen(pid)
        self.feed.focus_pid = pid
        self.push_screen(screen, callback=lambda _: self._left_process_view())
        self.feed.request_frame()

    def _left_process_view(self) -> None:
        self.feed.focus_pid = None

    def action_signal_process(self) -> None:
        row = self.table.selected_row()
        if row is None:
            self.notify("no process selected", severity="warning", timeout=3)
            return
        if not row.visible:
            self.notify(f"pid {row.pid} is not visible from here (another pid namespace)",
                        severity="warning")
            return
        cells = row.cells
        description = f"{cells['command']}  (user {cells['user'] or '?'}, GPU {cells['gpu']})"
        create_time = self._create_time(row.pid)

        def answered(send: bool | None) -> None:
            if send:
                self._send_signal(row.pid, create_time, signal.SIGTERM)

        # Imported on `k`: its buttons bring in widget modules the start-up does not need.
        from gputop.tui.widgets.confirm_signal import ConfirmSignalScreen

        self.push_screen(ConfirmSignalScreen(row.pid, description), callback=answered)

    def _create_time(self, pid: int) -> float | None:
        if self.frame is None:
            return None
        for group in groups(self.frame.snapshot):
            if group.proc.pid == pid:
                return group.proc.create_time
        return None

    @work(thread=True, group="actions", exit_on_error=False)
    def _send_signal(self, pid: int, create_time: float | None, signum: int) -> None:
        import psutil

        name = signal.Signals(signum).name
        try:
            proc = psutil.Process(pid)
            # The pid may have been reused since the row was drawn: check it is the same one.
            if create_time is not None and abs(proc.create_time() - create_time) > 0.01:
                raise psutil.NoSuchProcess(pid)
            proc.send_signal(signum)
        except psutil.NoSuchProcess:
            self.call_from_thread(self.notify, f"pid {pid} has already ended",
                                  severity="warning")
        except (psutil.AccessDenied, PermissionError):
            self.call_from_thread(self.notify, f"not allowed to signal pid {pid}",
                                  severity="error")
        else:
            self.call_from_thread(self.notify, f"sent {name} to pid {pid}")

    def action_count_flops(self) -> None:
        """`m`: count the FLOPs of the selected process's next step again (its agent's
        FlopCounterMode), for MFU; on a job row, of every rank."""
        row = self.table.selected_row()
        if row is not None and row.job is not None:
            job = next((j for j in jobs_in(self.frame.snapshot) if j.job_id == row.job), None) \
                if self.frame is not None else None
            pids = [r.pid for r in job.ranks] if job is not None else []
        else:
            pid = self._selected_pid(training=True)
            pids = [] if pid is None else [pid]
        for pid in pids:
            self.notify(f"counting the FLOPs of pid {pid}'s next step", timeout=3)
            self._count_flops(pid)

    @work(thread=True, group="flops", exit_on_error=False)
    def _count_flops(self, pid: int) -> None:
        """Off the event loop: the agent answers once the counted step has ended."""
        from gputop.client.agents import AgentError, request_flop_count
        from gputop.efficiency import flops_text

        try:
            reply = request_flop_count(pid)
        except (AgentError, OSError) as exc:
            self.call_from_thread(self.notify, safe_text(str(exc)), severity="warning",
                                  timeout=8)
            return
        cost = reply.get("cost_s")
        text = (f"pid {pid}: {flops_text(reply.get('flops_per_step'))} per step "
                f"({safe_text(str(reply.get('precision')))}), counted at step "
                f"{reply.get('step')}"
                + (f"; counting cost the job {cost * 1000:.0f} ms"
                   if isinstance(cost, (int, float)) else ""))
        self.call_from_thread(self.notify, text, timeout=8)

    # -- memory: `m`, and the report of a process that ran out of memory ----------------------

    def action_memory_capture(self) -> None:
        """`m`: where the selected training process's memory goes (its agent's memory
        capture: growth by source line, the peak's parts, reserved versus allocated)."""
        pid = self._selected_pid(training=True)
        if pid is not None:
            self._memory_lookup(pid)

    @work(thread=True, group="actions", exit_on_error=False)
    def _memory_lookup(self, pid: int) -> None:
        """Off the event loop: listing agents reads a socket directory."""
        from gputop.client import agents as client

        try:
            has_agent = pid in client.list_agents() or client.find_agent(pid) is not None
        except Exception:
            has_agent = False
        if has_agent:
            self.call_from_thread(self.show_memory, pid)
        else:
            self.call_from_thread(self.notify, f"{client.no_agent_hint(pid)}: a memory capture "
                                  "needs the agent", severity="warning", timeout=8)

    def show_memory(self, pid: int) -> None:
        from gputop.tui.widgets.memory_screen import MemoryScreen  # on first use: start-up

        if not isinstance(self.screen, MemoryScreen):
            self.push_screen(MemoryScreen(pid, self._command(pid),
                                          timeout=self.capture_timeout))

    def memory_captured(self, report) -> None:
        """A memory capture finished: the memory findings on its GPU name what grows."""
        if not isinstance(self.feed, SamplerFeed):
            return
        if self.feed.memory_where is None:
            from gputop.memory.where import MemoryWhere

            self.feed.memory_where = MemoryWhere()
        self.feed.memory_where.note(report)

    def _watch_agents_end(self, snap: Snapshot) -> None:
        """A process with the agent that is gone may have died of an out-of-memory error: its
        agent then wrote a report (looked for off the event loop)."""
        if not isinstance(self.feed, SamplerFeed):
            return
        now = {g.proc.pid: g.proc.create_time for g in groups(snap) if g.proc.agent}
        for pid, started in self._agent_pids.items():
            if pid not in now:
                self._look_for_oom(pid, started)
        self._agent_pids = now

    @work(thread=True, group="oom", exit_on_error=False)
    def _look_for_oom(self, pid: int, started: float | None) -> None:
        from gputop.memory.oom_files import oom_report_of
        from gputop.memory.report import ReportError, read_report

        path = oom_report_of(pid)
        if path is None:
            return
        try:
            report = read_report(path)
        except ReportError:
            return
        if report.kind != "oom" or (started is not None and report.time < started - 1.0):
            return  # an earlier process's, with the same pid
        self.call_from_thread(self._oom_found, pid, report, path)

    def _oom_found(self, pid: int, report, path: str) -> None:
        self.ooms[pid] = (report, path)
        self.last_oom = pid
        where = report.oom.where.location() if report.oom.where is not None else None
        self.notify(safe_text(f"pid {pid} ran out of memory"
                              + (f" at {where}" if where else "")
                              + ": M shows what held the memory"), severity="error",
                    timeout=30)

    def action_last_oom(self) -> None:
        """`M`: the out-of-memory report of the last process with the agent that died of it."""
        if self.last_oom is None:
            self.notify("no process with the agent has run out of memory since gputop "
                        "started (gputop memory --last-oom PID reads an older one)", timeout=6)
            return
        from gputop.tui.widgets.memory_screen import MemoryScreen

        report, path = self.ooms[self.last_oom]
        self.push_screen(MemoryScreen(self.last_oom, report=report, path=path))

    def action_request_capture(self) -> None:
        row = self.table.selected_row()
        if row is not None and row.job is not None:  # the job row: every rank
            self.capture_job(row.job, row.pid)
            return
        pid = self._selected_pid(training=True)
        if pid is None:
            return
        self._look_up_agent(pid)

    @work(thread=True, group="actions", exit_on_error=False)
    def _look_up_agent(self, pid: int) -> None:
        """Off the event loop: listing agents reads a socket directory."""
        from gputop.client import agents as client

        try:  # also in a container, from the host, or in a namespace beside ours
            has_agent = pid in client.list_agents() or client.find_agent(pid) is not None
        except Exception:  # an unreadable socket directory: no agent we can reach
            has_agent = False
        if has_agent:
            job = self._job_of(pid)
            if job is not None:
                self.call_from_thread(self.capture_job, job.job_id, pid)
            else:
                self.call_from_thread(self.action_capture, pid)
            return
        from gputop.stacks.pyspy import unusable_reason

        why_not = unusable_reason(pid)  # no agent: its Python stacks from outside, if we may
        if why_not is None:
            self.call_from_thread(self.show_stacks, pid)
        else:
            self.call_from_thread(self.notify, f"{client.no_agent_hint(pid)}; "
                                  f"py-spy: {safe_text(why_not)}", severity="warning", timeout=8)

    def show_stacks(self, pid: int) -> None:
        """`p` on a process without the agent: its Python stacks (py-spy) on a screen."""
        from gputop.tui.widgets.stacks_screen import StacksScreen  # on first use: start-up

        if not isinstance(self.screen, StacksScreen):
            self.push_screen(StacksScreen(pid, self._command(pid)))

    def _command(self, pid: int) -> str | None:
        for group in groups(self.frame.snapshot) if self.frame is not None else ():
            if group.proc.pid == pid:
                return group.proc.cmdline or group.proc.name
        return None

    def action_capture(self, pid: int) -> None:
        """`p` on a process whose agent listens: capture, then show the diagnosis."""
        self._start_capture(pid, None)

    # -- captures ---------------------------------------------------------------------------

    def _start_capture(self, pid: int, finding: tuple | None) -> None:
        if pid in self.captures:
            self.notify(f"a capture of pid {pid} is already running", severity="warning",
                        timeout=4)
            return
        self.captures[pid] = CaptureRun(pid, finding, time.monotonic())
        if finding is None:
            if self.auto_capture is not None:
                self.auto_capture.record(pid)
            self.notify(f"capture requested for pid {pid}: recording {CAPTURE_STEPS} steps",
                        timeout=4)
        else:
            self._set_note(finding, "capture: running…")
        if self._capture_timer is None:
            self._capture_timer = self.set_interval(1.0, self._show_capture_status)
        self._show_capture_status()
        self._run_capture(pid)

    def _show_capture_status(self) -> None:
        """The status line above the process table, with the elapsed seconds."""
        if not self.captures and not self.job_captures:
            self.capture_line.display = False
            if self._capture_timer is not None:
                self._capture_timer.stop()
                self._capture_timer = None
            return
        now = time.monotonic()
        parts = []
        for run in self.captures.values():
            who = "auto-capture" if run.finding is not None else "capture"
            parts.append(f"{who} of pid {run.pid}: {run.stage} · {now - run.started:.0f} s")
        for job_id, run in self.job_captures.items():
            parts.append(f"capture of job {safe_text(job_id)[:40]}: {safe_text(run.stage)} · "
                         f"{now - run.started:.0f} s")
        self.capture_line.set_text(Text("◷ " + "   ".join(parts), style="bold"))
        self.capture_line.display = True

    def _set_note(self, finding: tuple, note: str) -> None:
        self.capture_notes[finding] = note
        self.findings.update_findings(self.findings.findings, self.capture_notes)

    @work(thread=True, group="capture", exit_on_error=False)
    def _run_capture(self, pid: int) -> None:
        """Off the event loop: the capture service records the steps (the bounded defaults of
        `gputop capture`) and analyses the trace."""
        from gputop.capture.service import CaptureFailed, CaptureSettings, capture
        from gputop.client.agents import progress_text

        worker = get_current_worker()
        shown = [""]

        def tell(method, *args) -> None:
            if not worker.is_cancelled:  # the app is leaving: nobody to tell
                self.call_from_thread(method, *args)

        def progress(status: dict) -> None:
            stage = progress_text(status)
            if stage != shown[0]:
                shown[0] = stage
                tell(self._capture_stage, pid, stage)

        try:
            result = capture(pid, CaptureSettings(steps=CAPTURE_STEPS,
                                                  timeout=self.capture_timeout),
                             on_progress=progress, should_stop=lambda: worker.is_cancelled)
        except CaptureFailed as exc:
            tell(self._capture_failed, pid, str(exc))
            return
        except Exception as exc:  # never a traceback on screen: one line, and go on
            tell(self._capture_failed, pid, f"capture of pid {pid} failed: {exc}")
            return
        if result.analysis is None:
            tell(self._capture_failed, pid, result.failure())
            return
        for note in result.notes:
            tell(self.notify, safe_text(note), severity="warning", timeout=8)
        tell(self._capture_done, pid, result.trace, result.analysis, result.source_text())

    def _capture_stage(self, pid: int, stage: str) -> None:
        run = self.captures.get(pid)
        if run is not None:
            run.stage = stage
            self._show_capture_status()

    def _capture_failed(self, pid: int, message: str) -> None:
        run = self.captures.pop(pid, None)
        self._show_capture_status()
        line = safe_text(" ".join(message.split()))  # one line, whatever the agent said
        if run is not None and run.finding is not None:
            self._set_note(run.finding, f"capture failed: {line}")
        self.notify(line, severity="error", timeout=8)

    def _capture_done(self, pid: int, trace: str, analysis, source: str = "") -> None:
        run = self.captures.pop(pid, None)
        self._show_capture_status()
        if run is not None and run.finding is not None:
            self._set_note(run.finding,
                           f"capture: {analysis.verdict}, trace {home_short(trace)}")
            self.notify(f"auto-capture of pid {pid}: {analysis.verdict}; trace {trace}",
                        timeout=8)
            return
        self.show_diagnosis(pid, analysis, trace, source)

    def show_diagnosis(self, pid: int, analysis, trace: str, source: str = "") -> None:
        """Show the analysis of a capture of ``pid`` on its own screen (Esc closes it);
        ``source``: the source lines of the top costs, when the trace has Python stacks."""
        from gputop.tui.widgets.diagnosis_screen import DiagnosisScreen  # on first use

        self.push_screen(DiagnosisScreen(pid, analysis, trace, source))

    # -- whole jobs: `p` on a rank or on the job row ----------------------------------------

    def _job_of(self, pid: int):
        """The distributed job (two or more ranks on this node) that ``pid`` is a rank or the
        launcher of, from the newest frame; None for a lone process."""
        snap = self.frame.snapshot if self.frame is not None else None
        if snap is None:
            return None
        for job in jobs_in(snap):
            if len(job.ranks) >= 2 and (pid in job.pids or pid == job.launcher_pid):
                return job
        return None

    def capture_job(self, job_id: str, pid: int) -> None:
        """Record the same steps on every rank of the job, then show the ranks side by side."""
        if job_id in self.job_captures:
            self.notify(f"a capture of job {safe_text(job_id)} is already running",
                        severity="warning", timeout=4)
            return
        self.job_captures[job_id] = CaptureRun(pid, None, time.monotonic(), "asking the ranks")
        self.notify(f"capture requested for every rank of job {safe_text(job_id)}: recording "
                    f"{CAPTURE_STEPS} steps", timeout=4)
        if self._capture_timer is None:
            self._capture_timer = self.set_interval(1.0, self._show_capture_status)
        self._show_capture_status()
        self._run_job_capture(job_id, pid)

    @work(thread=True, group="capture", exit_on_error=False)
    def _run_job_capture(self, job_id: str, pid: int) -> None:
        """Off the event loop: every rank records the same steps, each trace is analysed, the
        ranks are compared."""
        from gputop.capture.service import CaptureFailed, CaptureSettings, capture_job
        from gputop.tui.widgets.job_screen import JobResult

        worker = get_current_worker()

        def tell(method, *args) -> None:
            if not worker.is_cancelled:
                self.call_from_thread(method, *args)

        try:
            done = capture_job(pid, CaptureSettings(steps=CAPTURE_STEPS,
                                                    timeout=self.capture_timeout),
                               on_progress=lambda text: tell(self._job_stage, job_id, text),
                               should_stop=lambda: worker.is_cancelled)
        except CaptureFailed as exc:
            tell(self._job_failed, job_id, f"capture of job {job_id} failed: {exc}")
            return
        except Exception as exc:  # never a traceback on screen
            tell(self._job_failed, job_id,
                 f"capture of job {job_id} failed: {type(exc).__name__}: {exc}")
            return
        result = done.capture
        failed = [f"rank {rc.agent.rank} (pid {rc.agent.pid}): {rc.error}"
                  for rc in result.failed]
        first = next((rc.reply.get("first_recorded_step") for rc in result.captured), None)
        tell(self._job_done, JobResult(job_id, str(result.directory),
                                       first if isinstance(first, int) else None,
                                       done.cross, failed, done.problems))

    def _job_stage(self, job_id: str, stage: str) -> None:
        run = self.job_captures.get(job_id)
        if run is not None:
            run.stage = stage
            self._show_capture_status()

    def _job_failed(self, job_id: str, message: str) -> None:
        self.job_captures.pop(job_id, None)
        self._show_capture_status()
        self.notify(safe_text(" ".join(message.split())), severity="error", timeout=8)

    def _job_done(self, result) -> None:
        self.job_captures.pop(result.job_id, None)
        self._show_capture_status()
        from gputop.tui.widgets.job_screen import JobScreen

        self.push_screen(JobScreen(result))
