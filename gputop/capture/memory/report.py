"""A memory report (a memory capture's, or an out-of-memory error's), read back on the
monitor's side: untrusted, so bounded and typed.

The agent writes it (``gputop.agent.memory.state``); here it is read from a file named by an
agent or by the user (``gputop memory --last-oom FILE``): a regular file, at most
``MAX_REPORT_BYTES``, opened without blocking; for another user's agent, owned by that user and
not reached through a symbolic link. It is decoded with msgspec straight into the structures
below: a wrong type anywhere, a list over its bound or a string over its length refuses the
whole file (one line, ``ReportError``); fields a newer agent adds are ignored. Text is kept as
written (JSON output keeps the exact bytes); it is escaped where printed (``render``).
"""

from __future__ import annotations

import os
import stat
from typing import Annotated, Literal

import msgspec

from gputop.capture.memory.report_error import ReportError  # noqa: F401  (raised and caught by callers)

MAX_REPORT_BYTES = 1 << 20
FORMAT = "gputop-memory"

Short = Annotated[str, msgspec.Meta(max_length=400)]
Text = Annotated[str, msgspec.Meta(max_length=2000)]
Bytes = Annotated[int, msgspec.Meta(ge=0, le=1 << 62)]
Count = Annotated[int, msgspec.Meta(ge=0, le=1 << 53)]
Device = Annotated[str, msgspec.Meta(pattern=r"^(cpu|cuda(:[0-9]{1,3})?)$")]


class Place(msgspec.Struct, frozen=True, kw_only=True):
    """A source line: where an allocation was made (None: no Python frame)."""

    file: Short | None = None
    line: Count | None = None
    function: Short | None = None
    code: Short | None = None

    def location(self) -> str | None:
        if not self.file:
            return None
        return f"{os.path.basename(self.file)}:{self.line}" if self.line else self.file


class GrowthLine(Place, frozen=True, kw_only=True):
    bytes: Bytes
    bytes_per_step: Bytes
    count: Count = 0
    alive_per_step: Annotated[list[Bytes], msgspec.Meta(max_length=1002)] = []
    steady: bool = False
    kept_by: Short | None = None


class SizedLine(Place, frozen=True, kw_only=True):
    bytes: Bytes


class Parts(msgspec.Struct, frozen=True, kw_only=True):
    parameters: Bytes = 0
    gradients: Bytes = 0
    optimizer_state: Bytes = 0
    activations: Bytes = 0
    other: Bytes = 0


class Peak(msgspec.Struct, frozen=True, kw_only=True):
    step: Count
    bytes: Bytes
    absolute: bool = False  # counts what the allocator held before the window too (CUDA)
    parts: Parts
    activation_lines: Annotated[list[SizedLine], msgspec.Meta(max_length=16)] = []
    reserved: Bytes | None = None


class Segments(msgspec.Struct, frozen=True, kw_only=True):
    count: Count = 0
    large: Count = 0
    small: Count = 0
    reserved: Bytes = 0
    allocated: Bytes = 0
    free_blocks: Count = 0
    free: Bytes = 0
    largest_free: Bytes = 0
    largest_free_blocks: Annotated[list[Bytes], msgspec.Meta(max_length=32)] = []


class Allocator(msgspec.Struct, frozen=True, kw_only=True):
    caching: bool = True  # the CUDA caching allocator; False: the CPU's (malloc)
    allocated: Bytes | None = None
    reserved: Bytes | None = None
    active: Bytes | None = None
    inactive_split: Bytes | None = None
    allocated_peak: Bytes | None = None
    reserved_peak: Bytes | None = None
    alloc_retries: Count | None = None
    ooms: Count | None = None
    device_free: Bytes | None = None
    device_total: Bytes | None = None
    settings: Short = ""
    expandable_segments: bool | None = None
    segments: Segments | None = None


class Model(msgspec.Struct, frozen=True, kw_only=True):
    parameters: Bytes = 0
    gradients: Bytes = 0
    optimizer_state: Bytes = 0


class Process(msgspec.Struct, frozen=True, kw_only=True):
    rss: Bytes | None = None
    rss_peak: Bytes | None = None
    address_space: Bytes | None = None
    limit_address_space: Bytes | None = None
    cgroup_max: Bytes | None = None
    cgroup_current: Bytes | None = None


class Oom(msgspec.Struct, frozen=True, kw_only=True):
    requested: Bytes | None = None
    exception: Short = "OutOfMemoryError"
    fatal: bool = False
    message: Text | None = None
    step: Count = 0
    where: Place | None = None
    stack: Annotated[list[Place], msgspec.Meta(max_length=32)] = []
    device_total: Bytes | None = None
    device_free: Bytes | None = None


class Holder(msgspec.Struct, frozen=True, kw_only=True):
    what: Short
    bytes: Bytes
    tensors: Count = 0


class Census(msgspec.Struct, frozen=True, kw_only=True):
    held_by: Annotated[list[Holder], msgspec.Meta(max_length=8)] = []
    tensor_bytes: Bytes = 0
    tensors: Count = 0
    cut: Short | None = None


class MemoryReport(msgspec.Struct, frozen=True, kw_only=True):
    format: Literal["gputop-memory"]
    version: Annotated[int, msgspec.Meta(ge=1, le=1)]
    kind: Literal["capture", "oom"]
    pid: Annotated[int, msgspec.Meta(ge=1, le=1 << 31)]
    host: Short = ""
    # Times a calendar can show (1970 to 9999): 1e308 or -1e18 would break every clock shown.
    time: Annotated[float, msgspec.Meta(ge=0, lt=253402300800)]
    process_started: Annotated[float, msgspec.Meta(ge=0, lt=253402300800)] | None = None
    torch: Short = ""
    device: Device
    source: Literal["profiler", "allocator-history", "allocator-state", "process"]
    allocator: Allocator = Allocator()
    steps: Count = 0
    first_step: Count | None = None
    window_s: Annotated[float, msgspec.Meta(ge=0)] | None = None
    step_times_s: Annotated[list[Annotated[float, msgspec.Meta(ge=0)]],
                            msgspec.Meta(max_length=1000)] = []
    usual_step_s: Annotated[float, msgspec.Meta(ge=0)] | None = None
    events: Count = 0
    growth: Annotated[list[GrowthLine], msgspec.Meta(max_length=16)] = []
    peak: Peak | None = None
    model: Model = Model()
    process: Process = Process()
    oom: Oom | None = None
    census: Census | None = None
    live_lines: Annotated[list[SizedLine], msgspec.Meta(max_length=16)] = []
    notes: Annotated[list[Short], msgspec.Meta(max_length=16)] = []
    cut: Annotated[list[Short], msgspec.Meta(max_length=16)] = []
    analysis_s: Annotated[float, msgspec.Meta(ge=0)] | None = None  # reading the capture
    report_s: Annotated[float, msgspec.Meta(ge=0)] | None = None  # building an OOM report

    def to_json(self) -> dict:
        return msgspec.to_builtins(self)


_DECODER = msgspec.json.Decoder(MemoryReport)


def decode_report(data: bytes, name: str = "the report") -> MemoryReport:
    """Decode and check one report (``ReportError`` with one line when it is not one)."""
    if len(data) > MAX_REPORT_BYTES:
        raise ReportError(f"{name}: larger than {MAX_REPORT_BYTES >> 20} MiB; not a gputop "
                          "memory report")
    try:
        report = _DECODER.decode(data)
    except msgspec.ValidationError as exc:
        raise ReportError(f"{name}: not a gputop memory report ({_one_line(exc)})") from None
    except msgspec.DecodeError as exc:
        raise ReportError(f"{name}: not a gputop memory report (not JSON: "
                          f"{_one_line(exc)})") from None
    if report.kind == "oom" and report.oom is None:
        raise ReportError(f"{name}: an out-of-memory report without its error")
    return report


def read_report(path: str, owner_uid: int | None = None,
                owners: frozenset[int] | None = None) -> MemoryReport:
    """Read a report file (``read_report_owned`` without whose file it is)."""
    return read_report_owned(path, owner_uid, owners)[0]


def read_report_owned(path: str, owner_uid: int | None = None,
                      owners: frozenset[int] | None = None) -> tuple[MemoryReport, int]:
    """Read a report file, a regular file of at most ``MAX_REPORT_BYTES``, and the uid that
    owns what was read.

    ``owner_uid`` (another user's agent named it): owned by that user and not a link.
    ``owners`` (found by a pid in a shared folder): owned by one of these uids and not a link.
    A link is followed only when it is the caller's own; a file that is not the caller's own
    that is refused or is no report gets an error that says nothing of its content."""
    if owner_uid is not None:
        owners = frozenset({owner_uid})
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    me = os.geteuid()
    try:
        link = os.lstat(path)
    except OSError:
        link = None  # the open says what is wrong
    if owners is not None or (link is not None and stat.S_ISLNK(link.st_mode)
                              and link.st_uid != me):
        flags |= os.O_NOFOLLOW  # another user's link is never followed
        if link is not None and stat.S_ISLNK(link.st_mode) and link.st_uid != me:
            raise ReportError(f"{path}: a symbolic link of uid {link.st_uid}; another user's "
                              "link is not followed")
        if link is not None and not stat.S_ISREG(link.st_mode):
            raise ReportError(f"{path}: not a regular file; not read"
                              + (" for another user's agent" if owner_uid is not None else ""))
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise ReportError(f"{path}: {_os_reason(exc)}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ReportError(f"{path}: not a regular file")
        if owners is not None and st.st_uid not in owners:
            whose = ("the agent's uid" if owner_uid is not None else
                     "the process's user or root: uid " + ", ".join(map(str, sorted(owners))))
            raise ReportError(f"{path}: owned by uid {st.st_uid}, not by {whose}"
                              + (f" {owner_uid}" if owner_uid is not None else "")
                              + "; not read")
        if st.st_size > MAX_REPORT_BYTES:
            raise ReportError(f"{path}: larger than {MAX_REPORT_BYTES >> 20} MiB; not a "
                              "gputop memory report")
        data = b""
        while len(data) <= MAX_REPORT_BYTES:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            data += chunk
    except OSError as exc:
        raise ReportError(f"{path}: {_os_reason(exc)}") from None
    finally:
        os.close(fd)
    if st.st_uid not in (me, 0) or owners is not None:
        try:
            return decode_report(data, path), st.st_uid
        except ReportError:  # whose content it is not ours to describe
            raise ReportError(f"{path}: not a gputop memory report") from None
    return decode_report(data, path), st.st_uid


def _os_reason(exc: OSError) -> str:
    if isinstance(exc, FileNotFoundError):
        return "no such file"
    if isinstance(exc, IsADirectoryError):
        return "is a directory, not a memory report"
    if exc.errno == getattr(os, "ELOOP", -1):
        return "is a symbolic link; not followed for a report named by another user's agent"
    return f"cannot read ({exc.strerror or exc})"


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())[:200]
