"""The live monitor's keys: its bindings and where each acts (see ``GputopApp.check_action``).

The footer shows them in this order, as many as fit: the most used first."""

from __future__ import annotations

from textual.binding import Binding

KEYS = [
    Binding("q", "quit", "Quit"),
    Binding("ctrl+c", "quit", "Quit", show=False, priority=True),
    Binding("question_mark", "help", "Help"),
    Binding("enter", "open_process", "Process"),
    Binding("k", "signal_process", "Signal"),
    Binding("s", "cycle_sort", "Sort"),
    Binding("S", "reverse_sort", "Reverse", show=False),
    Binding("f", "show_findings", "Findings"),
    Binding("p", "request_capture", "Capture"),
    Binding("e", "environment", "Env"),
    Binding("slash", "filter", "Filter"),
    # Live: space tags the selected process (k then signals every tagged one), as in nvitop;
    # a recording played back pauses with it (nothing there can be signalled).
    Binding("space", "space", "Tag"),
    Binding("J", "tag_job", "Tag job", show=False),
    Binding("P", "toggle_pause", "Pause"),
    Binding("c", "toggle_compact", "Compact"),
    Binding("t", "toggle_tree", "Tree"),
    Binding("a", "toggle_everyone", "All"),
    Binding("1", "window(0)", "Window", key_display="1-4"),
    Binding("2", "window(1)", "10 min", show=False),
    Binding("3", "window(2)", "1 h", show=False),
    Binding("4", "window(3)", "whole run", show=False),
    Binding("m", "memory_capture", "Memory"),
    Binding("h", "hang_report", "Hang"),
    Binding("F", "count_flops", "FLOPs"),
    Binding("M", "last_oom", "Last OOM"),
    Binding("tab", "focus_next", "Panel", show=False),
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
                       "memory_capture", "last_oom", "hang_report", "environment", "space",
                       "tag_job", "toggle_everyone"})
REPLAY_ONLY = frozenset({"step", "seek", "seek_to"})
LIVE_ONLY = frozenset({"signal_process", "request_capture", "environment", "tag_job",
                       "count_flops", "memory_capture", "hang_report"})  # act on a live process
# What --readonly refuses: every key that acts on a process (a signal, a capture).
ACTS = frozenset({"signal_process", "request_capture", "count_flops", "memory_capture",
                  "hang_report"})
