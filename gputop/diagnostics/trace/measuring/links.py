"""The host link of a GPU named in a trace: what a host-device copy can reach per direction.

A trace names the GPU (``deviceProperties``) but not its link, so the link is taken from the
GPU's published specification (its datasheet's host interface, ``gputop.core.pcie.BOARDS``) and its
capacity derived from the PCIe generation and width (``gputop.core.pcie``: Gen5 x16 = 63.0 GB/s each
way). This is the GPU's own maximum: a slower slot, a riser or a switch can lower it
(``nvidia-smi -q`` shows the negotiated generation and width). A GPU that is not listed gets no
link figure.
"""

from __future__ import annotations

from typing import NamedTuple

from gputop.core.pcie import LANE, board_link, encoding, pcie_gb_per_s


class Link(NamedTuple):
    name: str  # "PCIe Gen5 x16"
    gb_per_s: float  # per direction, GB = 1e9 bytes
    basis: str  # how the figure was derived


def host_link(device_name: str | None) -> Link | None:
    """The host link of the GPU named ``device_name`` (a trace's deviceProperties name), or
    None when the name is not a GPU listed in ``gputop.core.pcie.BOARDS``."""
    board = board_link(device_name)
    if board is None:
        return None
    if board.kind == "c2c":
        return Link("NVLink-C2C", 450.0,
                    "NVLink-C2C to the Grace CPU, 900 GB/s both directions (GH200 datasheet)")
    gb = pcie_gb_per_s(board.gen, board.width)
    rate = LANE[board.gen][0]
    return Link(f"PCIe Gen{board.gen} x{board.width}", round(gb, 2),
                f"{rate:g} GT/s x {board.width} lanes, {encoding(board.gen)} encoding = "
                f"{gb:.1f} GB/s per direction (the GPU's datasheet link; a slower slot lowers it)")
