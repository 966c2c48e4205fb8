"""Traces read in batches (any size at bounded memory) give what a whole read gives; the agent's
cut keeps a trace within its budget and says what it cut; py-spy's chrometrace becomes timed
samples of the right process."""

from __future__ import annotations

import gzip
import io
import json
import random

import msgspec
import pytest

from gputop.agent.trace_budget import cut_to_budget
from gputop.core.trace_stream import EventSplitter, GzipReader, StreamError
from gputop.diagnostics.trace.analysis import analyze_trace
from gputop.diagnostics.trace.loading import load as trace_load
from gputop.diagnostics.trace.loading.load import TraceError, load_trace
from gputop.stacks.timeline import parse_chrometrace
from tests.conftest import TRACES

ROWS = msgspec.json.Decoder(list[msgspec.Raw])


def split(text: bytes, window: int) -> tuple[list[bytes], bytes | None]:
    splitter = EventSplitter(io.BytesIO(text).read, ROWS.decode, window=window,
                             max_window=1 << 20)
    events = [bytes(raw) for batch in splitter for raw in batch]
    return events, splitter.header


TRICKY = [
    {"ph": "X", "name": "a},{b", "cat": "cpu_op", "ts": 1, "dur": 2},  # a cut in a string
    {"ph": "X", "name": 'q"},{"', "args": {"list": [{"x": 1}, {"y": [2, {"z": "}, {"}]}]}},
    {"ph": "i", "name": "[memory]", "args": {"Bytes": -5}},
    {"ph": "X", "name": "\u00e9\u202e\\}", "args": {}},
]


@pytest.mark.parametrize("window", [1, 7, 64, 1 << 16])
def test_events_split_in_any_window_are_the_document_s(window):
    doc = {"schemaVersion": 1, "traceEvents": TRICKY * 50, "deviceProperties": [{"id": 0}],
           "traceName": "x]}"}
    for text in (json.dumps(doc).encode(), json.dumps(doc, indent=2).encode()):
        events, header = split(text, window)
        assert [json.loads(e) for e in events] == doc["traceEvents"]
        assert json.loads(header) == {**doc, "traceEvents": []}
    # The bare-array form, its closing bracket optional (Chrome's JSON Array Format).
    bare = json.dumps(TRICKY).encode()
    assert [json.loads(e) for e in split(bare, window)[0]] == TRICKY
    assert [json.loads(e) for e in split(bare[:-1], window)[0]] == TRICKY
    assert split(b'{"traceEvents": []}', window) == ([], b'{"traceEvents": []}')


@pytest.mark.parametrize("text,kind", [
    (b"", "empty"),
    (b"   ", "empty"),
    (b"NaN", "invalid"),
    (b'{"traceEvents": [{"ph": "X"}, {"ph": ', "truncated"),
    (b'{"traceEvents": [{"ph": "X"}, {"ph": "X"]}', "invalid"),
    (b'{"other": 1}', "no-events"),
    (b'{"traceEvents": [' + b" " * (3 << 20), "truncated"),
])
def test_what_is_not_a_trace_is_a_one_line_stream_error(text, kind):
    with pytest.raises(StreamError) as err:
        split(text, 1 << 10)
    assert err.value.kind == kind and "\n" not in str(err.value)


def test_gzip_members_are_read_in_pieces_and_a_truncated_one_is_said():
    body = json.dumps({"traceEvents": TRICKY * 1000}).encode()
    half = len(body) // 2
    data = gzip.compress(body[:half]) + gzip.compress(body[half:]) + b"trailing"
    fh = io.BytesIO(data)
    reader = GzipReader(fh, fh.read(10))
    out = b"".join(iter(lambda: reader.read(1000), b""))
    assert out == body
    broken = io.BytesIO(gzip.compress(body)[:-100])
    with pytest.raises(StreamError, match="truncated or corrupt gzip"):
        GzipReader(broken).read(1 << 30)
        GzipReader(broken).read(1 << 30)


def shared(*names: str):
    paths = [TRACES / n for n in names]
    if not all(p.exists() for p in paths):
        pytest.skip("../shared/traces not present")
    return paths


def test_a_real_trace_read_in_batches_is_the_trace_read_whole(monkeypatch):
    for path in shared("resnet50_nw0.pt.trace.json.gz", "hta_trace_diff_control.json.gz",
                       "kineto_2021_schema.json"):
        whole = load_trace(path)
        monkeypatch.setattr(trace_load, "STREAM_ABOVE", 1 << 16)  # every trace in batches
        monkeypatch.setattr("gputop.core.trace_stream.WINDOW", 1 << 18)
        batches = load_trace(path)
        monkeypatch.undo()
        for name in ("steps", "cpu_ops", "python", "runtime", "kernels", "memcpys", "memsets",
                     "gpu_syncs", "memory"):
            assert getattr(batches, name) == getattr(whole, name), (path.name, name)
        assert batches.devices == whole.devices and batches.n_events == whole.n_events
        assert (batches.rank, batches.world_size) == (whole.rank, whole.world_size)


def test_the_agent_cuts_a_real_trace_to_its_budget_and_says_what(tmp_path):
    (path,) = shared("resnet50_nw0.pt.trace.json.gz")
    raw = tmp_path / "raw.json"
    raw.write_bytes(gzip.decompress(path.read_bytes()))
    out = tmp_path / "cut.json.gz"
    budget = raw.stat().st_size // 3
    notes = cut_to_budget(str(raw), str(out), budget, "over the test's budget")
    with gzip.open(out, "rb") as f:
        written = f.read()
    assert len(written) <= budget
    doc = json.loads(written)
    assert doc["gputop"]["cut"] == notes and notes
    assert all("over the test's budget" in n for n in notes)
    # Steps and the key host calls stay: the analysis still names the DataLoader.
    names = {e.get("name") for e in doc["traceEvents"]}
    assert sum(1 for n in names if n and n.startswith("ProfilerStep#")) == 6
    a = analyze_trace(out)
    assert a.cut == notes and "dataloader-stall" in [f.id for f in a.findings]
    # Under budget, nothing is cut.
    assert cut_to_budget(str(raw), str(tmp_path / "same.json.gz"), 1 << 40, "x") == []


def test_the_loader_holds_max_events_and_refuses_more_device_work(tmp_path):
    rng = random.Random(7)
    events = [{"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#1", "ts": 0, "dur": 1e6,
               "pid": 1, "tid": 1}]
    events += [{"ph": "X", "cat": "python_function", "name": f"f{i}", "ts": i,
                "dur": rng.random() * 100, "pid": 1, "tid": 1} for i in range(5000)]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    data = load_trace(path, trace_load.LoadLimits(max_events=1000))
    assert len(data.python) + len(data.steps) <= 1000 and data.steps
    kept = {ev.name for ev in data.python}
    dropped = [e["dur"] for e in events[1:] if e["name"] not in kept]
    assert dropped and max(dropped) <= min(ev.dur for ev in data.python)  # the shortest went
    assert data.cut and "Python frames cut" in data.cut[0]
    with pytest.raises(TraceError, match="never cut"):
        load_trace(path, trace_load.LoadLimits(max_events=0))


def test_py_spy_chrometrace_becomes_timed_samples_of_each_process():
    """Forked workers share their parent's thread ids: py-spy (--subprocesses) interleaves
    their samples on one id, each starting with its `process N` frames."""
    t = 140472268707520

    def ev(ts, pid, ph, name, line=1, file="/w/train.py"):
        return {"ts": ts, "pid": pid, "tid": t, "ph": ph, "name": name,
                "args": {"filename": file, "line": line}}

    main = [ev(100, 7, "B", "process 7:\"python\"", 0, ""), ev(100, 7, "B", "<module>", 90),
            ev(100, 7, "B", "loop", 40)]
    worker = [ev(150, 8, "E", "loop", 40), ev(150, 8, "E", "<module>", 90),
              ev(150, 8, "B", "process 8:\"python\"", 0, ""),
              ev(150, 8, "B", "_worker_loop", 300, "/x/site-packages/torch/data.py"),
              ev(150, 8, "B", "__getitem__", 61)]
    back = [ev(10_100, 7, "E", "__getitem__", 61), ev(10_100, 7, "E", "_worker_loop", 300),
            ev(10_100, 7, "E", "process 8:\"python\"", 0, ""),
            ev(10_100, 7, "B", "<module>", 90), ev(10_100, 7, "B", "loop", 41)]
    end = [ev(20_100, 7, "E", "loop", 41), ev(20_100, 7, "E", "<module>", 90),
           ev(20_100, 7, "E", "process 7:\"python\"", 0, "")]
    tl = parse_chrometrace(json.dumps(main + worker + back + end), epoch=1000.0, rate=100)
    got = [(s.pid, s.frames[-1].function, s.frames[-1].line, round((s.t - 1000.0) * 1e6),
            round(s.dur * 1e6)) for s in tl.samples]
    # Each stack holds until the same process's next one; the last one, one period.
    assert got == [(7, "loop", 40, 100, 10_000), (8, "__getitem__", 61, 150, 10_000),
                   (7, "loop", 41, 10_100, 10_000)]
    assert all(not s.frames[0].function.startswith("process ") for s in tl.samples)
