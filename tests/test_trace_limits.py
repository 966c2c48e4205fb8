"""Traces are untrusted input: bounded reads, no blocking on special files, no terminal escapes,
and every failure is the analysis's own one-line error."""

from __future__ import annotations

import gzip
import json
import os
import random
import subprocess
import sys
import threading

import pytest

from gputop.diagnostics.trace.analysis import TraceError, analyze_trace
from tests.conftest import REPO, TRACES, cli_env, run_cli

# Runs `gputop analyze` in this interpreter and prints its peak RSS (KiB) on the last line.
# The peak is VmHWM, the high-water mark of this program's own memory: ru_maxrss would also
# count the pytest process it was forked from (Linux keeps the larger across exec), hundreds of
# MB once earlier tests have imported torch.
PEAK = ("import sys; from gputop.cli import main; code = main(sys.argv[1:]); "
        "print(next(line.split()[1] for line in open('/proc/self/status') "
        "if line.startswith('VmHWM:')), file=sys.stderr); sys.exit(code)")


def analyze_with_peak(*args: str) -> tuple[subprocess.CompletedProcess, int]:
    done = subprocess.run([sys.executable, "-c", PEAK, "analyze", *args], capture_output=True,
                          text=True, env=cli_env(), cwd=REPO, timeout=120)
    *lines, peak = done.stderr.strip().splitlines()
    done.stderr = "\n".join(lines)
    return done, int(peak)


def one_error_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


def test_a_gzip_bomb_is_refused_within_bounded_memory(tmp_path):
    bomb = tmp_path / "bomb.json.gz"
    with gzip.open(bomb, "wb", compresslevel=9) as f:
        f.write(b'{"traceEvents": [')
        for _ in range(1000):  # ~1 GB of JSON in ~1 MB
            f.write(b" " * (1 << 20))
        f.write(b"]}")
    assert bomb.stat().st_size < 2 << 20
    done, peak_kib = analyze_with_peak(str(bomb))
    line = one_error_line(done)  # read through in batches: ~1 GB of nothing, no events
    assert "no profiler events" in line
    assert peak_kib < 300 * 1024
    # With a byte limit set, it is refused as soon as it passes the limit.
    line = one_error_line(analyze_with_peak("--max-trace-mb", "200", str(bomb))[0])
    assert "200 MB" in line and "--max-trace-mb" in line


def test_dev_zero_and_a_fifo_are_refused_without_reading(tmp_path):
    fifo = tmp_path / "trace.fifo"
    os.mkfifo(fifo)
    for path in ("/dev/zero", str(fifo)):  # a FIFO with no writer would block an open()
        done, peak_kib = analyze_with_peak(path)
        assert "not a regular file" in one_error_line(done)
        assert peak_kib < 300 * 1024


def trace_json(name: str = "aten::mm") -> bytes:
    events = [{"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#1", "ts": 0, "dur": 100,
               "pid": 1, "tid": 1},
              {"ph": "X", "cat": "cpu_op", "name": name, "ts": 10, "dur": 50, "pid": 1, "tid": 1}]
    return json.dumps({"traceEvents": events}).encode()


def test_a_fifo_is_read_when_asked(tmp_path):
    fifo = tmp_path / "trace.fifo"
    os.mkfifo(fifo)

    def write() -> None:
        with open(fifo, "wb") as f:
            f.write(trace_json())

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    done = run_cli("analyze", "--allow-special-files", str(fifo))
    writer.join(60)
    assert done.returncode == 0, done.stderr
    assert "aten::mm" in done.stdout


def test_limits_are_settable_and_named_in_the_error(tmp_path):
    path = tmp_path / "t.json"
    path.write_bytes(trace_json())
    # Over --max-events, CPU operators are cut (the step never is) and the report says so.
    cut = run_cli("analyze", "--max-events", "1", "--json", str(path))
    assert cut.returncode == 0, cut.stderr
    report = json.loads(cut.stdout)
    assert report["cut"] and "1 CPU operators cut" in report["cut"][0]
    assert "--max-events 1 held events" in report["cut"][0]
    # Device work is never cut: more of it than the limit refuses the trace, naming the limit.
    doc = json.loads(trace_json())
    doc["traceEvents"] += [{"ph": "X", "cat": "kernel", "name": f"k{i}", "ts": 10 + i, "dur": 1,
                            "pid": 0, "tid": 7} for i in range(3)]
    gpu = tmp_path / "gpu.json"
    gpu.write_text(json.dumps(doc))
    line = one_error_line(run_cli("analyze", "--max-events", "2", str(gpu)))
    assert "--max-events" in line and "never cut" in line and "GB of memory" in line
    assert "--max-trace-mb" in one_error_line(
        run_cli("analyze", "--max-trace-mb", "0.0001", str(path)))
    assert run_cli("analyze", str(path)).returncode == 0


def test_names_from_the_trace_reach_the_terminal_escaped(tmp_path):
    path = tmp_path / "t.json"
    path.write_bytes(trace_json("aten::mm\x1b]0;X\x07\x1b[2J\u202e"))
    done = run_cli("analyze", str(path))
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout and "\x07" not in done.stdout and "\u202e" not in done.stdout
    assert "aten::mm\\x1b]0;X\\x07\\x1b[2J\\u202e" in done.stdout  # shown, not obeyed


def test_negative_durations_are_skipped_and_said(tmp_path):
    path = tmp_path / "t.json"
    doc = json.loads(trace_json())
    doc["traceEvents"].append({"ph": "X", "cat": "cpu_op", "name": "bad", "ts": 5, "dur": -5,
                               "pid": 1, "tid": 1})
    path.write_text(json.dumps(doc))
    a = analyze_trace(path)
    assert any("negative or non-finite" in n for n in a.not_assessed)
    assert "bad" not in json.dumps(a.to_json()["metrics"])


@pytest.mark.parametrize("body", [
    b'{"traceEvents": [{"ph": "X", "args": {"x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}}]}",
    b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "\xff\xfe", "ts": 1, "dur": 1}]}',
    b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1e400, "dur": 1}]}',
    b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1, "dur": 1e308},'
    b' {"ph": "X", "cat": "cpu_op", "name": "b", "ts": 2, "dur": 1e308}]}',
    b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#1", "ts": 0, '
    b'"dur": 0}, {"ph": "X", "cat": "kernel", "name": "k", "ts": 0, "dur": 0}]}',
], ids=["deep-nesting", "not-utf8", "infinite-ts", "huge-durations", "zero-durations"])
def test_odd_traces_fail_as_the_analysis_own_error_or_report(tmp_path, body):
    path = tmp_path / "t.json"
    path.write_bytes(body)
    done = run_cli("analyze", str(path))
    assert "Traceback" not in done.stderr
    if done.returncode:
        one_error_line(done)


def _mutate(rng: random.Random, raw: bytes) -> bytes:
    data = bytearray(raw)
    for _ in range(rng.randint(1, 8)):
        kind = rng.randrange(6)
        at = rng.randrange(len(data) or 1)
        if kind == 0:  # flip a byte
            data[at] = rng.randrange(256)
        elif kind == 1:  # truncate
            del data[at:]
        elif kind == 2:  # duplicate a slice
            data[at:at] = data[at:at + rng.randint(1, 400)]
        elif kind == 3:  # a token a JSON writer could produce
            data[at:at] = rng.choice([b"-1", b"1e999", b"NaN", b"null", b'"x"', b"[]", b"{}",
                                      b"-0.0", b"18446744073709551616", b"\\u0000", b"N/A"])
        elif kind == 4:  # drop a slice
            del data[at:at + rng.randint(1, 200)]
        else:  # a digit changed: timestamps and durations out of order
            digits = [i for i in range(at, min(len(data), at + 200)) if 48 <= data[i] <= 57]
            if digits:
                data[rng.choice(digits)] = rng.randrange(48, 58)
    return bytes(data)


@pytest.mark.timeout(600)
def test_a_thousand_mutated_real_traces_raise_only_trace_errors(tmp_path):
    sources = sorted(TRACES.glob("hta_*.json.gz")) if TRACES.exists() else []
    if not sources:
        pytest.skip("../shared/traces not present")
    rng = random.Random(20261123)
    raws = [gzip.decompress(p.read_bytes()) for p in sources[:6]]
    path = tmp_path / "m.json"
    outcomes = {"ok": 0, "error": 0}
    for i in range(1000):
        path.write_bytes(_mutate(rng, raws[i % len(raws)]))
        try:
            a = analyze_trace(path)
        except TraceError as exc:
            assert "\n" not in str(exc)
            outcomes["error"] += 1
            continue
        from gputop.diagnostics.trace.reporting.report import format_report

        format_report(a)  # the report of whatever loaded must format, too
        outcomes["ok"] += 1
    assert outcomes["ok"] > 0 and outcomes["error"] > 0  # both paths were exercised
