"""How many ranks a job has, as its dumps (and the environment, live) agree: the bound on every
rank number the attribution believes.

A rank number comes from a file name or another user's environment: untrusted. The world size
is what the dumps state (the default group's rank list, NCCL writes it), else the environment's
``WORLD_SIZE`` (live), else the dumps' own rank numbers when they are dense enough to be one
job's. A dump whose rank is past the agreed size is set aside with a note; ranks without a dump
are counted, and only a few are listed.

Pure: no torch, no textual.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gputop.diagnostics.hang.dumps import FrDump

MAX_WORLD = 1 << 17  # ranks of the largest job believed (131072)
LISTED = 16  # missing ranks listed by number; the rest are counted


@dataclass(frozen=True)
class World:
    size: int | None  # None: not stated, and the rank numbers are too sparse to imply one
    dumps: dict[int, FrDump]  # the dumps believed (rank < size)
    missing: frozenset[int]  # ranks known to exist without a dump (empty when size is None)
    notes: tuple[str, ...] = ()

    def listed_missing(self) -> tuple[int, ...]:
        return tuple(sorted(self.missing)[:LISTED])


def _stated(dumps: Mapping[int, FrDump]) -> int | None:
    sizes = [len(cfg["ranks"]) for d in dumps.values() for pg, cfg in d.pg_config.items()
             # gloo keys its one entry, the world's, by ""
             if (pg in ("0", "") or cfg.get("desc") == "default_pg") and cfg.get("ranks")]
    return max(sizes) if sizes else None


def agree(dumps: Mapping[int, FrDump], world_size: int | None = None) -> World:
    """The world the dumps and ``world_size`` (the environment's, live) agree on."""
    notes: list[str] = []
    stated = _stated(dumps)
    size = stated or (world_size if world_size and 0 < world_size <= MAX_WORLD else None)
    if size is None and dumps:
        implied = max(dumps) + 1
        # One node's dumps of a larger job leave gaps; a rank number far past the count of
        # dumps is a stray file name, not a world.
        if implied <= MAX_WORLD and implied <= 4 * len(dumps) + 64:
            size = implied
        else:
            notes.append(f"rank numbers up to {max(dumps)} from {len(dumps)} dump(s) and no "
                         "world size stated: ranks without a dump are not inferred")
    size = min(size, MAX_WORLD) if size else size
    kept = dict(dumps)
    if size is not None:
        past = sorted(r for r in dumps if r >= size)
        for r in past:
            del kept[r]
        if past:
            notes.append(f"{len(past)} dump(s) with a rank past the job's world size ({size}) "
                         f"set aside: {', '.join(dumps[r].name for r in past[:4])}"
                         + (" ..." if len(past) > 4 else ""))
    missing: set[int] = set()
    if size is not None:
        missing = set(range(size)) - set(kept)
        for d in kept.values():
            for cfg in d.pg_config.values():
                missing.update(r for r in cfg.get("ranks") or () if r < size and r not in kept)
    return World(size=size, dumps=kept, missing=frozenset(missing), notes=tuple(notes))
