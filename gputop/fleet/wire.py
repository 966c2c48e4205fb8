"""The `gputop stream` wire format: JSON lines, one object per line, versioned.

A node's `gputop stream` writes a ``hello`` line at once, then one ``sample`` line per interval:
its snapshot in the public ``snapshot --json`` schema and its active findings (the live rules'
hysteresis already applied on the node). It may end with one ``error`` line. The fleet side
treats every byte as untrusted: a line is at most ``MAX_LINE`` bytes, decodes into typed
structures (msgspec; a wrong type anywhere rejects the line), is bounded in count (GPUs,
processes, findings) and has every string escaped (``gputop.format.safe_text``) before anything
draws or prints it.

Schema 1::

    {"type": "hello", "schema": 1, "version": "0.x", "hostname": str, "interval": s,
     "demo": scenario or null}
    {"type": "sample", "time": unix s, "snapshot": {...snapshot --json...},
     "findings": [{"id", "severity", "title", "evidence", "fix", "next_step", "cost_s",
                   "gpu", "pid"}]}
    {"type": "error", "message": str}

A reader ignores fields it does not know (a newer node may add some) and refuses a line whose
schema number is higher than its own.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from typing import Annotated, Any, Literal

import msgspec

from gputop.format import RAW_IN_JSON, json_safe, safe_text
from gputop.model import DriverInfo, GpuSample, HostSample, ProcSample, Snapshot, snapshot_to_json

SCHEMA = 1
MAX_LINE = 1 << 20  # bytes; a 64-GPU node with 1000 processes writes ~300 KB
MAX_GPUS = 64
MAX_PROCESSES = 1024  # per GPU, and training processes outside the GPUs
MAX_WORKERS = 1024  # per process
MAX_FINDINGS = 256
MAX_TEXT = 2000  # characters of a finding's title, evidence, fix or next step

Text = Annotated[str, msgspec.Meta(max_length=MAX_TEXT)]
FindingId = Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9][a-z0-9-]{0,47}$")]


class Hello(msgspec.Struct, tag_field="type", tag="hello", frozen=True):
    schema: int
    version: Annotated[str, msgspec.Meta(max_length=64)] = ""
    hostname: Annotated[str, msgspec.Meta(max_length=256)] = ""
    interval: float = 1.0
    demo: Annotated[str, msgspec.Meta(max_length=64)] | None = None


class RemoteFinding(msgspec.Struct, frozen=True):
    """A finding as a node reported it. Not ``diagnostics.findings.Finding``: a newer node may
    name an id this gputop does not know, and that must not cost the whole sample."""

    id: FindingId
    severity: Literal["info", "warning", "critical"]
    title: Text = ""
    evidence: Text = ""
    fix: Text = ""
    next_step: Text = ""
    cost_s: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    gpu: int | None = None
    pid: int | None = None


class _WireSnapshot(msgspec.Struct, frozen=True):
    time: float
    host: HostSample
    driver: DriverInfo
    gpus: tuple[GpuSample, ...] = ()
    processes: tuple[ProcSample, ...] = ()


class _WireSample(msgspec.Struct, tag_field="type", tag="sample", frozen=True):
    time: float
    snapshot: _WireSnapshot
    findings: tuple[RemoteFinding, ...] = ()


class StreamError(msgspec.Struct, tag_field="type", tag="error", frozen=True):
    message: Annotated[str, msgspec.Meta(max_length=MAX_TEXT)] = ""


class Sample(msgspec.Struct, frozen=True):
    """A decoded, bounded and escaped sample line."""

    snapshot: Snapshot
    findings: tuple[RemoteFinding, ...]


class WireError(ValueError):
    """A line that is not valid schema-1 stream output; the message is one escaped line."""

# What safe_text would change, as it can appear in a JSON line: JSON's short escapes of
# controls (\b \f \n \r \t), a \u escape of a C0 or C1 control, DEL, U+200E/F, U+202A-E
# or U+2066-9, or those characters raw in UTF-8. That is every way JSON can spell them:
# msgspec refuses raw C0 controls in strings, lone surrogates and invalid UTF-8 by itself.
# A false alarm (an escaped backslash before an "n") only costs the walk.
_MAYBE_DIRTY = re.compile(
    rb"\\[bfnrt]|\\u(?:00[01]|007[fF]|00[89]|200[eEfF]|202[a-eA-E]|206[6-9])|"
    + RAW_IN_JSON.pattern)
_decoder = msgspec.json.Decoder(Hello | _WireSample | StreamError)
_snapshot_decoder = msgspec.json.Decoder(_WireSnapshot)
_encoder = msgspec.json.Encoder()


# -- the node's side ---------------------------------------------------------------------------


# The node's lines may be read on a terminal too (`gputop stream` by hand): C1 controls and
# bidi characters go out as \\u escapes (json_safe), as JSON's C0 controls do anyway.


def hello_line(hostname: str, interval: float, version: str, demo: str | None) -> bytes:
    return json_safe(_encoder.encode({"type": "hello", "schema": SCHEMA, "version": version,
                                      "hostname": hostname, "interval": interval,
                                      "demo": demo})) + b"\n"


def sample_line(snap: Snapshot, findings: Iterable[Any]) -> bytes:
    """One sample; msgspec writes a NaN as null, so the line is always valid JSON."""
    return json_safe(_encoder.encode({"type": "sample", "time": snap.time,
                                      "snapshot": snapshot_to_json(snap),
                                      "findings": [f.to_json() for f in findings]})) + b"\n"


def error_line(message: str) -> bytes:
    return json_safe(_encoder.encode({"type": "error", "message": message[:MAX_TEXT]})) + b"\n"


# -- the reader's side -------------------------------------------------------------------------


def _decode(decoder: msgspec.json.Decoder, data: bytes, what: str) -> Any:
    """``data`` decoded, bounded in size; any failure is a one-line ``WireError``."""
    if len(data) > MAX_LINE:
        raise WireError(f"{what} of {len(data)} bytes (limit {MAX_LINE})")
    try:
        return decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise WireError(f"invalid {what}: {_one_line(exc)}") from None
    except msgspec.DecodeError as exc:
        raise WireError(f"not JSON: {_one_line(exc)}") from None


def decode_line(line: bytes) -> Hello | Sample | StreamError:
    """Decode one line (without its newline). Raises ``WireError`` on anything else."""
    message = _decode(_decoder, line, "stream line")
    # Escaping walks every string; a line that spells no control, DEL or bidi character in any
    # of JSON's ways (_MAYBE_DIRTY) has nothing to escape.
    dirty = _MAYBE_DIRTY.search(line) is not None
    if isinstance(message, Hello):
        if message.schema > SCHEMA:
            raise WireError(f"stream schema {message.schema}; this gputop reads schema "
                            f"{SCHEMA}: upgrade it")
        return _clean(message) if dirty else message
    if isinstance(message, StreamError):
        return StreamError(one_line(message.message))
    if len(message.findings) > MAX_FINDINGS:
        raise WireError(f"{len(message.findings)} findings in one sample (limit {MAX_FINDINGS})")
    sample = Sample(_snapshot(message.snapshot), message.findings)
    return _clean(sample) if dirty else sample


def decode_snapshot(data: bytes) -> Snapshot:
    """One ``snapshot --json`` object (a recording's ``_snapshots`` row, say) decoded into the
    model as a stream's sample is: bounded, typed, escaped. Raises ``WireError``."""
    snap = _snapshot(_decode(_snapshot_decoder, data, "snapshot"))
    return _clean(snap) if _MAYBE_DIRTY.search(data) is not None else snap


def _snapshot(wire: _WireSnapshot) -> Snapshot:
    _check_bounds(wire)
    gpus = tuple(dataclasses.replace(g, processes=_agents_checked(g.processes))
                 if any(p.agent for p in g.processes) else g for g in wire.gpus)
    return Snapshot(time=wire.time, host=wire.host, driver=wire.driver, gpus=gpus,
                    other_processes=_agents_checked(wire.processes))


def _agents_checked(procs: tuple[ProcSample, ...]) -> tuple[ProcSample, ...]:
    """A node's (or a recording's) agent telemetry through the same check as a local agent's
    reply (``client.status``): out-of-range values dropped and named in ``rejected``."""
    from gputop.client.status import parse_status

    return tuple(dataclasses.replace(p, agent=parse_status(p.agent).to_dict())
                 if isinstance(p.agent, dict) else p for p in procs)


def _check_bounds(snap: _WireSnapshot) -> None:
    if len(snap.gpus) > MAX_GPUS:
        raise WireError(f"{len(snap.gpus)} GPUs in one sample (limit {MAX_GPUS})")
    indices = [g.index for g in snap.gpus]
    if len(set(indices)) != len(indices):
        raise WireError("the same GPU index twice in one sample")
    groups = [g.processes for g in snap.gpus] + [snap.processes]
    for procs in groups:
        if len(procs) > MAX_PROCESSES:
            raise WireError(f"{len(procs)} processes on one GPU (limit {MAX_PROCESSES})")
        for proc in procs:
            if len(proc.workers) > MAX_WORKERS:
                raise WireError(f"{len(proc.workers)} workers of one process "
                                f"(limit {MAX_WORKERS})")


def one_line(text: object, limit: int = 300) -> str:
    """Untrusted text as one short, escaped line."""
    flat = " ".join(str(text).split())
    if len(flat) > limit:
        flat = flat[: limit - 1] + "…"
    return safe_text(flat)


def _one_line(exc: Exception) -> str:
    return one_line(exc, 200)


def _clean(value: Any) -> Any:
    """``value`` with every string in it escaped (dataclasses, structs, tuples, dicts)."""
    if isinstance(value, str):
        return safe_text(value)
    if isinstance(value, tuple):
        return tuple(_clean(v) for v in value)
    if isinstance(value, list):
        return [_clean(v) for v in value]
    if isinstance(value, dict):
        return {_clean(k): _clean(v) for k, v in value.items()}
    if isinstance(value, msgspec.Struct):
        changes = {name: _clean(getattr(value, name)) for name in value.__struct_fields__}
        return msgspec.structs.replace(value, **changes)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {f.name: _clean(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return dataclasses.replace(value, **changes)
    return value
