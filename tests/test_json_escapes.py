"""JSON that gputop prints carries no raw bidi or C1 character: JSON itself escapes only the C0
controls, so a trace's kernel name or a process's command line could otherwise reorder or
restyle the terminal that shows the output. The JSON value is the same."""

from __future__ import annotations

import json

import msgspec

from gputop.core.format import json_safe
from gputop.core.model import DriverInfo, GpuSample, HostSample, ProcSample, Snapshot
from gputop.fleet.wire import decode_line, sample_line
from tests.conftest import run_cli

NAME = "aten::mm\u202e\u2066\u200f\x85\x9b31m\x7fé"
RAW = ("\u202e", "\u2066", "\u200f", "\x85", "\x9b", "\x7f")


def test_json_safe_escapes_and_keeps_the_value():
    value = {"name": NAME, "list": [NAME, 1.5, None], NAME: True}
    data = json_safe(msgspec.json.encode(value))
    assert json.loads(data) == value
    text = data.decode()
    assert not any(ch in text for ch in RAW) and "é" in text
    assert "\\u202e\\u2066\\u200f\\u0085\\u009b31m\\u007f" in text


def test_analyze_json_escapes_bidi_from_trace_names(tmp_path):
    events = [{"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#1", "ts": 0, "dur": 100,
               "pid": 1, "tid": 1},
              {"ph": "X", "cat": "cpu_op", "name": NAME, "ts": 10, "dur": 50, "pid": 1, "tid": 1}]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    done = run_cli("analyze", "--json", str(path))
    assert done.returncode == 0, done.stderr
    assert not any(ch in done.stdout for ch in RAW), done.stdout
    assert NAME in json.dumps(json.loads(done.stdout), ensure_ascii=False)


def test_stream_lines_escape_a_processes_command_line():
    proc = ProcSample(pid=7, name="python", cmdline="python " + NAME, user=NAME)
    snap = Snapshot(time=1.0, host=HostSample("h"), driver=DriverInfo(True),
                    gpus=(GpuSample(index=0, name=NAME, processes=(proc,)),))
    line = sample_line(snap, [])
    assert not any(ch.encode() in line for ch in RAW)
    assert json.loads(line)["snapshot"]["gpus"][0]["name"] == NAME
    assert decode_line(line.rstrip(b"\n")).snapshot.gpus[0].processes[0].user.isprintable()
