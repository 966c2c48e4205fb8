"""A failed torch.compile guard in a user's words, and the names of frames dynamo made.

One copy for both sides: the agent's live view (``gputop/agent/compile_watch.py``) and the
TORCH_TRACE log reader (``gputop/diagnostics/compile_log``) say the same words, "size of `x`
dim 0 changed 32 -> 17". The patterns are bounded: a log is untrusted input.
"""

from __future__ import annotations

import re

_SIZE = re.compile(r"tensor '(?P<name>[^']{1,200})' (?P<what>size|stride) mismatch at index "
                   r"(?P<dim>\d{1,6})\. expected (?P<old>\d{1,20}), actual (?P<new>\d{1,20})")
_DTYPE = re.compile(r"tensor '(?P<name>[^']{1,200})' (?P<what>dtype|device|requires_grad|"
                    r"dispatch key set) mismatch")
_ZERO_ONE = re.compile(r"^2 <= (?P<name>[\w.\[\]'\"]{1,200}?)\.size\(\)\[(?P<dim>\d{1,6})\]")
# A Python value dynamo made a constant: "___stack0 == 1.79  # h = h / (scale + 1.0)  #
# tests/scripts/compile_jobs.py:50 in torch_dynamo_resume_in_forward_at_49"
_VALUE = re.compile(r"^(?P<name>[\w.\[\]'\"]{1,200}) == (?P<value>[-+\w.]{1,60})\s+# "
                    r"(?P<code>.{0,300}?)\s+# (?P<where>\S{1,300}:\d{1,7})")
_RESUME = re.compile(r"torch_dynamo_resume_in_(?P<name>.+)_at_(?P<line>\d+)$")
_PREFIX = re.compile(r"^\S{1,40}/\d{1,9}: ")


def clean(text: object, limit: int = 200) -> str:
    """One line of printable text, at most ``limit`` characters (names from the log)."""
    s = "" if text is None else str(text)
    s = s[: limit * 4].split("\n", 1)[0]
    return "".join(c if c.isprintable() else " " for c in s)[:limit]


def change(reason: str) -> dict[str, object]:
    """The failed guard: {"text"} in a user's words, and for a size or stride its "tensor",
    "dim", "old" and "new" values."""
    body = _PREFIX.sub("", reason, count=1)
    m = _SIZE.search(body)
    if m:
        old, new = int(m["old"]), int(m["new"])
        text = (f"{m['what']} of `{clean(m['name'], 80)}` dim {m['dim']} changed {old} -> {new}"
                + (" (a smaller batch: the last of an epoch?)"
                   if m["what"] == "size" and m["dim"] == "0" and new < old else ""))
        return {"text": text, "kind": m["what"], "tensor": clean(m["name"], 80),
                "dim": int(m["dim"]), "old": old, "new": new}
    m = _DTYPE.search(body)
    if m:
        return {"text": f"{m['what']} of `{clean(m['name'], 80)}` changed", "kind": m["what"],
                "tensor": clean(m["name"], 80)}
    m = _VALUE.search(body)
    if m:
        name = m["name"] if not m["name"].startswith("___") else "a Python value"
        return {"text": f"{clean(name, 80)} used in `{clean(m['code'].strip(), 80)}` "
                        f"({clean(m['where'].rsplit('/', 1)[-1], 80)}) was {clean(m['value'], 40)}, "
                        "a constant of the graph, and changed", "kind": "value"}
    m = _ZERO_ONE.search(body)
    if m:
        return {"text": f"size of `{clean(m['name'], 80)}` dim {m['dim']} became 0 or 1 "
                        "(specialised apart)", "kind": "size"}
    return {"text": clean(body), "kind": "other"}


def resumed(name: str) -> tuple[str, int] | None:
    """(function, line) of a resume function ("torch_dynamo_resume_in_forward_at_8" is the rest
    of ``forward`` after its graph break at line 8); None for any other name."""
    m = _RESUME.match(name)
    return (m["name"], int(m["line"])) if m else None


def root_function(name: str) -> str:
    """The user function a resume function belongs to, else the name itself."""
    found = resumed(name)
    return found[0] if found else name
