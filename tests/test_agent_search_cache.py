"""The sampler's agent search costs what changed: a GPU process in this pid namespace is read
once while it stays on a GPU, and /tmp's listing is gone through again only when it changes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gputop.client import agents, namespaces
from gputop.core.pidns import in_init_pidns


def test_other_users_dirs_are_found_again_only_for_a_new_listing():
    tmp = ["gputop-0", "gputop-1000", "other", "gputop-x"]
    run = ["0", "1000", "lost+found"]
    found = agents._other_users(tmp, run)
    assert found == [(Path("/tmp/gputop-1000"), 1000), (Path("/run/user/1000/gputop"), 1000)]
    assert agents._other_users(tmp, run) is found  # the same listings: not gone through again
    newer = [*tmp, "gputop-4242"]  # /tmp changed: _listing hands a new list
    assert (Path("/tmp/gputop-4242"), 4242) in agents._other_users(newer, run)


@pytest.fixture
def counted_nspids(monkeypatch):
    reads: list[int] = []
    real = namespaces.nspids

    def nspids(pid):
        reads.append(pid)
        return real(pid)

    monkeypatch.setattr(namespaces, "nspids", nspids)  # counted, still read from /proc
    return reads


def test_a_gpu_process_of_this_namespace_is_read_once_while_it_stays(counted_nspids):
    if not in_init_pidns():
        pytest.skip("runs in the host's pid namespace")
    proc = subprocess.Popen(["sleep", "60"])
    try:
        pid = proc.pid
        for _ in range(3):
            assert namespaces.probe({pid}, {}) == {}
        assert counted_nspids == [pid]
        namespaces.probe(set(), {})  # it left the GPUs: forgotten
        namespaces.probe({pid}, {})
        assert counted_nspids == [pid, pid]
    finally:
        proc.kill()
        proc.wait()
