"""What a live finding explains, on a host that may be busy: a job whose threads wait for a CPU
raises ``cpu-contention``, and the symptoms the wait inflates (``dataloader-stall``,
``host-bound``, ``gpu-idle``...) are named in its evidence as its effects, not raised beside it.
A test of a live job checks the answer that follows the measured contention through these."""

from __future__ import annotations

import re

from gputop.diagnostics.live.causes import INFLATED

_EFFECTS = re.compile(r"Its effects \(inflated by the wait for a CPU, not causes\): "
                      r"(.*?)(?:\. Also held, explained by this: |$)", re.S)


def effects(event: dict) -> list[str]:
    """The effects a cpu-contention finding lists, in rank order (the first is what would be
    the GPU's cause without the wait)."""
    if event["id"] != "cpu-contention":
        return []
    found = _EFFECTS.search(event.get("evidence") or "")
    return re.findall(r"(?:^|; )([a-z-]+) \(", found.group(1)) if found else []


def explained(event: dict) -> set[str]:
    """The ids a finding (a `watch --json` line, a finding's JSON) stands for: its own, and,
    for cpu-contention, the effects it lists."""
    return {event["id"], *effects(event)}


def shows(event: dict, finding_id: str) -> bool:
    """``event`` is ``finding_id``, or cpu-contention with it as an effect, or cpu-contention
    alone where ``finding_id`` is a symptom the wait inflates: raised from the measured wait
    before that symptom held (the rules' answer follows what the kernel measured)."""
    ids = explained(event)
    return finding_id in ids or (event["id"] == "cpu-contention" and finding_id in INFLATED)


def causes(events: list[dict], expected: set[str]) -> set[str]:
    """What raised events stand for against the ``expected`` ids: cpu-contention becomes the
    expected symptoms a wait for a CPU inflates, else the first effect it lists."""
    out: set[str] = set()
    for e in events:
        listed = effects(e)
        if e["id"] != "cpu-contention":
            out.add(e["id"])
        elif expected & INFLATED:
            # The wait the kernel measured is the cause; which of the symptoms it inflates
            # showed first (a starved pipeline, the host's code) depends on the load.
            out |= expected & INFLATED
        else:
            out |= set(listed[:1]) or {"cpu-contention"}
    return out
