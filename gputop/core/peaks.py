"""Dense peak math throughput of data-center GPUs, per precision, from the vendors' datasheets.

MFU divides the FLOP/s a job achieves by the peak of the GPU it runs on for the precision its
matrix work uses. The figures are the datasheets' own, per GPU, at boost clock, **dense**:
NVIDIA's datasheets since Ampere print Tensor Core figures "with sparsity" (2:4 structured
sparsity) and state that they are half without it, so those are halved here (the halving is
named in the source); AMD's CDNA 2 (MI200) has no sparsity and CDNA 3's datasheet gives dense
and sparse side by side. ``fp32`` is the plain FP32 rate (CUDA cores on NVIDIA, where an fp32
GEMM without TF32 runs; FP32 matrix on AMD, where rocBLAS runs it on the matrix cores);
``fp64`` the FP64 Tensor Core / matrix rate where there is one.

A precision a board lacks is absent: MFU is then unknown (a V100 has no bf16); ``tf32``
falls back to ``fp32`` on a board without TF32, since PyTorch's TF32 switch then has no
effect. Names are matched on what NVML (``nvmlDeviceGetName``) and amd-smi report.
"""

from __future__ import annotations

from dataclasses import dataclass

from gputop.core.boards import BoardTable

TERA = 1e12
PRECISIONS = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8")


@dataclass(frozen=True)
class Board:
    name: str  # as we print it
    pattern: str  # regular expression matched (case-insensitive) against the device name
    tflops: dict[str, float]  # dense peak per precision, TFLOP/s (TOP/s for int8)
    source: str  # the datasheet: its title and where it is published


def _halved(note: str) -> str:
    return f"{note}; Tensor Core figures printed with sparsity, halved for dense"


_A100 = {"fp64": 19.5, "fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0, "int8": 624.0}
_H100_SXM = {"fp64": 67.0, "fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5,
             "fp8": 1979.0, "int8": 1979.0}
_H100_NVL = {"fp64": 60.0, "fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5,
             "fp8": 1670.5, "int8": 1670.5}
_HOPPER_DATASHEET = ("NVIDIA H100 Tensor Core GPU datasheet, "
                     "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-"
                     "datasheet")
_H200_DATASHEET = ("NVIDIA H200 Tensor Core GPU datasheet, "
                   "https://nvdam.widen.net/s/nb5zzzsjdf/hpc-datasheet-sc23-h200-datasheet-3002446")
_MI200_DATASHEET = ("AMD Instinct MI200 series accelerators datasheet, "
                    "https://www.amd.com/system/files/documents/amd-instinct-mi200-datasheet.pdf")

# Order matters: the first pattern that matches wins (H100 NVL before H100, A100 before A10).
BOARDS: tuple[Board, ...] = (
    Board("V100S PCIe", r"\bV100S\b", {"fp64": 8.2, "fp32": 16.4, "fp16": 130.0},
          "NVIDIA V100S datasheet, https://images.nvidia.com/content/technologies/volta/pdf/"
          "volta-v100-datasheet-update-us-1165301-r5.pdf"),
    Board("V100 PCIe", r"\bV100-PCIE\b|\bV100 PCIe\b", {"fp64": 7.0, "fp32": 14.0, "fp16": 112.0},
          "NVIDIA Tesla V100 datasheet, https://images.nvidia.com/content/technologies/volta/"
          "pdf/volta-v100-datasheet-update-us-1165301-r5.pdf"),
    Board("V100 SXM2", r"\bV100\b", {"fp64": 7.8, "fp32": 15.7, "fp16": 125.0},
          "NVIDIA Tesla V100 datasheet, https://images.nvidia.com/content/technologies/volta/"
          "pdf/volta-v100-datasheet-update-us-1165301-r5.pdf"),
    Board("T4", r"\bT4\b", {"fp32": 8.1, "fp16": 65.0, "int8": 130.0},
          "NVIDIA T4 Tensor Core GPU datasheet, https://www.nvidia.com/content/dam/en-zz/"
          "Solutions/Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf"),
    Board("A100", r"\bA100\b", _A100,
          "NVIDIA A100 Tensor Core GPU datasheet (SXM and PCIe, 40 and 80 GB), "
          "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
          "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf; dense figures as printed"),
    Board("A10", r"\bA10\b", {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0,
                              "int8": 250.0},
          "NVIDIA A10 Tensor Core GPU datasheet, https://www.nvidia.com/content/dam/en-zz/"
          "Solutions/Data-Center/a10/pdf/datasheet-new/nvidia-a10-datasheet.pdf; dense figures "
          "as printed"),
    Board("A30", r"\bA30\b", {"fp64": 10.3, "fp32": 10.3, "tf32": 82.0, "bf16": 165.0,
                              "fp16": 165.0, "int8": 330.0},
          "NVIDIA A30 Tensor Core GPU datasheet, https://www.nvidia.com/content/dam/en-zz/"
          "Solutions/data-center/products/a30-gpu/pdf/a30-datasheet.pdf; dense figures as "
          "printed"),
    Board("A40", r"\bA40\b", {"fp32": 37.4, "tf32": 74.8, "bf16": 149.7, "fp16": 149.7,
                              "int8": 299.3},
          "NVIDIA A40 datasheet, https://images.nvidia.com/content/Solutions/data-center/a40/"
          "nvidia-a40-datasheet.pdf; dense figures as printed"),
    Board("L4", r"\bL4\b", {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0,
                            "fp8": 242.5, "int8": 242.5},
          _halved("NVIDIA L4 Tensor Core GPU datasheet, https://resources.nvidia.com/"
                  "en-us-data-center-overview/l4-gpu-datasheet")),
    Board("L40S", r"\bL40S\b", {"fp32": 91.6, "tf32": 183.0, "bf16": 362.05, "fp16": 362.05,
                                "fp8": 733.0, "int8": 733.0},
          "NVIDIA L40S GPU datasheet, https://resources.nvidia.com/en-us-l40s/"
          "l40s-datasheet-28413; dense figures as printed (the sparse ones beside them)"),
    Board("L40", r"\bL40\b", {"fp32": 90.5, "tf32": 90.5, "bf16": 181.0, "fp16": 181.0,
                              "fp8": 362.0, "int8": 362.0},
          "NVIDIA L40 GPU datasheet, https://images.nvidia.com/content/Solutions/"
          "data-center/vgpu-L40-datasheet.pdf; dense figures as printed (the sparse ones beside "
          "them)"),
    Board("H100 NVL", r"\bH100 NVL\b", _H100_NVL, _halved(_HOPPER_DATASHEET + " (H100 NVL)")),
    Board("H100 PCIe", r"\bH100 PCIe\b", {"fp64": 51.0, "fp32": 51.0, "tf32": 378.0,
                                          "bf16": 756.5, "fp16": 756.5, "fp8": 1513.0,
                                          "int8": 1513.0},
          _halved(_HOPPER_DATASHEET + " (H100 PCIe)")),
    Board("H100 SXM", r"\bH100\b", _H100_SXM, _halved(_HOPPER_DATASHEET + " (H100 SXM)")),
    Board("H200 NVL", r"\bH200 NVL\b", _H100_NVL, _halved(_H200_DATASHEET + " (H200 NVL)")),
    Board("H200 SXM", r"\bH200\b", _H100_SXM, _halved(_H200_DATASHEET + " (H200 SXM)")),
    Board("GH200", r"\bGH200\b", _H100_SXM,
          _halved("NVIDIA GH200 Grace Hopper Superchip datasheet, https://resources.nvidia.com/"
                  "en-us-grace-cpu/grace-hopper-superchip")),
    Board("B200", r"\bB200\b", {"fp64": 37.0, "fp32": 75.0, "tf32": 1100.0, "bf16": 2250.0,
                                "fp16": 2250.0, "fp8": 4500.0, "int8": 4500.0},
          _halved("NVIDIA HGX B200 specifications, per GPU, https://www.nvidia.com/en-us/"
                  "data-center/hgx/")),
    Board("MI210", r"\bMI210\b", {"fp64": 45.3, "fp32": 45.3, "bf16": 181.0, "fp16": 181.0,
                                  "int8": 181.0},
          "AMD Instinct MI210 accelerator brochure, https://www.amd.com/system/files/documents/"
          "amd-instinct-mi210-brochure.pdf; CDNA 2 has no sparsity"),
    Board("MI250X", r"\bMI250X\b", {"fp64": 95.7, "fp32": 95.7, "bf16": 383.0, "fp16": 383.0,
                                    "int8": 383.0},
          _MI200_DATASHEET + " (MI250X); CDNA 2 has no sparsity"),
    Board("MI250", r"\bMI250\b", {"fp64": 90.5, "fp32": 90.5, "bf16": 362.1, "fp16": 362.1,
                                  "int8": 362.1},
          _MI200_DATASHEET + " (MI250); CDNA 2 has no sparsity"),
    Board("MI300A", r"\bMI300A\b", {"fp64": 122.6, "fp32": 122.6, "tf32": 490.3, "bf16": 980.6,
                                    "fp16": 980.6, "fp8": 1961.2, "int8": 1961.2},
          "AMD Instinct MI300A APU datasheet, https://www.amd.com/content/dam/amd/en/documents/"
          "instinct-tech-docs/data-sheets/amd-instinct-mi300a-data-sheet.pdf; dense column"),
    Board("MI300X", r"\bMI300X\b", {"fp64": 163.4, "fp32": 163.4, "tf32": 653.7,
                                    "bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9,
                                    "int8": 2614.9},
          "AMD Instinct MI300X accelerator datasheet, https://www.amd.com/content/dam/amd/en/"
          "documents/instinct-tech-docs/data-sheets/amd-instinct-mi300x-data-sheet.pdf; dense "
          "column"),
)
_TABLE = BoardTable(BOARDS)


@dataclass(frozen=True)
class Peak:
    board: str
    precision: str  # the table's key used (tf32 may fall back to fp32)
    flops: float  # FLOP/s
    source: str


def board_of(device_name: str | None) -> Board | None:
    """The table's entry for a device name, or None for a board it does not list."""
    return _TABLE.lookup(device_name)


def peak_for(device_name: str | None, precision: str | None) -> Peak | None:
    """The dense peak of ``device_name`` for ``precision``, or None when either is unknown."""
    board = board_of(device_name)
    if board is None or precision is None:
        return None
    key = precision
    if key == "tf32" and key not in board.tflops:
        key = "fp32"  # no TF32 on this board: torch's TF32 switch leaves fp32 GEMMs in fp32
    tflops = board.tflops.get(key)
    if tflops is None:
        return None
    return Peak(board.name, key, tflops * TERA, board.source)
