"""Shared by the stacks tests: may a process read the stacks of another one here at all?

py-spy needs the kernel's ptrace permission. Where the machine refuses it to a process that
is not the target's parent (Yama's ptrace_scope=1, the default on Ubuntu, for a non-root
user; 2 or 3; a container without SYS_PTRACE), the sampling tests cannot run: they are
skipped with the one line gputop itself gives, which says what would allow it.
"""

from __future__ import annotations

import functools
import subprocess
import sys

import pytest

from tests.conftest import REPO, SLOW, cli_env

PROBE = "import sys; from gputop.stacks.pyspy import unusable_reason; " \
        "print(unusable_reason(int(sys.argv[1])) or '')"


@functools.lru_cache(maxsize=1)
def why_stacks_cannot_be_read() -> str:
    """'' when a process (like `gputop stacks`) may read a sibling's stacks, else why not."""
    sibling = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        done = subprocess.run([sys.executable, "-c", PROBE, str(sibling.pid)],
                              capture_output=True, text=True, env=cli_env(), cwd=REPO,
                              timeout=SLOW)
        return done.stdout.strip() or (done.stderr.strip()[-300:] if done.returncode else "")
    finally:
        sibling.kill()
        sibling.wait()


@pytest.fixture
def stacks_readable() -> None:
    why = why_stacks_cannot_be_read()
    if why:
        pytest.skip(f"stacks cannot be read on this machine: {why}")


# A process whose CPU goes to one named function (<string>:5), for the stacks tests.
BURNER = ("import time\n"
          "def parse_records(n):\n"
          "    x = 0\n"
          "    for i in range(n):\n"
          "        x = (x * 1103515245 + i) & 0xFFFFFFFF\n"
          "    return x\n"
          "print('ready', flush=True)\n"
          "while True:\n"
          "    parse_records(200000)\n")
