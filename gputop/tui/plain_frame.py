"""The first sample drawn as plain text, before the interface has loaded.

Importing Textual and building the app costs a few tenths of a second of CPU before it can draw
anything (a minimal Textual app's first frame is ~2x nvitop's: measured in
benchmarks/bench_tui.py). The driver opens and the first sample is taken on the early sampler's
thread meanwhile (early_start.py), so the GPUs and their processes are known first: this module
writes them to the terminal's alternate screen at once, as a plain table, and the interface
paints over it when it is ready (it enters the same alternate screen). Nothing here imports
Textual; what comes from outside (process names, command lines) is escaped.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from gputop.format import bytes_h, pct, safe_text
from gputop.model import GpuSample, Snapshot

ENTER = "\x1b[?1049h\x1b[?25l\x1b[H\x1b[2J"  # alternate screen, cursor hidden, cleared
LEAVE = "\x1b[?25h\x1b[?1049l"
# First on the frame's first line (it fits 80 columns): what tells this frame from the interface.
MARK = "gputop: loading the interface..."


def _gpu_line(gpu: GpuSample) -> str:
    if gpu.lost:
        return f"{gpu.index:>3}  {safe_text(gpu.name or 'GPU'):<24.24}  lost"
    mem = f"{bytes_h(gpu.mem_used)} / {bytes_h(gpu.mem_total)}"
    temp = "n/a" if gpu.temperature_c is None else f"{gpu.temperature_c:.0f}C"
    power = "n/a" if gpu.power_w is None else f"{gpu.power_w:.0f} W"
    return (f"{gpu.index:>3}  {safe_text(gpu.name or 'GPU'):<24.24}  {pct(gpu.util_gpu):>5}  "
            f"{mem:>15}  {temp:>5}  {power:>7}")


def lines(snap: Snapshot, width: int, height: int) -> list[str]:
    """The screen's lines (at most ``height``, each at most ``width`` cells): the host, every
    GPU, then the GPUs' processes."""
    host = snap.host
    head = [f"{MARK}  {safe_text(host.hostname)}  CPU {pct(host.cpu_percent)}  "
            f"MEM {bytes_h(host.memory_used)} / {bytes_h(host.memory_total)}"]
    if not snap.driver.available:
        head.append(f"no NVIDIA driver: {safe_text(snap.driver.error or 'n/a')}")
    head.append("GPU  NAME                       UTIL         MEMORY   TEMP    POWER")
    head += [_gpu_line(gpu) for gpu in snap.gpus]
    head += ["", "    PID  USER        GPU   GPU MEM   CPU  COMMAND"]
    for gpu in snap.gpus:
        for proc in gpu.processes:
            command = safe_text(proc.cmdline or proc.name)
            head.append(f"{proc.pid:>7}  {safe_text(proc.user or '?'):<10.10}  {gpu.index:>3}  "
                        f"{bytes_h(proc.gpu_mem):>8}  {pct(proc.cpu_percent):>4}  {command}")
    return [line[:width] for line in head[:height]]


class PlainFirstFrame:
    """Paints the first sample once, unless the interface has taken the terminal already."""

    def __init__(self, fd: int, size: Callable[[], os.terminal_size] | None = None) -> None:
        self.fd = fd
        self._size = size or (lambda: os.get_terminal_size(fd))
        self._lock = threading.Lock()
        self._open = True
        self.painted = False

    def paint(self, snap: Snapshot) -> None:
        """From the sampler's thread, with the first sample."""
        with self._lock:
            if not self._open or self.painted:
                return
            try:
                size = self._size()
                text = "\r\n".join(lines(snap, size.columns, size.lines))
                data = (ENTER + text).encode("utf-8", "replace")
                while data:  # a terminal may take it in parts
                    data = data[os.write(self.fd, data):]
                self.painted = True
            except OSError:  # no terminal size, a closed terminal: the interface draws anyway
                self._open = False

    def close(self) -> None:
        """Before the interface starts writing: no paint after this returns."""
        with self._lock:
            self._open = False

    def leave(self) -> None:
        """The interface never started: give the shell its screen back."""
        with self._lock:
            self._open = False
            if self.painted:
                self.painted = False
                try:
                    os.write(self.fd, LEAVE.encode())
                except OSError:
                    pass
