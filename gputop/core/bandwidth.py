"""Peak memory (DRAM/HBM) bandwidth of data-center GPUs, from the datasheets, and from NVML.

The roofline's memory roof: what the GPU's memory can deliver per second. A trace names its GPU
(``deviceProperties``) and the figure is the datasheet's; on a live GPU NVML gives it too, as
the maximum memory clock x the bus width x 2 (HBM and GDDR6 move data on both clock edges;
NVML's memory clock is the one those transfers run at): an H100 SXM reports 2619 MHz and 5120
bits, 3.35 TB/s, its datasheet's figure. Names are matched as ``gputop.core.peaks`` matches them,
most specific first.
"""

from __future__ import annotations

from dataclasses import dataclass

from gputop.core.boards import BoardTable


@dataclass(frozen=True)
class MemoryBoard:
    name: str
    pattern: str
    gb_per_s: float  # GB = 1e9 bytes
    source: str


_NV = "NVIDIA {} datasheet"
BOARDS: tuple[MemoryBoard, ...] = (
    MemoryBoard("V100S PCIe", r"\bV100S\b", 1134.0, _NV.format("V100S")),
    MemoryBoard("V100", r"\bV100\b", 900.0, _NV.format("Tesla V100") + " (SXM2, PCIe, DGXS)"),
    MemoryBoard("T4", r"\bT4\b", 320.0, _NV.format("T4")),
    MemoryBoard("A100 80GB PCIe", r"\bA100\b.*\bPCIe\b.*80|\bA100 80GB PCIe\b", 1935.0,
                _NV.format("A100") + " (80GB PCIe)"),
    MemoryBoard("A100 80GB SXM", r"\bA100\b.*80GB|\bA100-SXM4-80GB\b|\bPG509-210\b", 2039.0,
                _NV.format("A100") + " (80GB SXM)"),
    MemoryBoard("A100 40GB", r"\bA100\b", 1555.0, _NV.format("A100") + " (40GB SXM and PCIe)"),
    MemoryBoard("A10", r"\bA10\b", 600.0, _NV.format("A10")),
    MemoryBoard("A30", r"\bA30\b", 933.0, _NV.format("A30")),
    MemoryBoard("A40", r"\bA40\b", 696.0, _NV.format("A40")),
    MemoryBoard("L4", r"\bL4\b", 300.0, _NV.format("L4")),
    MemoryBoard("L40S", r"\bL40S\b", 864.0, _NV.format("L40S")),
    MemoryBoard("L40", r"\bL40\b", 864.0, _NV.format("L40")),
    MemoryBoard("H100 NVL", r"\bH100 NVL\b", 3900.0, _NV.format("H100") + " (H100 NVL)"),
    MemoryBoard("H100 PCIe", r"\bH100 PCIe\b", 2000.0, _NV.format("H100") + " (H100 PCIe)"),
    MemoryBoard("H100 SXM", r"\bH100\b", 3350.0, _NV.format("H100") + " (H100 SXM)"),
    MemoryBoard("H200 NVL", r"\bH200 NVL\b", 4800.0, _NV.format("H200") + " (H200 NVL)"),
    MemoryBoard("H200 SXM", r"\bH200\b", 4800.0, _NV.format("H200") + " (H200 SXM)"),
    MemoryBoard("GH200", r"\bGH200\b", 4000.0,
                "NVIDIA GH200 Grace Hopper Superchip datasheet (96GB HBM3; 4.9 TB/s with "
                "144GB HBM3e)"),
    MemoryBoard("B200", r"\bB200\b", 8000.0, "NVIDIA HGX B200 specifications, per GPU"),
    MemoryBoard("MI210", r"\bMI210\b", 1638.4, "AMD Instinct MI210 accelerator brochure"),
    MemoryBoard("MI250X", r"\bMI250X\b", 3276.8, "AMD Instinct MI200 series datasheet (MI250X)"),
    MemoryBoard("MI250", r"\bMI250\b", 3276.8, "AMD Instinct MI200 series datasheet (MI250)"),
    MemoryBoard("MI300A", r"\bMI300A\b", 5300.0, "AMD Instinct MI300A APU datasheet"),
    MemoryBoard("MI300X", r"\bMI300X\b", 5300.0, "AMD Instinct MI300X accelerator datasheet"),
)
_TABLE = BoardTable(BOARDS)


@dataclass(frozen=True)
class Bandwidth:
    bytes_per_s: float
    source: str


def datasheet_bandwidth(device_name: str | None, total_memory: int | None = None
                        ) -> Bandwidth | None:
    """The datasheet's peak memory bandwidth of ``device_name``, or None for a board not
    listed. ``total_memory`` (bytes, as a trace's deviceProperties record it) tells an A100
    of 80 GB, whose name does not always say so (``A100-PG509-200``), from one of 40."""
    board = _TABLE.lookup(device_name)
    if board is None:
        return None
    if board.name == "A100 40GB" and total_memory and total_memory > 60 * 1024**3:
        board = next(b for b in BOARDS if b.name == "A100 80GB SXM")
    return Bandwidth(board.gb_per_s * 1e9, f"{board.source} ({board.name}: "
                     f"{board.gb_per_s / 1e3:g} TB/s)")


def nvml_bandwidth(max_mem_clock_mhz: float | None, bus_width_bits: float | None
                   ) -> Bandwidth | None:
    """Peak bandwidth from NVML's maximum memory clock and memory bus width."""
    if not max_mem_clock_mhz or not bus_width_bits or max_mem_clock_mhz <= 0 \
            or bus_width_bits <= 0:
        return None
    bps = max_mem_clock_mhz * 1e6 * 2 * bus_width_bits / 8
    return Bandwidth(bps, f"NVML: max memory clock {max_mem_clock_mhz:g} MHz x "
                     f"{bus_width_bits:g}-bit bus x 2 transfers per clock = "
                     f"{bps / 1e12:.2f} TB/s")
