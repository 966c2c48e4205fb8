"""PCIe links: what a generation and width carry, and the host link of known boards.

One table for the live rules (``diagnostics.live.links``), the trace engine
(``diagnostics.trace_links``), the gauges and the simulated driver.

Capacity per lane and direction, from the PCI Express Base Specifications:

    GB/s per direction = transfer rate (GT/s per lane) x lanes x encoding efficiency / 8 bits

Generations 1 and 2 signal 2.5 and 5 GT/s with 8b/10b encoding; 3, 4 and 5 signal 8, 16 and
32 GT/s with 128b/130b; generation 6 signals 64 GT/s in FLIT mode (242 of every 256 bytes are
payload after FEC and CRC). So Gen5 x16 = 32 x 16 x 128/130 / 8 = 63.0 GB/s each way, Gen4 x16
31.5, Gen3 x16 15.8. Datasheets quote the raw figure for both directions together ("PCIe Gen5:
128 GB/s"). NVML's PCIe throughput counters are per direction, like these figures. Packet
headers take a few percent more, so a copy reaches at most about 90 % of the figure.
"""

from __future__ import annotations

from dataclasses import dataclass

from gputop.core.boards import BoardTable

# Per lane: (GT/s, encoding efficiency).
LANE = {
    1: (2.5, 8 / 10),
    2: (5.0, 8 / 10),
    3: (8.0, 128 / 130),
    4: (16.0, 128 / 130),
    5: (32.0, 128 / 130),
    6: (64.0, 242 / 256),
}


def lane_gb_per_s(gen: int) -> float:
    rate, efficiency = LANE[gen]
    return rate * efficiency / 8


def pcie_gb_per_s(gen: int, width: int) -> float:
    """Theoretical GB/s (1e9 bytes) per direction of a link of this generation and width."""
    return lane_gb_per_s(gen) * width


def capacity_mbs(gen: int, width: int) -> float:
    """The same in MB/s, NVML's unit; an unknown generation counts as the newest."""
    return pcie_gb_per_s(gen if gen in LANE else max(LANE), width) * 1000


def encoding(gen: int) -> str:
    return {8 / 10: "8b/10b", 128 / 130: "128b/130b"}.get(LANE[gen][1], "FLIT")


@dataclass(frozen=True)
class BoardLink:
    pattern: str  # a regular expression, matched against NVML's or the trace's device name
    gen: int  # 0 for a host link that is not PCIe (kind)
    width: int
    source: str  # the datasheet the figure comes from
    kind: str = "pcie"  # or "c2c": NVLink-C2C to a Grace CPU


# Boards whose datasheet gives the host link, most specific first ("GH200" before "H200").
BOARDS: tuple[BoardLink, ...] = (
    BoardLink(r"\bGH200\b", 0, 0, "NVIDIA GH200 Grace Hopper Superchip datasheet: NVLink-C2C "
              "900 GB/s both directions", kind="c2c"),
    BoardLink(r"\bH200\b", 5, 16, "NVIDIA H200 Tensor Core GPU datasheet: PCIe Gen5 128 GB/s "
              "(x16, both directions); nvidia.com/en-us/data-center/h200"),
    BoardLink(r"\bH100\b", 5, 16, "NVIDIA H100 Tensor Core GPU datasheet: PCIe Gen5 128 GB/s "
              "(x16, both directions); nvidia.com/en-us/data-center/h100"),
    BoardLink(r"\bH(800|20)\b", 5, 16, "NVIDIA H800 / H20 datasheets: PCIe Gen5 x16"),
    BoardLink(r"RTX (PRO )?5090|RTX PRO 6000", 5, 16, "NVIDIA RTX 5090 / RTX PRO 6000 "
              "specifications: PCIe Gen5 x16"),
    BoardLink(r"\bA100\b", 4, 16, "NVIDIA A100 Tensor Core GPU datasheet: PCIe Gen4 64 GB/s "
              "(x16, both directions); nvidia.com/en-us/data-center/a100"),
    BoardLink(r"\bA800\b", 4, 16, "NVIDIA A800 datasheet: PCIe Gen4 x16"),
    BoardLink(r"\bA40\b", 4, 16, "NVIDIA A40 datasheet: PCI Express Gen4 x16, 64 GB/s both "
              "directions; nvidia.com/en-us/data-center/a40"),
    BoardLink(r"\bA30\b", 4, 16, "NVIDIA A30 datasheet: PCIe Gen4 64 GB/s; "
              "nvidia.com/en-us/data-center/products/a30-gpu"),
    BoardLink(r"\bA10G?\b", 4, 16, "NVIDIA A10 datasheet: PCIe Gen4 64 GB/s; "
              "nvidia.com/en-us/data-center/products/a10-gpu"),
    BoardLink(r"\bA2\b", 4, 8, "NVIDIA A2 datasheet: PCIe Gen4 x8"),
    BoardLink(r"\bL40S?\b", 4, 16, "NVIDIA L40 / L40S datasheets: PCIe Gen4 x16, 64 GB/s both "
              "directions; nvidia.com/en-us/data-center/l40s"),
    BoardLink(r"\bL4\b", 4, 16, "NVIDIA L4 datasheet: PCIe Gen4 x16 64 GB/s; "
              "nvidia.com/en-us/data-center/l4"),
    BoardLink(r"RTX 6000 Ada|RTX A[4-6]000|RTX (30[89]0|40[89]0)", 4, 16,
              "NVIDIA RTX 6000 Ada / RTX A6000 datasheets, GeForce RTX 30/40 specifications: "
              "PCIe Gen4 x16"),
    BoardLink(r"V100", 3, 16, "NVIDIA V100 datasheet: PCIe 32 GB/s (Gen3 x16, both "
              "directions); nvidia.com/en-us/data-center/v100"),
    BoardLink(r"\bT4\b", 3, 16, "NVIDIA T4 datasheet: PCIe Gen3 x16; "
              "nvidia.com/en-us/data-center/tesla-t4"),
    BoardLink(r"P100|GP100|\bP40\b|RTX 2080|TITAN (RTX|V)|Quadro RTX", 3, 16,
              "NVIDIA Pascal and Turing datasheets: PCIe Gen3 x16"),
    BoardLink(r"\bK80\b", 3, 16, "Tesla K80 board specification (BD-07317): PCI Express "
              "Gen3 x16"),
    BoardLink(r"MI3[02]\d", 5, 16, "AMD Instinct MI300X / MI300A / MI325X datasheets: PCIe "
              "Gen 5 x16, 128 GB/s"),
    BoardLink(r"MI2[15]0|MI100|MI50|MI60", 4, 16, "AMD Instinct MI250 / MI210 / MI100 "
              "datasheets: PCIe Gen 4 x16, 64 GB/s"),
)
_TABLE = BoardTable(BOARDS)


def board_link(name: str | None) -> BoardLink | None:
    """The datasheet host link of the board named ``name``, if it is in the table."""
    return _TABLE.lookup(name)
