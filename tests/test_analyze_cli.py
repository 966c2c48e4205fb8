"""`gputop analyze` as a user runs it: the report, JSON Lines, and bad input (one line, exit 2)."""

from __future__ import annotations

import gzip
import json

import pytest

from tests.conftest import DATA, DEMO_TRACE, TRACES, run_cli

needs_traces = pytest.mark.skipif(not TRACES.is_dir(), reason="../shared/traces not present")
NW0 = TRACES / "resnet50_nw0.pt.trace.json.gz"
SMALL = TRACES / "kineto_2021_schema.json"  # plain JSON, 2021 schema, 85 kB
SMALL_GZ = TRACES / "hta_event_sync.json.gz"


def assert_one_line_error(proc, fragment: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("gputop: error: ") and fragment in lines[0], lines[0]
    assert "Traceback" not in proc.stderr


def test_help_documents_json_lines():
    proc = run_cli("analyze", "--help")
    assert proc.returncode == 0
    assert "JSON Lines" in proc.stdout and "TRACE" in proc.stdout
    # Its own options first; the global ones once, under one heading at the end.
    usage = proc.stdout.split("\n\n", 1)[0]
    assert "--json" in usage and "--demo" not in usage
    head, globals_ = proc.stdout.rsplit("\nglobal options:\n", 1)
    assert "--max-events N" in head and "--demo" not in head and "--hosts" not in head
    assert "--demo" in globals_ and "--remote-gputop" in globals_ and "gputop --help" in globals_


def test_every_commands_help_names_the_global_options_once_at_the_end():
    import argparse

    from gputop.cli import COMMANDS, build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name in COMMANDS:
        text = sub.choices[name].format_help()
        assert text.count("--demo") == 1 and text.count("--ssh-option") == 1, name
        # (wrapped to the terminal: the sentence may break across lines)
        assert " ".join(text.split()).endswith("`gputop --help` says what they do."), name
    assert "sampling interval in seconds" in parser.format_help()  # their help: here


@needs_traces
def test_human_report_is_compact_and_complete():
    proc = run_cli("analyze", str(NW0))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "Verdict: dataloader-stall" in out
    assert "Where the step time went" in out
    bar = next(line for line in out.splitlines() if line.startswith("  ["))
    assert len(bar) == 100 and bar.endswith("]")  # the report's default width
    assert set(bar.strip()[1:-1]) <= set("CNMSPAWDLH.Q?")
    assert "D idle: DataLoader 33." in out
    for heading in ("Evidence:", "Fix:", "Next:", "Top CPU ops", "Top kernels", "Assessed:"):
        assert heading in out
    assert "ncu --kernel-name dgrad_engine" in out
    assert max(len(line) for line in out.splitlines()) <= 100
    # Compact: under 80 lines before the roofline (its chart and its two findings, ~50 more).
    assert len(out.splitlines()) < 130
    assert "Roofline on Tesla V100-DGXS-32GB:" in out


@needs_traces
def test_json_lines_one_object_per_trace_in_order():
    proc = run_cli("analyze", "--json", str(SMALL), str(NW0))
    assert proc.returncode == 0, proc.stderr
    objs = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [o["file"] for o in objs] == [str(SMALL), str(NW0)]
    for o in objs:
        assert {"file", "metrics", "findings", "verdict"} <= set(o)
        for f in o["findings"]:
            assert {"id", "severity", "title", "evidence", "fix", "next_step"} <= set(f)
    assert objs[1]["verdict"] == "dataloader-stall"


@needs_traces
def test_bad_inputs_give_one_line_and_exit_2(tmp_path):
    raw = gzip.decompress(SMALL_GZ.read_bytes())
    cases = {
        "truncated.json": (raw[: len(raw) // 2], "truncated JSON"),
        "truncated.json.gz": (SMALL_GZ.read_bytes()[:1500], "truncated or corrupt gzip"),
        "notes.json": (b"these are not the traces you are looking for\n", "not valid JSON"),
        "header-only.json": (b'{"schemaVersion": 1, "deviceProperties": []}', "no traceEvents"),
        "no-events.json": (b'{"traceEvents": []}', "no profiler events"),
        "empty.json": (b"", "empty file"),
        "spaces.json": (b" " * (1 << 20), "only white space"),  # not "empty" (issue 37)
        "binary.json": (bytes(range(256)) * 4, "not valid JSON"),
    }
    for name, (content, fragment) in cases.items():
        path = tmp_path / name
        path.write_bytes(content)
        proc = run_cli("analyze", str(path))
        assert_one_line_error(proc, fragment)
        assert proc.stdout == ""
    assert_one_line_error(run_cli("analyze", str(tmp_path / "missing.json")), "no such file")
    # The folder of them: every file is tried, one line each, in name order.
    proc = run_cli("analyze", str(tmp_path))
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines() == [run_cli("analyze", str(tmp_path / name)).stderr.strip()
                                        for name in sorted(cases)]


@needs_traces
def test_good_traces_are_reported_even_when_one_is_bad(tmp_path):
    bad = tmp_path / "cut.json"
    bad.write_bytes(SMALL.read_bytes()[:4000])
    proc = run_cli("analyze", "--json", str(SMALL), str(bad), str(SMALL_GZ))
    assert_one_line_error(proc, "cut.json")
    files = [json.loads(line)["file"] for line in proc.stdout.splitlines()]
    assert files == [str(SMALL), str(SMALL_GZ)]


@needs_traces
def test_chrome_array_form_and_bare_na_values_load(tmp_path):
    doc = json.loads(SMALL.read_text())
    as_array = tmp_path / "array.json"
    as_array.write_text(json.dumps(doc["traceEvents"]))
    # Some Kineto versions write a bare N/A for unknown values; TensorBoard reads those too.
    with_na = tmp_path / "na.json"
    text = json.dumps(doc)
    assert '"Device": 24572' in text
    with_na.write_text(text.replace('"Device": 24572', '"Device": N/A', 1))
    original = json.loads(run_cli("analyze", "--json", str(SMALL)).stdout)
    for path in (as_array, with_na):
        proc = run_cli("analyze", "--json", str(path))
        assert proc.returncode == 0, proc.stderr
        result = json.loads(proc.stdout)
        assert result["verdict"] == original["verdict"]
        assert result["metrics"]["steps"] == original["metrics"]["steps"]


# -- a folder of traces (what tensorboard_trace_handler writes) --------------------------------
# The traces tests/data ships (tests/scripts/make_test_traces.py): they run without ../shared.

def test_a_folder_of_two_traces_prints_both_reports(tmp_path):
    folder = tmp_path / "log"
    folder.mkdir()
    # As tensorboard_trace_handler names them; a file of another kind beside them is left out.
    (folder / "node_1.1.pt.trace.json.gz").write_bytes(DEMO_TRACE.read_bytes())
    (folder / "node_2.2.pt.trace.json.gz").write_bytes((DATA / "ddp2" / "rank0.pt.trace.json.gz")
                                                       .read_bytes())
    (folder / "notes.json").write_text("{}")
    (folder / "run2").mkdir()
    proc = run_cli("analyze", str(folder))
    assert proc.returncode == 0, proc.stderr
    heads = [line for line in proc.stdout.splitlines() if line.startswith("gputop analyze: ")]
    assert heads == ["gputop analyze: node_1.1.pt.trace.json.gz",
                     "gputop analyze: node_2.2.pt.trace.json.gz"]
    assert "Verdict: dataloader-stall" in proc.stdout and "Ranks of one job" not in proc.stdout
    lines = run_cli("analyze", "--json", str(folder)).stdout.splitlines()
    assert [json.loads(line)["file"] for line in lines] == [
        str(folder / "node_1.1.pt.trace.json.gz"), str(folder / "node_2.2.pt.trace.json.gz")]


def test_a_folder_of_the_ranks_of_one_job_gives_the_job_wide_report():
    proc = run_cli("analyze", str(DATA / "ddp2"))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "gputop analyze: rank0.pt.trace.json.gz" in out
    assert "gputop analyze: rank1.pt.trace.json.gz" in out
    job = out.split("Ranks of one job (2 traces", 1)[1]
    assert "imbalance: rank 1 holds the job back (dataloader-stall)" in job


def test_a_folder_without_traces_is_one_line(tmp_path):
    (tmp_path / "readme.txt").write_text("no traces here")
    assert_one_line_error(run_cli("analyze", str(tmp_path)), "no trace in this folder")
