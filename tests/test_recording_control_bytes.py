"""A recording whose Parquet footers carry bytes 0x00-0x0f (pyarrow's thrift reader quotes a bad
type byte raw in its error: "don't know what type: \\x0e", SO switches a terminal's character
set): `report` (text and JSON) and `replay` print no raw control byte on stdout or stderr, and
still name each part they skipped."""

from __future__ import annotations

import io
import re
import shutil
import struct
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import run_cli

RAW = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")  # every control byte but the newline


@pytest.fixture(scope="module")
def recording(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ctl-rec") / "run"
    done = run_cli("--demo", "throttled", "--interval", "0.5", "record", "-o", str(path),
                   "--duration", "4", "--flush-every", "1")
    assert done.returncode == 0, done.stderr
    return path


def _footer_start(data: bytes) -> int:
    (size,) = struct.unpack("<I", data[-8:-4])
    return len(data) - 8 - size


def _damaged(recording: Path, target: Path, values: list[int]) -> list[str]:
    """A copy whose every part's footer starts with one of ``values`` (the first field's
    header byte: its low four bits are the thrift type); pyarrow's messages for them."""
    shutil.copytree(recording, target)
    said = []
    for i, part in enumerate(sorted(target.rglob("part-*.parquet"))):
        data = bytearray(part.read_bytes())
        data[_footer_start(data)] = values[i % len(values)]
        part.write_bytes(bytes(data))
        try:
            pq.read_metadata(io.BytesIO(bytes(data)))
        except Exception as exc:  # what the library says, whatever it is
            said.append(str(exc))
    return said


def test_no_raw_control_byte_from_a_damaged_footer(recording, tmp_path):
    # SO and SI first (the ones pyarrow quotes raw), then every other byte below 0x10.
    values = [0x0E, 0x0F, *range(0x0E)]
    said = _damaged(recording, tmp_path / "run", values)
    assert any(RAW.search(s.rstrip("\n")) for s in said), said  # what is checked is real
    runs = {"report": run_cli("report", str(tmp_path / "run")),
            "report --json": run_cli("report", "--json", str(tmp_path / "run")),
            "replay": run_cli("replay", str(tmp_path / "run"))}
    for name, done in runs.items():
        assert "Traceback" not in done.stderr, (name, done.stderr)
        for stream in (done.stdout, done.stderr):
            found = RAW.search(stream)
            assert found is None, (name, repr(stream[max(0, found.start() - 80):found.end()]))
    said_by_report = runs["report"].stderr  # a warning per part, or the error naming them all
    assert "part-000001.parquet" in said_by_report, said_by_report
    assert "\\x0e" in said_by_report or "\\x0f" in said_by_report, said_by_report
