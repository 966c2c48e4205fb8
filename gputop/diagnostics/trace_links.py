"""The host link of a GPU, from its name: what a host-device copy can reach per direction.

A trace names the GPU (``deviceProperties``) but not its link, so the link is taken from the
GPU's published specification (its datasheet's host interface) and its capacity derived from
the PCIe generation and width:

    GB/s per direction = transfer rate (GT/s per lane) x lanes x encoding efficiency / 8 bits

with the rates and encodings of the PCI Express Base Specification: Gen1 2.5 GT/s and Gen2
5 GT/s with 8b/10b encoding, Gen3 8 GT/s, Gen4 16 GT/s and Gen5 32 GT/s with 128b/130b. So Gen5
x16 = 32 x 16 x 128/130 / 8 = 63.0 GB/s each way, Gen4 x16 = 31.5, Gen3 x16 = 15.8. Datasheets
quote the raw figure for both directions together ("PCIe Gen5: 128 GB/s"); 128/2 = 64 GB/s a
direction before encoding, 63.0 after it. Packet headers take a few percent more (a 256-byte
payload travels with about 24 bytes of framing, header and CRC), so a copy reaches at most about
90 % of this figure.

This is the GPU's own maximum: a slower slot, a riser or a switch can lower it (``nvidia-smi -q``
shows the negotiated generation and width). A GPU that is not listed gets no link figure.
"""

from __future__ import annotations

import re
from typing import NamedTuple

# Per lane: (GT/s, encoding efficiency), PCI Express Base Specification.
PCIE_LANE = {
    1: (2.5, 8 / 10),
    2: (5.0, 8 / 10),
    3: (8.0, 128 / 130),
    4: (16.0, 128 / 130),
    5: (32.0, 128 / 130),
}


class Link(NamedTuple):
    name: str  # "PCIe Gen5 x16"
    gb_per_s: float  # per direction, GB = 1e9 bytes
    basis: str  # how the figure was derived


def pcie_gb_per_s(gen: int, lanes: int) -> float:
    rate, efficiency = PCIE_LANE[gen]
    return rate * lanes * efficiency / 8


# GPU name pattern -> host link, from each product's datasheet (host interface line). Most
# specific first: "H100" must not catch "GH100"-based Grace Hopper, whose host link is not PCIe.
_GPU_LINKS: tuple[tuple[re.Pattern, str, int, int], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), kind, gen, lanes)
    for pattern, kind, gen, lanes in (
        # Grace Hopper: NVLink-C2C, 900 GB/s both directions together (GH200 datasheet).
        (r"\bGH200\b", "c2c", 0, 0),
        # Hopper: PCIe Gen5 x16 (H100 SXM5/PCIe/NVL, H200, H800, H20 datasheets).
        (r"\bH(100|200|800|20)\b", "pcie", 5, 16),
        # Blackwell workstation cards: PCIe Gen5 x16.
        (r"RTX (PRO )?5090|RTX PRO 6000", "pcie", 5, 16),
        # Ampere and Ada data-centre and workstation cards: PCIe Gen4 x16.
        (r"\bA(100|800|30|40|10G?)\b|\bL40S?\b|\bL4\b|RTX A[4-6]000|RTX 6000 Ada"
         r"|RTX (30[89]0|40[89]0)", "pcie", 4, 16),
        (r"\bA2\b", "pcie", 4, 8),
        # Volta, Turing, Pascal: PCIe Gen3 x16.
        (r"V100|\bT4\b|P100|GP100|RTX 2080|TITAN (RTX|V)|Quadro RTX|P40\b", "pcie", 3, 16),
        # AMD Instinct: MI300X/MI300A/MI325X PCIe Gen5 x16, MI250/MI250X/MI210/MI100 Gen4 x16
        # (AMD datasheets: "PCIe Gen 5 x16, 128 GB/s", "PCIe Gen 4 x16, 64 GB/s").
        (r"MI3[02]\d", "pcie", 5, 16),
        (r"MI2[15]0|MI100|MI50|MI60", "pcie", 4, 16),
    )
)


def host_link(device_name: str | None) -> Link | None:
    """The host link of the GPU named ``device_name`` (a trace's deviceProperties name), or
    None when the name is not a GPU listed above."""
    if not device_name:
        return None
    for pattern, kind, gen, lanes in _GPU_LINKS:
        if not pattern.search(device_name):
            continue
        if kind == "c2c":
            return Link("NVLink-C2C", 450.0,
                        "NVLink-C2C to the Grace CPU, 900 GB/s both directions (GH200 datasheet)")
        gb = pcie_gb_per_s(gen, lanes)
        rate, efficiency = PCIE_LANE[gen]
        encoding = "8b/10b" if efficiency < 0.9 else "128b/130b"
        return Link(f"PCIe Gen{gen} x{lanes}", round(gb, 2),
                    f"{rate:g} GT/s x {lanes} lanes, {encoding} encoding = {gb:.1f} GB/s per "
                    "direction (the GPU's datasheet link; a slower slot lowers it)")
    return None
