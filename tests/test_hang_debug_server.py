"""`gputop analyze DIR` on a PyTorch Debug Server dump_dir: a real 4-rank torchrun gloo job
(tests/scripts/debug_server_job.py) runs ``torch.distributed.debug.start_debug_server`` with
periodic dumps, and its rank 2 sleeps before an all_reduce; the newest stacks_*.txt must name
rank 2 and its line. Then the stacks file as untrusted input."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from gputop.diagnostics.hang.debug_server import (
    MAX_RANKS,
    newest_stacks,
    parse_stacks,
    read_stacks,
)
from tests.conftest import REPO, SLOW, cli_env, end_popen, run_cli

JOB = REPO / "tests" / "scripts" / "debug_server_job.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _hung(folder) -> bool:
    path = newest_stacks(str(folder))
    if path is None:
        return False
    ranks = {r.rank: r for r in read_stacks(path)}
    in_c10d = {r for r, t in ranks.items()
               if any(f.file.endswith("distributed_c10d.py") for f in t.main())}
    return len(ranks) == 4 and in_c10d == {0, 1, 3}


@pytest.fixture(scope="module")
def dump_dir(tmp_path_factory, share_process):
    pytest.importorskip("aiohttp")
    pytest.importorskip("jinja2")
    pytest.importorskip("tabulate")
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    if torchrun is None:
        pytest.skip("torchrun is not installed")
    out = tmp_path_factory.mktemp("debug-server")
    log = (out.parent / "debug-server.log").open("w")
    proc = share_process(subprocess.Popen(
        [torchrun, "--standalone", "--nproc-per-node", "4", str(JOB), str(out),
         str(_free_port())], stdout=log, stderr=subprocess.STDOUT,
        env=cli_env(TORCH_FR_BUFFER_SIZE="2000", OMP_NUM_THREADS="1"), cwd=out.parent))
    try:
        deadline = time.monotonic() + SLOW * 2
        while time.monotonic() < deadline and not _hung(out) and proc.poll() is None:
            time.sleep(0.5)
        assert _hung(out), (out.parent / "debug-server.log").read_text()[-3000:]
    finally:
        end_popen(proc)
    return out


def test_the_newest_stacks_name_the_sleeping_rank_and_its_line(dump_dir):
    out = run_cli("analyze", "--json", str(dump_dir))
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["kind"] == "debug-server-stacks" and data["verdict"] == "hang"
    hang = data["findings"][0]
    assert hang["ranks"] == [2] and hang["waiting_ranks"] == [0, 1, 3]
    assert hang["collective"] == "all_reduce"
    assert hang["where_by_rank"]["2"].startswith("debug_server_job.py:")
    text = " ".join(run_cli("analyze", str(dump_dir)).stdout.split())
    assert "rank 2 is at debug_server_job.py:" in text
    assert "ranks 0, 1, 3 wait in all_reduce (debug_server_job.py:" in text


def test_a_stacks_file_is_untrusted_input(tmp_path):
    evil = ("=== Rank 0: http://x ===\nThread 0x1 (most recent call first):\n"
            '  File "/a/job\x1b[31m.py", line 3 in main\n  File "/a/job.py", line 9 in <module>\n'
            "=== Rank 1: http://y ===\nThread 0x2 (most recent call first):\n"
            '  File "/t/torch/distributed/distributed_c10d.py", line 1 in all_reduce\n'
            '  File "/a/job.py", line 10 in <module>\n')
    (tmp_path / "stacks_20260101_000000.txt").write_text(evil)
    out = run_cli("analyze", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "\x1b" not in out.stdout and "rank 0 is at job" in out.stdout
    # Rank sections are bounded, and a rank named twice is read once.
    many = "".join(f"=== Rank {i % (MAX_RANKS + 10)}: a ===\n" for i in range(MAX_RANKS + 20))
    assert len(parse_stacks(many)) == MAX_RANKS
    (tmp_path / "stacks_20260101_000001.txt").write_text("no ranks here\n")
    out = run_cli("analyze", str(tmp_path))
    assert out.returncode != 0 and len(out.stderr.strip().splitlines()) == 1
