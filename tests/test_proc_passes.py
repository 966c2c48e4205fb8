"""A sampling tick lists /proc once (issue 40): the host's process count (every SLOW_TICKS)
reuses the workers' last scan of /proc when it is fresh, instead of a listing of its own.
(The very first tick has no scan to reuse: the count is read before the processes are.) Counted on a real HostCollector over real processes by wrapping
os.listdir (the collector itself runs unchanged)."""

from __future__ import annotations

import os
import sys

import psutil

from gputop.collect.host import HostCollector

# A parent with two sleeping children: a DataLoader-shaped tree whose workers are looked up.
TREE = ("import os, time\n"
        "for _ in range(2):\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(120); os._exit(0)\n"
        "print('ready', flush=True)\n"
        "time.sleep(120)\n")


def test_a_tick_lists_proc_at_most_once_and_the_count_is_shared(spawn, monkeypatch):
    import subprocess

    proc = spawn([sys.executable, "-c", TREE], stdout=subprocess.PIPE)
    assert proc.stdout.readline().strip() == b"ready"
    listings: list[str] = []
    original = os.listdir

    def listdir(path="."):
        if os.fsdecode(path).rstrip("/") == "/proc":
            listings.append("/proc")
        return original(path)

    monkeypatch.setattr(os, "listdir", listdir)
    host = HostCollector()
    host.CHILDREN_REFRESH_S = host.CHILDREN_SCAN_ONLY_S = 0.0  # a workers' scan every tick
    per_tick = []
    counts = []
    for _ in range(2 * HostCollector.SLOW_TICKS + 1):  # slow ticks (the count) included
        listings.clear()
        sample = host.sample_host()
        row = host.sample_process(proc.pid)
        host.end_tick()
        per_tick.append(len(listings))
        counts.append(sample.process_count)
        assert len(row.workers) == 2  # the scan found the workers
    assert per_tick[0] <= 2 and max(per_tick[1:]) == 1, per_tick
    real = len(psutil.pids())
    assert all(c is not None and abs(c - real) < max(50, real // 2) for c in counts), (counts,
                                                                                      real)
