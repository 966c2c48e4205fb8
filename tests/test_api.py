"""gputop.api, the library face: the docs' examples run as written, the acceptance one-liner,
and bad input raised as one-line errors."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from gputop import api

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "api.md"
TRACE = REPO / "tests" / "data" / "demo_input_starved.pt.trace.json.gz"
DUMPS = REPO / "tests" / "data" / "fr"


def _examples() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)


@pytest.mark.parametrize("index", [0, 1])
def test_the_docs_examples_run_as_written(index):
    code = _examples()[index]
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "dataloader-stall" in done.stdout, done.stdout  # both examples are starved runs


def test_the_one_liner_prints_a_trace_verdict():
    done = subprocess.run(
        [sys.executable, "-c",
         f"from gputop.api import analyze; print(analyze({str(TRACE)!r}).verdict)"],
        capture_output=True, text=True, cwd="/", timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "dataloader-stall"


def test_a_dump_folder_is_a_hang_report():
    result = api.analyze(DUMPS)
    assert result.hang is not None and result.traces == ()
    assert result.verdict == result.hang.verdict
    assert result.to_json()["kind"] == "flight-recorder"


def test_bad_input_is_one_line_error(tmp_path):
    with pytest.raises(api.Error, match="no such file"):
        api.analyze(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(api.Error) as info:
        api.analyze(tmp_path / "bad.json")
    assert "\n" not in str(info.value)
    with pytest.raises(api.Error, match="no trace"):
        api.analyze(tmp_path / "empty" if (tmp_path / "empty").mkdir() is None else tmp_path)
    with pytest.raises(api.Error, match="no demo scenario"):
        api.sample(demo="no-such-scenario")


def test_sample_reads_the_simulated_gpus_and_diagnose_runs_the_live_rules():
    snap = api.sample(demo="tour", agents=False)
    assert isinstance(snap, api.Snapshot) and len(snap.gpus) == 10
    assert all(isinstance(g, api.GpuSample) for g in snap.gpus)
    assert api.diagnose([snap]) == []  # one sample: the rules raise nothing before they hold


def test_the_package_is_typed():
    assert (REPO / "gputop" / "py.typed").exists()
    assert set(api.__all__) <= set(dir(api))
