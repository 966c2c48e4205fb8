"""py-spy's output, parsed: the raw format's corners (a ';' inside a command line or thread
name, no thread prefix, native-less frames), untrusted text that must never break the parser,
and how two recordings (active only, and with idle threads) become per-process figures."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from gputop.stacks.profile import (
    MAX_LINE,
    Frame,
    RawStack,
    build_report,
    parse_dump,
    parse_raw,
    parse_raw_line,
    where_line,
)
from gputop.stacks.render import format_stacks

LINE = ('process 41:"python train.py --tag a;b";process 57:"python train.py";'
        'thread (57): pt worker;<module> (/w/train.py:80);main (/w/train.py:70);'
        'decode (/usr/lib/python3/dist-packages/PIL/Image.py:812) 76')


def test_a_subprocess_line_names_the_worker_its_thread_and_frames():
    s = parse_raw_line(LINE)
    assert s is not None
    assert (s.pid, s.tid, s.thread, s.count) == (57, "57", "pt worker", 76)
    assert [f.function for f in s.frames] == ["<module>", "main", "decode"]
    assert s.frames[-1].line == 812 and s.frames[-1].short_file == "PIL/Image.py"
    assert s.frames[-1].is_library and not s.frames[0].is_library


def test_lines_without_prefixes_or_line_numbers_parse():
    s = parse_raw_line("main (/w/t.py:3);f (/w/t.py) 2")
    assert s is not None and s.pid is None and s.tid is None
    assert s.frames[-1] == Frame("f", "/w/t.py", None)
    s = parse_raw_line('process 9:"x";thread (0x7f12): ;g (/w/t.py:1) 1')
    assert s is not None and s.pid == 9 and s.tid == "0x7f12"


def test_a_command_line_with_newlines_continues_the_record():
    text = 'process 7:"python -c \nimport time; time.sleep(60)";thread (7);<module> (<string>:2) 99\n'
    stacks, bad = parse_raw(text + LINE)
    assert bad == 0 and [(s.pid, s.count) for s in stacks] == [(7, 99), (57, 76)]
    assert stacks[0].thread is None and stacks[0].frames[0] == Frame("<module>", "<string>", 2)


def test_what_does_not_parse_is_counted_not_raised():
    text = "\n".join([LINE, "garbage", "f (x.py:1) notanumber", "x" * (MAX_LINE + 10) + " 1",
                      LINE, 'process 1:"unterminated', ""])
    stacks, bad = parse_raw(text)
    assert len(stacks) == 2 and bad == 4


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=300))
def test_any_text_parses_or_is_skipped(text):
    stacks, bad = parse_raw(text)
    assert bad >= 0 and all(s.count >= 0 for s in stacks)
    parse_dump(text, 1)


def test_dump_json_is_validated_field_by_field():
    doc = [
        {"pid": 5, "thread_name": "MainThread", "os_thread_id": 5, "active": False,
         "owns_gil": False, "frames": [{"name": "wait", "filename": "/l/threading.py",
                                        "line": 327}, {"name": 3, "filename": None}, "junk"]},
        "not a thread",
        {"frames": "no list", "active": "maybe"},
    ]
    threads = parse_dump(json.dumps(doc), 5)
    assert len(threads) == 2
    assert threads[0].frames == (Frame("wait", "/l/threading.py", 327),)
    assert threads[1].active is None and threads[1].frames == ()
    assert parse_dump("{not json", 5) == [] and parse_dump('{"a": 1}', 5) == []


def stack(pid, tid, frames, count):
    return RawStack(pid, str(tid), "MainThread" if pid == tid else "helper",
                    tuple(Frame(name, path, line) for name, path, line in frames), count)


BURN = [("<module>", "/w/t.py", 9), ("burn", "/w/t.py", 4)]
SLEEP = [("<module>", "/w/t.py", 10)]


def test_active_idle_and_the_top_function_of_each_process():
    active = [stack(1, 1, BURN, 90), stack(2, 2, BURN, 10), stack(1, 1, SLEEP, 1)]
    everything = [stack(1, 1, BURN, 91), stack(1, 1, SLEEP, 9), stack(1, 3, SLEEP, 100),
                  stack(2, 2, BURN, 10), stack(2, 2, SLEEP, 90)]
    report = build_report(1, 1.0, 100, active, everything)
    main, worker = report.main, report.workers[0]
    assert (main.pid, main.samples, main.active, main.threads) == (1, 200, 91, 2)
    top = main.top_functions[0]
    assert (top.frame.function, top.frame.line, top.samples) == ("burn", 4, 90)
    assert abs(top.share - 90 / 91) < 1e-9
    # Thread 3 never ran; thread 1 ran 91 of its 100 samples (the one-sample difference at
    # BURN is sampling noise, not waiting).
    assert [(t.tid, t.active) for t in main.by_thread] == [("1", 91), ("3", 0)]
    assert [e.frame.line for e in main.idle_in] == [10]
    assert abs(main.idle_in[0].share - 1.0) < 1e-9
    assert worker.role == "worker" and worker.active_share == 0.1
    assert report.top()[0] is main
    line = where_line(report, "dataloader-stall")
    assert line == "burn (t.py:4), 99 % of main-process samples"


def test_workers_busier_than_the_main_process_are_the_where():
    lib = [("<module>", "/w/ds.py", 9), ("__getitem__", "/w/ds.py", 48),
           ("decode", "/venv/lib/python3.11/site-packages/PIL/Image.py", 700)]
    active = [stack(1, 1, SLEEP, 5), stack(2, 2, lib, 60), stack(3, 3, lib, 40)]
    report = build_report(1, 1.0, 100, active, None)
    assert where_line(report, "dataloader-stall") == (
        "decode (PIL/Image.py:700) in ds.py:48, 100 % of worker samples")
    text = format_stacks(report, "python train.py")
    assert "worker 2" in text and "in __getitem__ (ds.py:48)" in text


def test_a_hung_process_says_where_its_main_thread_waits():
    dump = json.dumps([{"pid": 1, "thread_name": "MainThread", "os_thread_id": 1,
                        "active": False, "frames": [
                            {"name": "wait", "filename": "/usr/lib/python3.11/threading.py",
                             "line": 327},
                            {"name": "all_reduce", "filename": "/w/train.py", "line": 61}]}])
    report = build_report(1, 1.0, 100, [], [stack(1, 1, SLEEP, 100)], {1: parse_dump(dump, 1)})
    assert where_line(report, "hung") == "MainThread waits in wait (threading.py:327) in train.py:61"
    text = format_stacks(report)
    assert "idle the whole time: whole stacks" in text and "all_reduce (train.py:61)" in text


def test_text_from_the_process_is_escaped_when_printed():
    evil = [("<module>", "/w/t.py", 1), ("f\x1b[31mred", "/w/\u202et.py", 2)]
    report = build_report(1, 1.0, 100, [stack(1, 1, evil, 5)], None)
    text = format_stacks(report, "python \x1b]0;title\x07")
    assert "\x1b" not in text and "\u202e" not in text and "\\x1b" in text


def test_py_spys_files_are_read_up_to_their_bound(tmp_path):
    """A file of py-spy's is read whole up to its bound and refused beyond it (None); a
    missing one reads as empty. The bound is on what is read, never a buffer that size."""
    from gputop.stacks.pyspy import _read_bounded

    path = tmp_path / "dump.json"
    path.write_bytes(b"x" * 200_000)
    assert _read_bounded(path, 200_000) == "x" * 200_000
    assert _read_bounded(path, 199_999) is None
    assert _read_bounded(path, 16 * 1024 * 1024) == "x" * 200_000
    path.write_bytes("é\n".encode())
    assert _read_bounded(path, 3) == "é\n" and _read_bounded(path, 2) is None
    assert _read_bounded(tmp_path / "gone", 10) == ""
