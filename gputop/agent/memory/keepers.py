"""What keeps a growing allocation alive, where Python can see it: the tensor whose storage
it is, the container that holds the tensor, and the name that container goes by (a global of
a module, an attribute of an object, a local of a running function).

Run on the agent's analysis thread after a memory capture, for the few lines that grew. It
costs two scans of the objects the garbage collector tracks (``gc.get_objects`` to find the
tensors by storage address, ``gc.get_referrers`` for what refers to them), each a single C call
that holds the interpreter lock: it is skipped on a heap of more than ``MAX_OBJECTS`` objects
and says so. A tensor no Python object refers to is held from C++ (an autograd graph kept by a
tensor that requires grad, a C++ cache): said as such.

Training process side: standard library only; torch comes in as the module object.
"""

from __future__ import annotations

import gc
import sys
import types
from typing import Any

MAX_OBJECTS = 3_000_000  # tracked objects beyond which nothing is looked for
MAX_TEXT = 200


def _name_in(mapping: dict, target: Any) -> str | None:
    for key, value in mapping.items():
        if value is target:
            return str(key)[:60]
    return None


def _module_of(globals_dict: dict) -> str | None:
    for module in list(sys.modules.values()):
        if getattr(module, "__dict__", None) is globals_dict:
            name = getattr(module, "__file__", None) or getattr(module, "__name__", "?")
            return str(name).rsplit("/", 1)[-1]
    return None


def _ours(ref: Any, ignore: set[int]) -> bool:
    """The lists and frames of this search itself."""
    return id(ref) in ignore or (isinstance(ref, types.FrameType)
                                 and ref.f_code.co_filename == __file__)


def _local(frame: types.FrameType, value: Any, where: bool) -> str:
    """``value`` as a local of a running function (with its file and line when ``where``)."""
    code = frame.f_code
    name = _name_in(frame.f_locals, value) or "?"
    place = f" ({code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno})" if where else ""
    return f"local `{name}` of {code.co_name}{place}"


def _holder(container: Any, ignore: set[int]) -> str | None:
    """Who holds ``container`` under which name: a module's global, an object's attribute,
    a function's local."""
    for ref in gc.get_referrers(container):
        if _ours(ref, ignore):
            continue
        if isinstance(ref, types.FrameType):
            return _local(ref, container, where=True)
        if isinstance(ref, dict):
            name = _name_in(ref, container)
            if name is None:
                continue
            module = _module_of(ref)
            if module is not None:
                return f"global `{name}` of {module}"
            for owner in gc.get_referrers(ref):
                if getattr(owner, "__dict__", None) is ref:
                    return f"attribute `{name}` of a {type(owner).__name__} object"
            return f"key `{name}` of a dict"
    return None


def _describe(tensor: Any, ignore: set[int]) -> str:
    """The best answer among what refers to ``tensor``: a named container or attribute, else
    an unnamed container, else C++."""
    unnamed = None
    for ref in gc.get_referrers(tensor):
        if _ours(ref, ignore):
            continue
        if isinstance(ref, types.FrameType):
            return _local(ref, tensor, where=False)
        if isinstance(ref, (list, tuple, set, frozenset, dict)) or type(ref).__name__ == "deque":
            held = _holder(ref, ignore | {id(ref)})
            what = f"a {type(ref).__name__} of {len(ref)}"
            if held is not None:
                return f"{what}, {held}"
            unnamed = unnamed or what
            continue
        if hasattr(ref, "__dict__"):
            name = _name_in(vars(ref), tensor)
            if name:
                return f"attribute `{name}` of a {type(ref).__name__} object"
    if unnamed is not None:
        return unnamed
    return ("no Python object refers to it: held from C++ (e.g. the autograd graph of a "
            "tensor that requires grad, kept without .detach() or .item())")


def find_keepers(torch: Any, addresses: dict[int, int]) -> tuple[dict[int, str], str | None]:
    """``{site: what keeps it}`` for ``{site: storage address}``, and why nothing was looked
    for (None when it was)."""
    if not addresses:
        return {}, None
    objects = gc.get_objects()
    try:
        if len(objects) > MAX_OBJECTS:
            return {}, (f"what keeps them was not looked for: {len(objects):,} Python objects "
                        f"(over {MAX_OBJECTS:,})")
        tensor_type = torch.Tensor
        wanted = {addr: site for site, addr in addresses.items()}
        found: dict[int, Any] = {}
        for obj in objects:
            # type(), not isinstance: isinstance asks a lazy module for its __class__, and
            # some (torch.distributed's deprecated names) warn into the job's stderr.
            if not issubclass(type(obj), tensor_type):
                continue
            try:
                addr = obj.untyped_storage().data_ptr()
            except Exception:
                continue
            site = wanted.get(addr)
            if site is not None and site not in found:
                found[site] = obj
                if len(found) == len(wanted):
                    break
    finally:
        ignore = {id(objects)}
        objects = None
    ignore.add(id(found))
    out = {}
    for site in list(found):  # not items(): each (site, tensor) pair would refer to it too
        try:
            out[site] = _describe(found[site], ignore)[:MAX_TEXT]
        except Exception as exc:
            out[site] = f"not found: {type(exc).__name__}"
    return out, None


CENSUS_BUDGET_S = 2.0
CENSUS_MIN_BYTES = 1 << 20  # containers holding less than this are not listed
CENSUS_TOP = 8
_CONTAINERS = (list, tuple, dict, set, frozenset)


def _storage_of(value: Any, device: str) -> tuple[int, int] | None:
    try:
        if str(value.device) != device:
            return None
        storage = value.untyped_storage()
        return storage.data_ptr(), storage.nbytes()
    except Exception:
        return None


def census(torch: Any, device: str, budget_s: float = CENSUS_BUDGET_S) -> dict[str, Any]:
    """Which Python containers hold the most tensor memory on ``device`` (for an OOM report:
    what held the memory), and all the tensor memory Python can see there. Bounded by
    ``MAX_OBJECTS`` and a time budget, said in ``"cut"``."""
    import time

    objects = gc.get_objects()
    if len(objects) > MAX_OBJECTS:
        return {"cut": f"not counted: {len(objects):,} Python objects (over {MAX_OBJECTS:,})"}
    deadline = time.monotonic() + budget_s
    tensor_type = torch.Tensor
    seen: dict[int, int] = {}
    held: list[tuple[int, int, Any]] = []
    cut = None
    try:
        for number, obj in enumerate(objects):
            if number & 1023 == 0 and time.monotonic() > deadline:
                cut = f"counted {number:,} of {len(objects):,} objects in {budget_s:g} s"
                break
            kind = type(obj)
            if issubclass(kind, tensor_type):
                found = _storage_of(obj, device)
                if found is not None:
                    seen[found[0]] = found[1]
                continue
            if kind not in _CONTAINERS and kind.__name__ != "deque":
                continue
            values = obj.values() if kind is dict else obj
            mine: dict[int, int] = {}
            for value in values:
                if issubclass(type(value), tensor_type):
                    found = _storage_of(value, device)
                    if found is not None:
                        mine[found[0]] = found[1]
            total = sum(mine.values())
            if total >= CENSUS_MIN_BYTES:
                held.append((total, len(mine), obj))
    finally:
        ignore = {id(objects), id(held)}
        objects = None
    held.sort(key=lambda x: -x[0])
    out = []
    for total, count, obj in held[:CENSUS_TOP]:
        try:
            name = _holder(obj, ignore | {id(obj)})
        except Exception:
            name = None
        what = f"a {type(obj).__name__} of {count} tensor{'s' if count != 1 else ''}"
        out.append({"what": (f"{what}, {name}" if name else what)[:MAX_TEXT], "bytes": total,
                    "tensors": count})
    held = None
    return {"held_by": out, "tensor_bytes": sum(seen.values()), "tensors": len(seen),
            "cut": cut}
