"""Snapshots to and from JSON, in one place: the public ``snapshot --json`` schema.

``snapshot_to_json`` writes it (``gputop snapshot --json``, a recording's rows, a node's
stream); ``decode_snapshot`` reads one back as the fleet reads a node's sample: bounded in size
and count, typed (msgspec: a wrong type anywhere rejects it), every string escaped. Everything
read here is untrusted.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import asdict
from typing import Any

import msgspec

from gputop.core.agent_status import decode_hook
from gputop.core.format import RAW_IN_JSON, safe_text
from gputop.core.job_groups import jobs_in
from gputop.core.model import DriverInfo, GpuSample, HostSample, ProcSample, Snapshot

MAX_LINE = 1 << 20  # bytes; a 64-GPU node with 1000 processes writes ~300 KB
MAX_GPUS = 64
MAX_PROCESSES = 1024  # per GPU, and training processes outside the GPUs
MAX_WORKERS = 1024  # per process


# Fields written to JSON only when set, so the schema of a plain host stays as it was.
_OPTIONAL_PROC = ("agent", "ns_pid", "host_pid", "owner", "gpu_instance", "compute_instance",
                  "hidden", "efficiency", "uid", "compiled", "cpu_wait")


def _proc_to_json(proc: ProcSample) -> dict[str, Any]:
    data = asdict(proc)
    data["workers"] = [asdict(w) for w in proc.workers]
    if proc.agent is not None:
        data["agent"] = proc.agent.to_dict()
    for key in _OPTIONAL_PROC:
        if data.get(key) is None:
            data.pop(key, None)
    if proc.owner is not None:
        data["owner"] = {k: v for k, v in data["owner"].items() if v is not None}
    return data


def snapshot_to_json(snap: Snapshot) -> dict[str, Any]:
    """The public ``snapshot --json`` schema: plain dicts, lists and scalars."""
    gpus = []
    for gpu in snap.gpus:
        data = asdict(gpu)
        data["clock_events"] = list(gpu.clock_events)
        data["processes"] = [_proc_to_json(p) for p in gpu.processes]
        if gpu.mig_mode is None:  # a GPU without MIG: the schema as before
            data.pop("mig_mode")
            data.pop("mig")
        else:
            data["mig"] = [{**asdict(m), "pids": list(m.pids)} for m in gpu.mig]
        gpus.append(data)
    host = asdict(snap.host)
    host["cpu_per_core"] = list(snap.host.cpu_per_core)
    # The CPU's pressure and its other users, only where read (a plain host's schema as before).
    if host["cpu_pressure"] is None:
        del host["cpu_pressure"]
    if snap.host.cpu_users:
        host["cpu_users"] = list(host["cpu_users"])
    else:
        del host["cpu_users"]
    return {
        "time": snap.time,
        "host": host,
        "driver": asdict(snap.driver),
        "gpus": gpus,
        "processes": [_proc_to_json(p) for p in snap.other_processes],
        "jobs": [job.to_json() for job in jobs_in(snap)],
    }


# -- the reader's side ------------------------------------------------------------------------


class WireError(ValueError):
    """A line that is not valid schema-1 stream output; the message is one escaped line."""

# What safe_text would change, as it can appear in a JSON line: JSON's short escapes of
# controls (\b \f \n \r \t), a \u escape of a C0 or C1 control, DEL, U+200E/F, U+202A-E
# or U+2066-9, or those characters raw in UTF-8. That is every way JSON can spell them:
# msgspec refuses raw C0 controls in strings, lone surrogates and invalid UTF-8 by itself.
# A false alarm (an escaped backslash before an "n") only costs the walk.
MAYBE_DIRTY = re.compile(
    rb"\\[bfnrt]|\\u(?:00[01]|007[fF]|00[89]|200[eEfF]|202[a-eA-E]|206[6-9])|"
    + RAW_IN_JSON.pattern)
class WireSnapshot(msgspec.Struct, frozen=True):
    time: float
    host: HostSample
    driver: DriverInfo
    gpus: tuple[GpuSample, ...] = ()
    processes: tuple[ProcSample, ...] = ()


_snapshot_decoder = msgspec.json.Decoder(WireSnapshot, dec_hook=decode_hook)


def decode_bounded(decoder: msgspec.json.Decoder, data: bytes, what: str) -> Any:
    """``data`` decoded, bounded in size; any failure is a one-line ``WireError``."""
    if len(data) > MAX_LINE:
        raise WireError(f"{what} of {len(data)} bytes (limit {MAX_LINE})")
    try:
        return decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise WireError(f"invalid {what}: {_one_line(exc)}") from None
    except msgspec.DecodeError as exc:
        raise WireError(f"not JSON: {_one_line(exc)}") from None


def decode_snapshot(data: bytes) -> Snapshot:
    """One ``snapshot --json`` object (a recording's ``_snapshots`` row, say) decoded into the
    model as a stream's sample is: bounded, typed, escaped. Raises ``WireError``."""
    snap = snapshot_from_wire(decode_bounded(_snapshot_decoder, data, "snapshot"))
    return escape_strings(snap) if MAYBE_DIRTY.search(data) is not None else snap


def snapshot_from_wire(wire: WireSnapshot) -> Snapshot:
    _check_bounds(wire)
    # A node's (or a recording's) agents went through the same check as a local agent's reply
    # while they were decoded (``decode_hook``): out-of-range values dropped, named in
    # ``rejected``.
    return Snapshot(time=wire.time, host=wire.host, driver=wire.driver, gpus=wire.gpus,
                    other_processes=wire.processes)


def _check_bounds(snap: WireSnapshot) -> None:
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


def escape_strings(value: Any) -> Any:
    """``value`` with every string in it escaped (dataclasses, structs, tuples, dicts)."""
    if isinstance(value, str):
        return safe_text(value)
    if isinstance(value, tuple):
        return tuple(escape_strings(v) for v in value)
    if isinstance(value, list):
        return [escape_strings(v) for v in value]
    if isinstance(value, dict):
        return {escape_strings(k): escape_strings(v) for k, v in value.items()}
    if isinstance(value, msgspec.Struct):
        changes = {name: escape_strings(getattr(value, name)) for name in value.__struct_fields__}
        return msgspec.structs.replace(value, **changes)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {f.name: escape_strings(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return dataclasses.replace(value, **changes)
    return value
