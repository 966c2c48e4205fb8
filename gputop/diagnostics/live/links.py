"""The PCIe link of a GPU over a window, and what it can carry.

The driver reports the link's generation and width (``nvmlDeviceGetMaxPcieLinkGeneration`` /
``...Width``: the most the device *and the system* allow). Where a sample lacks them (an older
driver, a recording made before gputop stored them) the board's own link is taken from its
NVIDIA datasheet, by the model name NVML gives (``gputop.core.pcie.BOARDS``, each with its source).
"""

from __future__ import annotations

from dataclasses import dataclass

from gputop.core.model import GpuSample
from gputop.core.pcie import LANE, board_link, capacity_mbs


@dataclass(frozen=True)
class Link:
    gen: int
    width: int
    source: str  # "driver" or the datasheet entry

    @property
    def capacity_mbs(self) -> float:
        """Theoretical MB/s per direction."""
        return capacity_mbs(self.gen, self.width)

    @property
    def name(self) -> str:
        return f"Gen{self.gen} x{self.width}"


def gpu_link(samples: list[GpuSample]) -> Link | None:
    """The link of a GPU over a window: the driver's figures where any sample has them (the
    maximum the device and system allow; the current one drops while idle), else the board's
    datasheet, else None."""
    gen = max((g.pcie_gen_max or g.pcie_gen or 0 for g in samples), default=0)
    width = max((g.pcie_width_max or g.pcie_width or 0 for g in samples), default=0)
    if gen in LANE and width > 0:
        return Link(gen, width, "driver")
    board = board_link(samples[-1].name if samples else None)
    if board is None or board.kind != "pcie":  # NVLink-C2C (GH200): no PCIe to saturate
        return None
    return Link(board.gen, board.width, board.source)
