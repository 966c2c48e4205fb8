"""The `gputop stream` wire format: JSON lines, one object per line, versioned.

A node's `gputop stream` writes a ``hello`` line at once, then one ``sample`` line per interval:
its snapshot in the public ``snapshot --json`` schema and its active findings (the live rules'
hysteresis already applied on the node). It may end with one ``error`` line. The fleet side
treats every byte as untrusted: a line is at most ``MAX_LINE`` bytes, decodes into typed
structures (msgspec; a wrong type anywhere rejects the line), is bounded in count (GPUs,
processes, findings) and has every string escaped (``gputop.core.format.safe_text``) before anything
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

from collections.abc import Iterable
from typing import Annotated, Any, Literal

import msgspec

from gputop.core.agent_status import decode_hook
from gputop.core.format import json_safe
from gputop.core.model import Snapshot
from gputop.core.snapshot_json import (  # noqa: F401  (MAX_LINE: a stream line's cap is a snapshot's)
    MAX_LINE,
    MAYBE_DIRTY,
    WireError,
    WireSnapshot,
    decode_bounded,
    escape_strings,
    one_line,
    snapshot_from_wire,
    snapshot_to_json,
)

SCHEMA = 1
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


class _WireSample(msgspec.Struct, tag_field="type", tag="sample", frozen=True):
    time: float
    snapshot: WireSnapshot
    findings: tuple[RemoteFinding, ...] = ()


class StreamError(msgspec.Struct, tag_field="type", tag="error", frozen=True):
    message: Annotated[str, msgspec.Meta(max_length=MAX_TEXT)] = ""


class Sample(msgspec.Struct, frozen=True):
    """A decoded, bounded and escaped sample line."""

    snapshot: Snapshot
    findings: tuple[RemoteFinding, ...]


_decoder = msgspec.json.Decoder(Hello | _WireSample | StreamError, dec_hook=decode_hook)
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


def decode_line(line: bytes) -> Hello | Sample | StreamError:
    """Decode one line (without its newline). Raises ``WireError`` on anything else."""
    message = decode_bounded(_decoder, line, "stream line")
    # Escaping walks every string; a line that spells no control, DEL or bidi character in any
    # of JSON's ways (MAYBE_DIRTY) has nothing to escape.
    dirty = MAYBE_DIRTY.search(line) is not None
    if isinstance(message, Hello):
        if message.schema > SCHEMA:
            raise WireError(f"stream schema {message.schema}; this gputop reads schema "
                            f"{SCHEMA}: upgrade it")
        return escape_strings(message) if dirty else message
    if isinstance(message, StreamError):
        return StreamError(one_line(message.message))
    if len(message.findings) > MAX_FINDINGS:
        raise WireError(f"{len(message.findings)} findings in one sample (limit {MAX_FINDINGS})")
    sample = Sample(snapshot_from_wire(message.snapshot), message.findings)
    return escape_strings(sample) if dirty else sample


