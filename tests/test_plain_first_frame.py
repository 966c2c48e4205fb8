"""The plain first frame (gputop/tui/monitor/plain_frame.py): the first sample of the simulated driver,
with a real process on a GPU, written to a real pseudo-terminal before the interface loads."""

from __future__ import annotations

import os
import select
import subprocess
import sys

import pytest

from gputop.client.session import open_sampler
from gputop.tui.monitor.early_start import first_sample
from gputop.tui.monitor.plain_frame import ENTER, LEAVE, MARK, PlainFirstFrame


def _read(fd: int) -> bytes:
    out = b""
    while select.select([fd], [], [], 0.5)[0]:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        out += chunk
    return out


@pytest.fixture
def pty():
    """(master, slave) of a real pseudo-terminal: the frame writes to the slave."""
    master, slave = os.openpty()
    yield master, slave
    os.close(master)
    os.close(slave)


@pytest.fixture
def job_with_escape():
    """A real process whose command line tries to clear the screen and set the title."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                             "\x1b[2J\x1b]0;owned\x07"])
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture
def tour_sample(simulated, job_with_escape):
    """The first sample of the tour's simulated GPUs, the hostile-named job on GPU 0."""
    sim = simulated("tour")
    sim.set_processes(0, [job_with_escape.pid])
    with open_sampler(None, None, 0, wait_for_workers=0) as sampler:
        return first_sample(sampler)


def test_the_first_sample_is_painted_once_and_escaped(tour_sample, job_with_escape, pty):
    master, slave = pty
    size = os.terminal_size((160, 50))
    frame = PlainFirstFrame(slave, size=lambda: size)
    frame.paint(tour_sample)
    frame.paint(tour_sample)  # once only
    text = _read(master).decode()
    assert text.startswith(ENTER + MARK) and text.count(ENTER) == 1
    for gpu in tour_sample.gpus:
        assert gpu.name in text
    row = next(line for line in text.splitlines() if f" {job_with_escape.pid} " in line)
    assert "\\x1b[2J" in row and "\\x07" in row  # shown, not acted on
    assert "\x1b[2J" not in text.replace(ENTER, "") and "\x07" not in text
    assert all(len(line.rstrip("\r")) <= 160 for line in text[len(ENTER):].split("\n"))
    frame.leave()
    assert _read(master).decode() == LEAVE


def test_nothing_is_painted_once_the_interface_has_the_terminal(tour_sample, pty):
    master, slave = pty
    frame = PlainFirstFrame(slave, size=lambda: os.terminal_size((80, 24)))
    frame.close()
    frame.paint(tour_sample)
    frame.leave()  # nothing was painted: nothing to leave
    assert _read(master) == b""


def test_a_small_terminal_gets_as_many_lines_as_it_has(tour_sample, pty):
    master, slave = pty
    PlainFirstFrame(slave, size=lambda: os.terminal_size((40, 6))).paint(tour_sample)
    # (the terminal turns each \n into \r\n: lines end in \r)
    lines = [line.rstrip("\r") for line in _read(master).decode()[len(ENTER):].split("\n")]
    assert len(lines) == 6 and all(len(line) <= 40 for line in lines)


def test_the_first_sample_waits_for_no_pcie_read_and_the_next_one_has_them(simulated):
    """The driver samples PCIe throughput for 20 ms a read (the simulator too, on the tour's
    GPUs without GPM): the first frame's sample leaves it out; the next tick reads it."""
    simulated("tour")
    with open_sampler(None, None, 0, wait_for_workers=0) as sampler:
        first = first_sample(sampler)
        assert sampler.nvml.read_pcie  # back on for the ticks after
        second = sampler.sample()
    a100 = [i for i, g in enumerate(first.gpus) if "A100" in g.name]
    assert a100, [g.name for g in first.gpus]
    assert all(first.gpus[i].pcie_rx_mbs is None for i in a100)
    assert all(second.gpus[i].pcie_rx_mbs is not None for i in a100)
