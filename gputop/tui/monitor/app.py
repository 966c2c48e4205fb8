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
(``tui/monitor/replay_feed.py``): space pauses, the arrow keys step a sample, [ and ] seek a minute,
Home and End go to either end; the keys that act on live processes (k, p) are off.
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import time
from collections.abc import Sequence

from textual import events, work
from textual.app import App, ComposeResult
from textual.containers import Horizontal, Vertical

from gputop.core.model import Snapshot
from gputop.diagnostics.findings import finding_key
from gputop.tui.monitor.app_support import (
    FrameReady,
    PlainText,
    SamplerFailed,
    freeze_startup_objects,
    showing_process,
    where_finder,
    where_ids,
)
from gputop.tui.monitor.capture_keys import CaptureKeys
from gputop.tui.monitor.captures import CaptureController
from gputop.tui.monitor.keys import KEYS, LIVE_ONLY, MAIN_ONLY, REPLAY_ONLY
from gputop.tui.monitor.replay_feed import ReplayFeed
from gputop.tui.monitor.table_keys import TableKeys
from gputop.tui.textual_fixes import heap, key_names, render_caches
from gputop.tui.textual_fixes.strip_cycles import install as install_acyclic_strips
from gputop.tui.textual_fixes.terminal import HangupSafeDriver, TerminalLost, exit_soon_anyway
from gputop.tui.view.frames import WINDOWS, FixedFeed, Frame, FrameLog, SamplerFeed, first_frame
from gputop.tui.view.layout import Plan, plan_layout
from gputop.tui.view.severity import worst_severity
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

install_acyclic_strips()  # lines the screen drops are freed at once, not ~50 s later
key_names.install()  # key names without faulting in Unicode's name database

NO_DRIVER_HINT = "try `gputop --demo tour` to see gputop on simulated GPUs"
KEPT_FILTER = "filter kept: / edits it, Esc clears it"
# Findings that stay up but whose numbers change are redrawn every FINDINGS_PERIOD seconds of
# snapshot time (their evidence is a 10 s window: a 5 s refresh reads the same, and the panel
# costs 2.5x less than redrawn with the table's numbers); a finding that raises or clears, or
# changes severity, shows at once.
FINDINGS_PERIOD = 4.9


class GputopApp(CaptureKeys, TableKeys, App[int]):
    CSS_PATH = "gputop.tcss"
    TITLE = "gputop"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = KEYS
    MAIN_ONLY, REPLAY_ONLY, LIVE_ONLY = MAIN_ONLY, REPLAY_ONLY, LIVE_ONLY

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in self.MAIN_ONLY and self.screen is not self.screen_stack[0]:
            return False
        replaying = isinstance(self.feed, ReplayFeed)
        if action in self.REPLAY_ONLY:
            # Not while typing in the filter box: its cursor takes the arrow keys.
            return replaying and self.focused is not self._filter_box()
        # LIVE_ONLY actions stay enabled while replaying: each says why it cannot act
        # (_replay_refuses), rather than a key that silently does nothing.
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
        readonly: bool = False,
    ) -> None:
        """``diagnose``: run the live rules (default: on for live sampling, off for a fixed
        sequence of ``snapshots``). ``auto_capture``: capture a process with an agent by
        itself when a stall finding raises on it. ``capture_timeout``: how long the agent
        may take to record the steps. ``early``: an EarlySampler already opening the driver
        (gputop top starts it before importing the interface). ``replay``: a recording to
        play back instead of sampling (its feed, made with ``self._post_frame`` as ``post``
        by ``replay_app``). ``readonly``: no signals and no captures (k, p, m, F, h and
        --auto-capture refuse)."""
        super().__init__(driver_class=HangupSafeDriver)
        self.readonly = readonly
        auto_capture = auto_capture and not readonly
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
                                    make_where=functools.partial(where_finder, auto_capture),
                                    where_ids=where_ids(auto_capture))
        # Every capture (p, m, F, M, --auto-capture) runs in the controller beside the App.
        self.capture = CaptureController(auto_capture=auto_capture, timeout=capture_timeout,
                                         live=isinstance(self.feed, SamplerFeed))
        self._early_drawn: Snapshot | None = None  # the early sample, drawn at mount
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
        yield self.capture

    def get_line_filters(self):
        if self.no_color:
            return [PlainText()]
        return super().get_line_filters()

    def on_mount(self) -> None:
        self.table.focus()
        self._apply_layout()
        self._show_early_sample()
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
        from gputop.client.session import open_sampler

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
        if self._early_drawn is not None and frame.snapshot is self._early_drawn:
            # The early sample's own frame: drawn already at mount (_show_early_sample).
            self._early_drawn = None
            if isinstance(self.feed, SamplerFeed):
                self.call_after_refresh(self.feed.first_shown.set)
            return
        self._show_frame(frame)

    def _show_early_sample(self) -> None:
        """At mount, the sample the early sampler took while the interface loaded: the
        first paint then shows the GPUs rather than empty panels (its frame, posted by the
        feed, arrives after that paint and is not drawn twice)."""
        first = getattr(self.early, "first", None)
        if first is not None:
            self.early.first = None  # drawn now, then history's: not kept for the whole run
        if first is not None and isinstance(self.feed, SamplerFeed):
            self._early_drawn = first
            self._show_frame(first_frame(first, self.feed.window, 0))

    def _show_frame(self, frame: Frame) -> None:
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
        if self.frames_rendered % render_caches.EVERY_FRAMES == 0:
            render_caches.clear()  # before this frame's paint, which measures what it shows
            heap.release_free_memory()
        snap = frame.snapshot
        if isinstance(self.feed, ReplayFeed):
            self.header.replay_position = self.feed.position
        self.header.show(snap, frame.window, self.paused)
        self.host.update_host(snap.host)
        self._render_gpus(frame)
        self.table.update_snapshot(snap)
        self.capture.new_frame(snap, frame.findings)
        self._render_findings(frame)
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
        notes = self.capture.keep_notes({finding_key(f) for f in findings})
        self.findings.update_findings(findings, notes)
        self.banner.show_findings(self.findings.findings)
        if isinstance(self.screen, FindingsScreen):
            self.screen.update_findings(self.findings.findings, notes)
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
        width, height = self.size
        chosen = plan_layout(width, height, len(self.gpu_indices)).compact
        # Back to what the size chooses: unpinned, so a later resize decides again.
        self.compact_choice = None if chosen == (not current) else not current
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
        box.border_title = None
        box.focus()

    def on_input_changed(self, event) -> None:
        if event.input.id == "filter":
            self.table.set_filter(event.value)

    def on_input_submitted(self, event) -> None:
        if event.input.id == "filter":
            event.input.display = bool(event.value)
            # Says the filter is kept and the keys go to the table again (painted after the
            # focus moves: a key typed once this shows reaches the table, not the box).
            event.input.border_title = KEPT_FILTER if event.value else None
            self.table.focus()

    def action_escape(self) -> None:
        box = self._filter_box()
        if box is not None and box.display:
            box.value = ""
            box.display = False
            self.table.set_filter("")
            self.table.focus()

    def action_help(self) -> None:
        from gputop.tui.screens.help_screen import HelpScreen  # on `?`: not at start-up

        self.push_screen(HelpScreen(self.readonly))

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
        from gputop.tui.screens.process_view import ProcessScreen  # on first use: start-up

        screen = ProcessScreen(pid)
        self.feed.focus_pid = pid
        self.push_screen(screen, callback=lambda _: self._left_process_view())
        self.feed.request_frame()

    def _left_process_view(self) -> None:
        self.feed.focus_pid = None

    # -- captures: the keys are CaptureKeys' (tui/monitor/capture_keys.py), the work the controller's --

    def action_capture(self, pid: int) -> None:
        """`p` on a process whose agent listens: capture, then show the diagnosis."""
        self.capture.start_trace(pid, None)

    def capture_job(self, job_id: str, pid: int) -> None:
        """Record the same steps on every rank of the job, then show the ranks side by side."""
        self.capture.start_job(job_id, pid)

    def memory_captured(self, report) -> None:
        """A memory capture finished: the memory findings on its GPU name what grows."""
        if not isinstance(self.feed, SamplerFeed):
            return
        if self.feed.memory_where is None:
            from gputop.capture.memory.where import MemoryWhere

            self.feed.memory_where = MemoryWhere()
        self.feed.memory_where.note(report)

    def show_diagnosis(self, pid: int, analysis, trace: str, source: str = "") -> None:
        """Show the analysis of a capture of ``pid`` on its own screen (Esc closes it);
        ``source``: the source lines of the top costs, when the trace has Python stacks."""
        from gputop.tui.screens.diagnosis_screen import DiagnosisScreen  # on first use

        self.push_screen(DiagnosisScreen(pid, analysis, trace, source))

    # Kept for the tests and the screenshots: what the controller holds.

    @property
    def captures(self) -> dict:
        return self.capture.traces

    @property
    def capture_notes(self) -> dict[tuple, str]:
        return self.capture.notes

    @property
    def auto_capture(self):
        return self.capture.auto
