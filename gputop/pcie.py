"""PCIe links: what a generation and width carry, and the host link of known boards.

Capacity per lane and direction, from the PCIe base specifications: generations 1 and 2 signal
2.5 and 5 GT/s with 8b/10b coding (0.25 and 0.5 GB/s), generations 3, 4 and 5 signal 8, 16 and
32 GT/s with 128b/130b coding (0.985, 1.969, 3.938 GB/s), generation 6 64 GT/s in FLIT mode
(~7.56 GB/s). NVML's PCIe throughput counters are per direction, like these figures. The live
rules read it (``diagnostics.live.links``), and so does the simulated driver, so that a demo's
link saturates where a real one would.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GBS_PER_LANE = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}


@dataclass(frozen=True)
class BoardLink:
    pattern: str  # matched against NVML's device name, as a whole word
    gen: int
    width: int
    source: str


# Boards whose datasheet gives the host link. Order matters only where names overlap (the
# patterns are whole words, so "A10" does not match "A100").
BOARDS: tuple[BoardLink, ...] = (
    BoardLink("H200", 5, 16, "NVIDIA H200 Tensor Core GPU datasheet: PCIe Gen5 128 GB/s "
              "(x16, both directions); nvidia.com/en-us/data-center/h200"),
    BoardLink("H100", 5, 16, "NVIDIA H100 Tensor Core GPU datasheet: PCIe Gen5 128 GB/s "
              "(x16, both directions); nvidia.com/en-us/data-center/h100"),
    BoardLink("H800", 5, 16, "NVIDIA H800 PCIe datasheet: PCIe Gen5 x16"),
    BoardLink("A100", 4, 16, "NVIDIA A100 Tensor Core GPU datasheet: PCIe Gen4 64 GB/s "
              "(x16, both directions); nvidia.com/en-us/data-center/a100"),
    BoardLink("A800", 4, 16, "NVIDIA A800 datasheet: PCIe Gen4 x16"),
    BoardLink("A40", 4, 16, "NVIDIA A40 datasheet: PCI Express Gen4 x16, 64 GB/s both "
              "directions; nvidia.com/en-us/data-center/a40"),
    BoardLink("A30", 4, 16, "NVIDIA A30 datasheet: PCIe Gen4 64 GB/s; "
              "nvidia.com/en-us/data-center/products/a30-gpu"),
    BoardLink("A10", 4, 16, "NVIDIA A10 datasheet: PCIe Gen4 64 GB/s; "
              "nvidia.com/en-us/data-center/products/a10-gpu"),
    BoardLink("L40S", 4, 16, "NVIDIA L40S datasheet: PCIe Gen4 x16, 64 GB/s both directions; "
              "nvidia.com/en-us/data-center/l40s"),
    BoardLink("L40", 4, 16, "NVIDIA L40 datasheet: PCIe Gen4 x16, 64 GB/s both directions; "
              "nvidia.com/en-us/data-center/l40"),
    BoardLink("L4", 4, 16, "NVIDIA L4 datasheet: PCIe Gen4 x16 64 GB/s; "
              "nvidia.com/en-us/data-center/l4"),
    BoardLink("V100", 3, 16, "NVIDIA V100 datasheet: PCIe 32 GB/s (Gen3 x16, both "
              "directions); nvidia.com/en-us/data-center/v100"),
    BoardLink("T4", 3, 16, "NVIDIA T4 datasheet: PCIe Gen3 x16; "
              "nvidia.com/en-us/data-center/tesla-t4"),
    BoardLink("K80", 3, 16, "Tesla K80 board specification (BD-07317): PCI Express Gen3 x16"),
    BoardLink("RTX 6000 Ada", 4, 16, "NVIDIA RTX 6000 Ada datasheet: PCIe Gen4 x16"),
    BoardLink("RTX A6000", 4, 16, "NVIDIA RTX A6000 datasheet: PCI Express Gen4 x16"),
    BoardLink("RTX 4090", 4, 16, "GeForce RTX 4090 specifications: PCIe Gen4 x16"),
    BoardLink("RTX 3090", 4, 16, "GeForce RTX 3090 specifications: PCIe Gen4 x16"),
)
_COMPILED = tuple((re.compile(rf"(?<![A-Za-z0-9]){re.escape(b.pattern)}(?![A-Za-z0-9])"), b)
                  for b in BOARDS)


def board_link(name: str | None) -> BoardLink | None:
    """The datasheet link of the board NVML names ``name``, if it is in the table."""
    if not name:
        return None
    for pattern, board in _COMPILED:
        if pattern.search(name):
            return board
    return None


def capacity_mbs(gen: int, width: int) -> float:
    """Theoretical MB/s per direction of a link of this generation and width."""
    return GBS_PER_LANE.get(gen, 1.0) * width * 1000
