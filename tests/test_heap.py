"""The C heap's free pages go back to the system (gputop.tui.textual_fixes.heap), also those below live
chunks, which glibc's free() keeps resident."""

from __future__ import annotations

import platform

import psutil
import pytest

from gputop.tui.textual_fixes.heap import release_free_memory


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_free_pages_between_live_chunks_are_released():
    chunks = [bytearray(8192) for _ in range(8192)]  # 64 MiB of C-heap chunks, touched
    del chunks[:-1:2]  # free every other one: each hole is below a live chunk
    rss = psutil.Process().memory_info().rss
    assert release_free_memory()
    released = rss - psutil.Process().memory_info().rss
    assert released > 8 * 2**20, released / 2**20  # of the 32 MiB freed: whole pages only
    assert len(chunks) == 4096  # the live ones, kept to the end
