"""`gputop analyze` on torch.compile's structured logs (TORCH_TRACE).

Real logs: written by the real torch 2.13 CPU build running tests/scripts/compile_log_job.py
(recorded in tests/data/compile_logs/, gzipped, and one job run here): a graph break at
`.item()` and recompiles on a changing batch size, a recompile limit of 1 (fallback to eager),
4 gloo ranks of which ranks 1 and 3 see other batch sizes, 4 ranks of which rank 3's compiled
step calls one collective more. Hostile logs: an overlong line, many lines, broken JSON,
control characters.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO, SLOW, cli_env, run_cli

LOGS = REPO / "tests" / "data" / "compile_logs"
JOB = REPO / "tests" / "scripts" / "compile_log_job.py"
ITEM_LINE = next(i for i, line in enumerate(JOB.read_text().splitlines(), 1)
                 if ".item()  #" in line)


def analyze_json(*paths) -> dict:
    proc = run_cli("analyze", "--json", *map(str, paths))
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout
    return json.loads(lines[0])


def by_id(report: dict) -> dict[str, dict]:
    return {f["id"]: f for f in report["findings"]}


def test_graph_break_and_recompiles_of_a_changing_batch():
    report = analyze_json(LOGS / "break")
    assert report["kind"] == "torch-compile-log"
    found = by_id(report)
    brk = found["graph-breaks"]["breaks"][0]
    assert brk["line"] == ITEM_LINE and brk["file"].endswith("compile_log_job.py")
    assert ".item()" in brk["code"] and brk["function"] == "forward"
    assert "Tensor.item()" in found["graph-breaks"]["evidence"]
    assert "capture_scalar_outputs" in found["graph-breaks"]["fix"]
    rec = found["recompiles"]
    assert rec["function"] == "forward" and rec["count"] >= 2
    first = rec["guards"][0]
    assert (first["tensor"], first["dim"], first["old"], first["new"]) == ("x", 0, 4, 5)
    assert "size of `x` dim 0 changed 4 -> 5" in rec["evidence"]
    assert "drop_last" in rec["fix"] or "mark_dynamic" in rec["fix"]
    m = report["metrics"]
    # Compile time is read from the log's own records (whatever the machine took): present.
    assert m["compile_s"] is not None and m["compile_s"] >= 0
    assert m["frames"][0]["function"] == "forward"
    assert m["ranks"][0]["recompiles"] >= 2 and m["ranks"][0]["graph_breaks"] == 1


def test_recompile_limit_falls_back_to_eager():
    found = by_id(analyze_json(LOGS / "limit"))
    fallback = found["compile-fallback"]
    assert fallback["severity"] == "critical" and fallback["function"] == "forward"
    assert "recompile_limit (1)" in fallback["evidence"]
    assert "size of `x` dim 0 changed 4 -> 5" in fallback["evidence"]
    assert "recompiles" not in found  # the limit, not a recompile, is what happened


def test_ranks_that_recompiled_are_named_and_only_them():
    report = analyze_json(LOGS / "shapes")
    found = by_id(report)
    rec = found["recompiles"]
    assert rec["ranks"] == [1, 3] and rec["ranks_without"] == [0, 2]
    assert "rank 1 (2), rank 3 (2)" in rec["evidence"] and "rank 0, rank 2 did not" in rec["evidence"]
    assert {g["rank"] for g in rec["guards"]} == {1, 3}
    assert "desync" not in found  # the all_reduce is of one size on every rank
    assert [r["rank"] for r in report["metrics"]["ranks"]] == [0, 1, 2, 3]
    # The logs named one by one are one job too.
    files = sorted((LOGS / "shapes").iterdir())
    assert by_id(analyze_json(*files))["recompiles"]["ranks"] == [1, 3]


def test_a_rank_whose_graph_calls_another_collective_is_a_desync():
    report = analyze_json(LOGS / "desync")
    assert report["verdict"] == "desync"
    d = by_id(report)["desync"]
    # One all_reduce more than the others: its second has no counterpart.
    assert d["ranks"] == [3] and d["index"] == 1 and d["expected"] == "nothing"
    assert d["collective"].startswith("all_reduce f32[4]") and d["severity"] == "critical"
    assert "rank 3" in d["title"] and "collective #2" in d["evidence"]
    assert "rank 0, rank 1, rank 2 have none" in d["evidence"]


def test_text_report_names_the_findings():
    proc = run_cli("analyze", str(LOGS / "shapes"))
    assert proc.returncode == 0, proc.stderr
    assert "verdict: recompiles" in proc.stdout
    assert "recompiled 2 time(s)" in proc.stdout and "rank 1, rank 3" in proc.stdout
    assert "compile time per function" in proc.stdout


# -- the real job, run here once --------------------------------------------------------------

@pytest.fixture(scope="module")
def live_log(tmp_path_factory):
    out = tmp_path_factory.mktemp("torch_trace")
    env = {**cli_env(), "TORCH_TRACE": str(out)}
    done = subprocess.run([sys.executable, str(JOB), "break"], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=5 * SLOW)
    assert done.returncode == 0, done.stderr[-2000:]
    return out


def test_a_log_written_now_by_torch(live_log):
    found = by_id(analyze_json(live_log))
    assert found["graph-breaks"]["breaks"][0]["line"] == ITEM_LINE
    assert found["recompiles"]["guards"][0]["tensor"] == "x"


# -- hostile logs -----------------------------------------------------------------------------

PREFIX = "V1201 20:34:48.676000 12832 torch/_dynamo/utils.py:2009] "


def _real_lines() -> list[str]:
    path = next((LOGS / "break").iterdir())
    return gzip.decompress(path.read_bytes()).decode().splitlines(keepends=True)


def test_an_overlong_line_is_skipped_and_the_rest_read(tmp_path):
    from gputop.diagnostics.compile_log.read import MAX_LINE

    lines = _real_lines()
    log = tmp_path / "huge.log"
    with open(log, "w") as f:
        f.writelines(lines[:3])
        f.write(PREFIX + '{"str": ["' + "x" * (2 * MAX_LINE + 17) + '", 9]}\n')
        f.writelines(lines[3:])
    report = analyze_json(log)
    assert any("longer than" in n for n in report["notes"])
    assert by_id(report)["graph-breaks"]["breaks"][0]["line"] == ITEM_LINE


def test_broken_json_and_control_characters(tmp_path):
    lines = _real_lines()
    evil = {"compilation_metrics": {
        "compile_id": "7/1", "co_name": "bad\x1b[31m\u202ename\x07", "co_filename": "/x/e\x00vil.py",
        "co_firstlineno": 3, "entire_frame_compile_time_s": 0.5,
        "recompile_reason": "7/0: tensor 'q\x1b]0;t\x07' size mismatch at index 1. expected 2, actual 3"},
        "frame_id": 7, "frame_compile_id": 1}
    log = tmp_path / "broken.log"
    with open(log, "w") as f:
        f.writelines(lines)
        f.write(PREFIX + '{"compilation_metrics": {"compile_id": "0/9", \n')
        f.write(PREFIX + "[1, 2]\n")
        f.write("plain text, not a record\n")
        f.write(PREFIX + json.dumps(evil) + "\n")
    proc = run_cli("analyze", str(log))
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout and "\x07" not in proc.stdout and "\u202e" not in proc.stdout
    assert "record(s) with broken JSON skipped" in proc.stdout
    report = analyze_json(log)
    assert any("broken JSON" in n for n in report["notes"])
    rec = [f for f in report["findings"] if f["id"] == "recompiles"]
    assert any("changed 2 -> 3" in f["evidence"] for f in rec)


def test_many_lines_stream_in_bounded_memory(tmp_path):
    from gputop.diagnostics.compile_log.parse import MAX_FILES, parse_log

    log = tmp_path / "many.log"
    head = _real_lines()
    n = 300_000
    with open(log, "w") as f:
        f.writelines(head)
        row = PREFIX + '{"str": ["/f%d.py", %d]}\n'
        for start in range(0, n, 10_000):
            f.write("".join(row % (i, i) for i in range(start, start + 10_000)))
        f.write("\t" + "p" * 100 + "\n")  # a payload line of no record that wants one
    parsed = parse_log(str(log))
    assert parsed.stats.lines == len(head) + n + 1
    assert len(parsed.compiles) == 5 and len(parsed.breaks) == 1
    assert MAX_FILES >= 0  # the file table is capped (what a log of 10^7 names would fill)


def test_not_a_log_is_left_to_the_trace_reader(tmp_path):
    other = tmp_path / "notes.log"
    other.write_text("hello\nworld\n")
    proc = run_cli("analyze", str(other))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith("gputop: error: ")


def test_detection_reads_only_the_head(tmp_path):
    from gputop.diagnostics.compile_log.read import is_compile_log

    log = tmp_path / "x.log"
    log.write_bytes(PREFIX.encode() + b'{"str": ["a", 0]}\n' + b"\0" * 1000)
    assert is_compile_log(str(log))
    assert not is_compile_log(str(tmp_path))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert not is_compile_log(str(fifo))
