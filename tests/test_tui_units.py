"""The TUI's pure parts: chart drawing, layout decisions, process rows and line fitting."""

from __future__ import annotations

import math
import re
from dataclasses import replace

import numpy as np
import pytest
from rich.cells import cell_len

from gputop.core.agent_status import parse_status
from gputop.core.model import GpuSample, ProcSample, WorkerSample
from gputop.tui.view.layout import plan_layout
from gputop.tui.view.rows import build_rows
from gputop.tui.widgets.cards import card_lines, compact_pieces, compact_spark_width
from gputop.tui.widgets.chart import braille_lines, resample, sparkline
from gputop.tui.widgets.gauges import bar, pcie_link_max_mbs
from gputop.tui.widgets.header import header_text
from gputop.tui.widgets.host_panel import host_lines, per_core_text
from tests.tui_data import scenario_snapshots

SNAPS = scenario_snapshots("tour", 30)


# -- charts --------------------------------------------------------------------------------

def test_resample_means_per_bin_and_leaves_no_data_as_nan():
    t = np.array([0.0, 0.5, 1.0, 1.5, 8.0])
    v = np.array([10.0, 20.0, 30.0, 50.0, 70.0], dtype=np.float32)
    out = resample(t, v, 0.0, 10.0, 5)  # bins of 2 s
    assert out[0] == pytest.approx(27.5)  # mean of the four samples of the first bin
    assert math.isnan(out[1]) and math.isnan(out[2])  # a real gap, wider than the spacing
    assert out[4] == pytest.approx(70.0)


def test_resample_fills_bins_narrower_than_the_sampling_interval():
    t = np.arange(0.0, 60.0, 1.0)
    v = np.full(60, 40.0, dtype=np.float32)
    out = resample(t, v, 0.0, 60.0, 240)  # 4 bins per sample
    assert not np.isnan(out[:236]).any()


def test_resample_keeps_a_lost_gpu_as_a_gap():
    t = np.arange(0.0, 20.0, 1.0)
    v = np.where(t < 10, 90.0, np.nan).astype(np.float32)
    out = resample(t, v, 0.0, 20.0, 20)
    assert not np.isnan(out[:10]).any() and np.isnan(out[12:]).all()


def test_braille_uses_a_fixed_range_and_shows_small_values():
    values = np.array([100.0, 100.0, 50.0, 50.0, 1.0, 1.0, np.nan, np.nan])
    top, bottom = braille_lines(values, vmax=100.0, height=2)
    assert len(top) == len(bottom) == 4
    assert top[0] == "⣿" and bottom[0] == "⣿"  # full scale: both rows full
    assert top[1] == "⠀" and bottom[1] == "⣿"  # half scale: the bottom row only
    assert bottom[2] == "⣀"  # 1 %: still one dot, so it reads as "some", not "none"
    assert bottom[3] == "⠀"  # no data: blank
    # Values above the range are clipped, not rescaled.
    assert braille_lines(np.array([500.0, 500.0]), 100.0, 1) == ["⣿"]


def test_sparkline_levels():
    assert sparkline(np.array([0.0, 50.0, 100.0, np.nan]), 100.0) == "▁▄█ "
    assert sparkline(np.array([1.0]), 0.0) == " "  # unknown range: nothing drawn


def test_bar_in_eighths():
    assert bar(0.5, 4) == "██░░"
    assert bar(0.5, 1) == "▌" and bar(1 / 8, 1) == "▏"
    assert bar(None, 3) == "···"
    assert bar(2.0, 3) == "███"


def test_pcie_link_max():
    gpu = GpuSample(index=0, pcie_gen_max=4, pcie_width_max=16)
    # 16 GT/s x 16 lanes x 128/130 / 8 bits = 31.5 GB/s each way
    assert pcie_link_max_mbs(gpu) == pytest.approx(16 * 16 * 128 / 130 / 8 * 1000)
    assert pcie_link_max_mbs(GpuSample(index=0)) is None


# -- layout --------------------------------------------------------------------------------

@pytest.mark.parametrize("size,gpus,compact,findings", [
    ((80, 24), 8, True, False),
    ((80, 24), 1, True, False),  # a short terminal: one line per GPU even for one
    ((120, 40), 8, True, True),
    ((120, 40), 1, False, True),
    ((160, 50), 8, False, True),
    ((200, 60), 8, False, True),
    ((160, 50), 16, True, True),  # many GPUs
])
def test_plan_layout(size, gpus, compact, findings):
    plan = plan_layout(*size, gpus)
    assert plan.compact is compact and plan.findings is findings
    if not compact:
        rows = math.ceil(gpus / plan.columns)
        assert rows * plan.card_height + 4 + 10 <= size[1]
        assert plan.columns * 40 <= size[0]


def test_plan_layout_follows_the_users_choice():
    assert plan_layout(160, 50, 8, compact=True).compact
    assert not plan_layout(80, 24, 1, compact=False).compact


# -- process rows --------------------------------------------------------------------------

def _snap_with(procs_by_gpu):
    base = SNAPS[-1]
    gpus = tuple(replace(g, processes=tuple(procs_by_gpu.get(g.index, ()))) for g in base.gpus)
    return replace(base, gpus=gpus)


def _proc(pid, mem, cpu, workers=()):
    return ProcSample(pid=pid, name="python", gpu_mem=mem, cpu_percent=cpu, cmdline=f"job {pid}",
                      user="u", state="running",
                      workers=tuple(WorkerSample(w, "w", c, 1, "sleeping") for w, c in workers))


def test_rows_tree_by_gpu_with_workers_under_their_process():
    snap = _snap_with({0: [_proc(30, 5, 1, [(32, 9.0), (31, 8.0)])], 1: [_proc(20, 9, 2)]})
    rows = build_rows(snap)
    assert [r.pid for r in rows] == [30, 31, 32, 20]
    assert rows[1].parent == 30 and rows[2].cells["command"].startswith("└─ ")


def test_rows_sort_descending_by_default_reverse_and_missing_last():
    snap = _snap_with({0: [_proc(30, 5, 1)], 1: [_proc(20, 9, 2)], 2: [_proc(10, None, 3)]})
    assert [r.pid for r in build_rows(snap, sort="gpu_mem")] == [20, 30, 10]
    assert [r.pid for r in build_rows(snap, sort="gpu_mem", reverse=True)] == [30, 20, 10]
    assert [r.pid for r in build_rows(snap, sort="pid")] == [10, 20, 30]


def test_rows_flat_list_and_filter():
    snap = _snap_with({0: [_proc(30, 5, 1, [(31, 80.0)])], 1: [_proc(20, 9, 2)]})
    flat = build_rows(snap, sort="cpu", tree=False)
    assert [r.pid for r in flat] == [31, 20, 30]
    assert flat[0].cells["command"] == "w (worker of 30)"
    assert [r.pid for r in build_rows(snap, needle="job 20")] == [20]
    assert [r.pid for r in build_rows(snap, needle="31")] == [30, 31]  # a worker's pid


def test_a_process_on_two_gpus_is_one_row():
    p = _proc(30, 5, 1, [(31, 1.0)])
    rows = build_rows(_snap_with({0: [p], 3: [p]}))
    assert [r.pid for r in rows] == [30, 31] and rows[0].cells["gpu"] == "0,3"


def test_a_child_that_holds_a_gpu_is_not_listed_twice():
    child = _proc(31, 1, 1)
    parent = _proc(30, 5, 1, [(31, 1.0)])
    rows = build_rows(_snap_with({0: [parent], 1: [child]}))
    assert sorted(r.pid for r in rows) == [30, 31] and len(rows) == 2


# -- fitting lines to the width ------------------------------------------------------------

@pytest.mark.parametrize("width", [60, 80, 100, 120, 160, 250])
def test_header_fits_every_width(width):
    text = header_text(SNAPS[-1], 1.0, 60.0, False, width)
    assert text.cell_len == width
    assert text.plain.rstrip().endswith("10:00:29")


def plain(line) -> str:
    return "".join(text for text, _ in line)


@pytest.mark.parametrize("width", [60, 80, 120, 200])
def test_compact_line_fits_and_keeps_name_and_util(width):
    snap = SNAPS[-1]
    spark = compact_spark_width(width)
    for gpu in snap.gpus:
        line = plain(compact_pieces(gpu, {"util_gpu": "▁" * spark}, width, spark))
        assert cell_len(line) == width
        assert (gpu.name or "")[:22] in line
    throttled = next(g for g in snap.gpus if g.clock_events)
    assert "⚠" in plain(compact_pieces(throttled, {}, 80, compact_spark_width(80)))


@pytest.mark.parametrize("width", [36, 40, 48, 50, 66, 100])
def test_card_lines_fit_their_card_at_every_width(width):
    """No line is cut by the card's edge: parts that do not fit are left out whole (the
    footer once read `SM act 84%  ten`)."""
    words = re.compile(r"(tensor \d+%|SM act \d+%|tx \S+|P\d|SM \S+/\S+( MHz)?)")
    for gpu in SNAPS[-1].gpus:
        lines = card_lines(gpu, {}, width, 16)
        assert len(lines) == 16
        for line in lines:
            text = plain(line)
            assert cell_len(text) == width, text
            assert text[-1] in "╮│╯┓┃┛", text  # the right border is there
        footer = plain(lines[-2])[2:-1].strip()
        for part in footer.split("  "):
            if part and not part.startswith(("⚠", "LOST")):
                assert words.fullmatch(part), f"cut part {part!r} in {footer!r}"


def test_host_lines_fit_and_fold_many_cores():
    host = SNAPS[-1].host
    for width in (80, 160):
        first, second = host_lines(host, width).plain.split("\n")
        assert len(first) <= width and len(second) <= width
        assert "iowait" in first and "swap" in second
    assert per_core_text(tuple(float(i) for i in range(128)), 16).cell_len == 16


def test_aligned_bins_scroll_whole_bins():
    from gputop.tui.widgets.chart import aligned

    start, end = aligned(0.5, 60.5, 60)  # 1 s bins
    assert (start, end) == (1.0, 61.0)
    assert aligned(1.0, 61.0, 60) == (1.0, 61.0)
    # A new sample inside the same bin changes only the last bin of the chart.
    t = np.arange(0.0, 61.0, 1.0)
    v = np.full(len(t), 50.0, dtype=np.float32)
    a = braille_lines(resample(t, v, *aligned(1.0, 60.2, 120), 120), 100.0, 2)
    v2 = v.copy()
    v2[-1] = 100.0
    b = braille_lines(resample(t, v2, *aligned(1.0, 60.2, 120), 120), 100.0, 2)
    assert [row[:-1] for row in a] == [row[:-1] for row in b] and a != b


def test_panel_repaints_only_the_changed_cells():
    from gputop.tui.widgets.gpu_panel import changed_span

    old = (("│", "border"), ("util 50%       ", None), (" ", None), ("⣀⣀⣀⣀", "util_gpu"))
    chart_only = (("│", "border"), ("util 50%       ", None), (" ", None), ("⣀⣀⣤⣀", "util_gpu"))
    assert changed_span(old, chart_only) == (19, 20)
    gauge_only = (("│", "border"), ("util 51%       ", None), (" ", None), ("⣀⣀⣀⣀", "util_gpu"))
    assert changed_span(old, gauge_only) == (7, 8)
    restyled = (("│", "warning"), *old[1:])
    assert changed_span(old, restyled) is None  # a new style: the whole line


def test_charts_of_one_gpu_binned_together_match_one_by_one():
    from gputop.tui.widgets.chart import chart_rows, chart_rows_many

    rng = np.random.default_rng(7)
    t = np.arange(0.0, 90.0, 1.0) + rng.uniform(0, 0.05, 90)
    values = [rng.uniform(0, 100, 90).astype(np.float32) for _ in range(4)]
    values[2][40:55] = np.nan  # a lost stretch
    values[3][60:] = np.nan  # lost for good
    for width, (start, end) in ((21, (30.0, 90.0)), (40, (0.0, 90.0)), (80, (60.0, 90.0))):
        vmaxes = [100.0, 100.0, 0.0, 100.0]  # one without a range: "n/a"
        heights = [2, 3, 2, 2]
        many = chart_rows_many(t, values, start, end, vmaxes, width=width, heights=heights)
        one = [chart_rows(t, v, start, end, m, width=width, height=h)
               for v, m, h in zip(values, vmaxes, heights)]
        assert many == one


@pytest.mark.parametrize("limit", [0.0, 100.0])
@pytest.mark.parametrize("width, height", [(1, 1), (17, 1), (17, 2), (30, 4)])
def test_rows_without_samples_match_the_chart_drawn_from_no_data(limit, width, height):
    """The first frame draws its charts without numpy: the same rows as chart_rows, and as
    chart_rows_many, draws for empty series."""
    from gputop.tui.widgets.chart import chart_rows, chart_rows_many
    from gputop.tui.widgets.gpu_panel import no_data_rows

    empty = np.zeros(0)
    expected = chart_rows(empty, empty, 0.0, 60.0, limit, width=width, height=height)
    assert no_data_rows(limit, width, height) == expected
    assert chart_rows_many(empty, [empty], 0.0, 60.0, [limit], width=width,
                           heights=[height]) == [expected]


def test_first_frame_needs_no_history():
    from gputop.tui.view.frames import first_frame

    snap = scenario_snapshots("tour", 1)[0]
    frame = first_frame(snap, 60.0, 1)
    assert frame.end == snap.time and frame.start == snap.time - 60.0
    assert not frame.gpu_series and frame.findings == ()


def test_braille_of_several_charts_in_one_pass_matches_each_chart_drawn_alone():
    from gputop.tui.widgets.chart import _braille_many, _median

    rng = np.random.default_rng(7)
    for height in (1, 2, 3):
        binned = rng.uniform(-5.0, 120.0, (4, 42))
        binned[rng.random((4, 42)) < 0.2] = np.nan
        vmaxes = [100.0, 80.0, 0.5, 1e4]
        assert _braille_many(binned, vmaxes, height) == [
            braille_lines(row, vmax, height) for row, vmax in zip(binned, vmaxes)]
    for n in (1, 2, 5, 60):
        values = rng.uniform(0.0, 3.0, n)
        assert _median(values) == float(np.median(values))


def test_row_structure_changes_with_processes_and_workers_not_with_numbers():
    """The process table skips rebuilding its rows while the structure stays the same: new
    numbers keep it, a worker that comes or a rank that joins a job changes it."""
    import dataclasses

    from gputop.tui.widgets.process_table import _structure
    from tests.tui_data import scenario_snapshots

    first, second = scenario_snapshots("input-starved", 3)[1:]
    assert _structure(first) == _structure(second)
    assert first.gpus[0].processes and first.gpus[0].processes[0].workers
    proc = first.gpus[0].processes[0]
    fewer = dataclasses.replace(proc, workers=proc.workers[:-1])
    gpu = dataclasses.replace(first.gpus[0], processes=(fewer, *first.gpus[0].processes[1:]))
    assert _structure(dataclasses.replace(first, gpus=(gpu, *first.gpus[1:]))) != \
        _structure(first)
    ranked = dataclasses.replace(proc, agent=parse_status({"job_id": "j1", "rank": 0}))
    gpu = dataclasses.replace(first.gpus[0], processes=(ranked, *first.gpus[0].processes[1:]))
    assert _structure(dataclasses.replace(first, gpus=(gpu, *first.gpus[1:]))) != \
        _structure(first)


def test_pure_python_charts_draw_what_the_numpy_charts_drew():
    """Issue 40 replaced numpy in the charts: these rows were drawn by the numpy version (git
    main before it), from the same series (a gap in the times, a lost stretch, values outside
    the range, a series that starts late), as lists and as the History's arrays."""
    from array import array

    from gputop.tui.widgets.chart import chart_rows, chart_rows_many, resample, spark_series

    nan = math.nan
    t = [0.0, 1.0, 2.0, 3.0, 4.0, 5.2, 6.0, 7.0, 9.0, 10.0, 11.0, 12.0]
    series = [
        [10.0, 20.0, 35.0, 50.0, 65.0, 80.0, 95.0, 100.0, 90.0, 60.0, 30.0, 5.0],
        [0.0, 0.0, 1.0, 2.0, nan, nan, nan, 50.0, 50.0, 50.0, 120.0, -5.0],
        [nan] * 6 + [40.0] * 6,
    ]
    vmaxes = [100.0, 100.0, 80.0]
    expected = {
        (8, (2, 3, 2)): [["⠀⠀⣀⣼⣿⢰⡀⠀", "⣠⣾⣿⣿⣿⢸⣧⡀"],
                         ["⠀⠀⠀⠀⠀⠀⢸⠀", "⠀⠀⠀⠀⣤⢠⣼⠀", "⣀⣀⡀⠀⣿⢸⣿⡀"],
                         ["⠀⠀⠀⠀⠀⠀⠀⠀", "⠀⠀⠀⢸⣿⢸⣿⡇"]],
        (13, (3, 2, 1)): [["⠀⠀⠀⠀⠀⢠⣴⣿⠀⢰⡆⠀⠀", "⠀⠀⠀⢠⣼⣿⣿⣿⠀⢸⣷⡆⠀", "⢀⣠⣼⣿⣿⣿⣿⣿⠀⢸⣿⣿⣇"],
                          ["⠀⠀⠀⠀⠀⠀⠀⠀⠀⠀⠀⢸⡇", "⢀⣀⣀⣀⡀⠀⠀⣿⠀⢸⣿⣿⣇"],
                          ["      ▄▄ ▄▄▄▄"]],
    }
    for times, values in ((t, series), (array("d", t), [array("f", v) for v in series])):
        for (width, heights), rows in expected.items():
            assert chart_rows_many(times, values, -0.5, 12.5, vmaxes, width=width,
                                   heights=list(heights)) == rows
            assert [chart_rows(times, v, -0.5, 12.5, m, width=width, height=h)
                    for v, m, h in zip(values, vmaxes, heights)] == rows
        assert spark_series(times, values[0], -0.5, 12.5, 100.0, 10) == "▁▃▄▅▇█▇▅▂▁"
        binned = resample(times, values[1], -0.5, 12.5, 26)
        assert [None if math.isnan(x) else x for x in binned] == [
            None, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 2.0, 2.0, None, None, None, None, None, 50.0,
            50.0, None, None, None, 50.0, 50.0, 50.0, 50.0, 120.0, 120.0, -5.0]
