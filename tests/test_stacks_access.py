"""Where the kernel refuses ptrace, `gputop stacks` says so in one line, with the rule that
refused it and what would allow it: another user's process read by a non-root user, and a
process that is not dumpable read without CAP_SYS_PTRACE (what Yama's ptrace_scope=2/3 or a
container without SYS_PTRACE look like). py-spy itself is refused the same way, so the line
is about a real refusal."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys

import pytest

from gputop.stacks.access import yama_scope
from gputop.stacks.pyspy import find_py_spy
from tests.conftest import REPO, SLOW, cli_env
from tests.scripts.stacks_testkit import stacks_readable  # noqa: F401 (the fixture)

pytestmark = pytest.mark.timeout(3 * SLOW)

OTHER_USER = "gputop-other"  # a throwaway system user, created when missing (as root)
HOLD = "import time\nprint('ready', flush=True)\ntime.sleep(600)\n"
NOT_DUMPABLE = ("import ctypes, time\n"
                "assert ctypes.CDLL(None).prctl(4, 0, 0, 0, 0) == 0  # PR_SET_DUMPABLE 0\n"
                "print('ready', flush=True)\ntime.sleep(600)\n")


def gputop_stacks(pid: int, wrap: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([*wrap, sys.executable, "-m", "gputop", "stacks", str(pid),
                           "--seconds", "1"], capture_output=True, text=True, timeout=SLOW,
                          env=cli_env(), cwd=REPO)


def py_spy_dump(pid: int, wrap: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([*wrap, find_py_spy(), "dump", "--pid", str(pid), "--nonblocking"],
                          capture_output=True, text=True, timeout=SLOW, env=cli_env())


def the_one_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("gputop: error: cannot read the Python stacks of pid")
    return lines[0]


def started(spawn, code: str) -> subprocess.Popen:
    proc = spawn([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def as_other_user() -> tuple[list[str], pwd.struct_passwd]:
    """A command prefix that runs as a user other than root, who can still run this Python;
    the test is skipped (with the reason) only where that cannot be arranged."""
    if shutil.which("setpriv") is None:
        pytest.skip("needs setpriv (util-linux) to run gputop as another user")
    try:
        user = pwd.getpwnam(OTHER_USER)
    except KeyError:
        if shutil.which("useradd") is None:
            pytest.skip(f"needs useradd to create the throwaway user {OTHER_USER}")
        made = subprocess.run(["useradd", "--system", "--no-create-home", "--shell",
                               "/usr/sbin/nologin", OTHER_USER], capture_output=True, text=True)
        if made.returncode not in (0, 9):  # 9: made meanwhile by a parallel run
            pytest.skip(f"cannot create the user {OTHER_USER}: {made.stderr.strip()}")
        user = pwd.getpwnam(OTHER_USER)
    base = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups"]
    # This Python may live under a directory only root may enter (/root/.pyenv): then the
    # user keeps CAP_DAC_READ_SEARCH, to read files, never CAP_SYS_PTRACE.
    for extra in ([], ["--inh-caps=-all,+dac_read_search", "--ambient-caps=+dac_read_search"]):
        probe = subprocess.run([*base, *extra, sys.executable, "-m", "gputop", "--version"],
                               capture_output=True, text=True, env=cli_env(), cwd=REPO,
                               timeout=SLOW)
        if probe.returncode == 0:
            return [*base, *extra, "--"], user
    pytest.skip(f"the user {OTHER_USER} cannot run {sys.executable}: {probe.stderr.strip()}")


def test_another_users_process_as_non_root(spawn):
    if os.geteuid() != 0:
        # Already not root: any process of root is another user's (pid 1, the init).
        line = the_one_line(gputop_stacks(1, []))
        assert "belongs to root (uid 0)" in line and "sudo gputop stacks 1" in line
        return
    wrap, user = as_other_user()
    target = started(spawn, HOLD)  # root's
    line = the_one_line(gputop_stacks(target.pid, wrap))
    assert f"it belongs to root (uid 0) and you are {user.pw_name}" in line
    assert f"sudo gputop stacks {target.pid}" in line and "run gputop as root" in line
    refused = py_spy_dump(target.pid, wrap)
    assert refused.returncode != 0 and "permission denied" in refused.stderr.lower()


def test_a_process_that_is_not_dumpable_without_cap_sys_ptrace(spawn):
    """What ptrace_scope=2/3 or a container without SYS_PTRACE do to py-spy: the target is
    the same user's, but the kernel wants CAP_SYS_PTRACE, which gputop does not have."""
    target = started(spawn, NOT_DUMPABLE)
    wrap = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("needs setpriv (util-linux) to drop CAP_SYS_PTRACE")
        # Root without CAP_SYS_PTRACE, and unable to get it back: a container's root.
        wrap = ["setpriv", "--inh-caps=-sys_ptrace", "--bounding-set=-sys_ptrace", "--"]
    line = the_one_line(gputop_stacks(target.pid, wrap))
    if yama_scope() in (None, 0):
        assert "the process is not dumpable" in line and "CAP_SYS_PTRACE" in line
        if os.geteuid() == 0:
            assert "--cap-add SYS_PTRACE" in line
    refused = py_spy_dump(target.pid, wrap)
    assert refused.returncode != 0 and "permission denied" in refused.stderr.lower()


@pytest.mark.usefixtures("stacks_readable")
def test_the_same_process_is_readable_with_the_capability(spawn):
    """The refusal above is the capability's doing, not the target's: with CAP_SYS_PTRACE
    (root) the same non-dumpable process is sampled."""
    if os.geteuid() != 0:
        pytest.skip("only root holds CAP_SYS_PTRACE here")
    target = started(spawn, NOT_DUMPABLE)
    done = gputop_stacks(target.pid, [])
    assert done.returncode == 0, done.stderr
    assert f"main process {target.pid}" in done.stdout
