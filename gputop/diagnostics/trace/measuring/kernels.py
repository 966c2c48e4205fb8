"""What a GPU kernel or a runtime call is, by name.

Kernel names are the only description a trace gives of GPU work, so the classes here follow the
naming of the libraries that emit them (cuBLAS/cuBLASLt, CUTLASS 2 and 3, cuDNN, FlashAttention
2/3, Triton, Tensile/hipBLASLt, Composable Kernel, NCCL/RCCL, NVSHMEM, DeepEP, the custom
all-reduce kernels of vLLM, SGLang, TensorRT-LLM and torch symmetric memory). A name that fits
no known pattern is counted as *unknown*, never guessed.

Runtime calls are classed by what they mean for the host thread that makes them: launches (fast,
asynchronous), synchronisations and blocking copies (the host waits for the device), allocator
calls (cudaMalloc/cudaFree: the driver, and cudaFree synchronises), and start-up work (driver and
module loading, CUDA graph capture and instantiation).
"""

from __future__ import annotations

import re
from functools import lru_cache

# --- kernels ---------------------------------------------------------------------------------

# Kernels that move data between GPUs: NCCL/RCCL, MSCCL(++), NVSHMEM, DeepEP's expert-parallel
# dispatch/combine, and the one-shot/two-shot all-reduce kernels of inference engines and torch
# symmetric memory. MoE "permute"/"dispatch" kernels that only reorder tokens on one GPU are not
# here: they move nothing between GPUs.
_COMM = re.compile(
    r"^(nccl|rccl|msccl)|nccl(dev)?kernel|mscclpp|nvshmem|deep_?ep::|internode|intranode"
    r"|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|alltoallv?|cross_device_reduce"
    r"|custom_?all_?reduce|one_?shot_?all|two_?shot_?all|multimem_|allreduce_fusion"
    r"|lamport|send_?recv|sendrecv",
    re.IGNORECASE,
)
# Matrix work (what tensor cores or AMD matrix cores can run): GEMMs, convolutions, attention.
# "gemm" must not follow a letter other than a precision prefix, so fbgemm_* embedding kernels
# do not count.
_MATRIX = re.compile(
    r"(?<![a-z])(?:[shdczbiq]|\d+|fp8|e4m3|e5m2)?gemm(?!v)|scudnn|hcudnn|884cudnn"
    r"|1688cudnn|dgrad|wgrad|fprop|convolve|conv2d|conv3d|implicit_gemm|winograd|cutlass|xmma"
    r"|nvjet|wgmma|hgmma|gmma|cublaslt|matmul|Cijk_|flash_?(?:fwd|bwd|attn|attention)|flashattn"
    r"|fmha|attn_fwd|attn_bwd|_attn|attention|sdpa|mfma|xdl",
    re.IGNORECASE,
)
# Tensor-core (or matrix-core) kernels: the instruction families in the name (HMMA/IMMA tile
# shapes 884/1688/16816, wmma, mma, gmma/wgmma on Hopper, tcgen05/umma on Blackwell, MFMA and
# Tensile's MI tiles or CK's xdlops on CDNA), the libraries' tensor-core generations
# (tensorop, xmma, nvjet, cutlass3x, sm80+ kernels), reduced precisions that GEMMs only run on
# tensor cores (fp16/bf16/tf32/fp8/int8), and flash/fused attention, which is built on them.
_TENSOR_CORE = re.compile(
    r"884|1688|16816|16832|hmma|imma|wmma|(?<![a-z])mma|gmma|tcgen05|umma|tensorop|xmma|nvjet"
    r"|cutlass3x|sm(?:80|86|89|90a?|100a?|103|110|120)_|_sm(?:80|86|89|90a?|100a?|120)"
    r"|tf32|bf16|fp16|f16|half|bfloat16|e4m3|e5m2|fp8|f8f6f4|int8|i8i8|s8s8|_h\d+gemm"
    r"|MI\d+x\d+x\d+|mfma|xdl|flash_?(?:fwd|bwd|attn|attention)|flashattn|fmha|attn_fwd|attn_bwd"
    r"|sdpa",
    re.IGNORECASE,
)
# Matrix kernels known to run on the SIMT pipes in fp32/fp64: cuBLAS/cuDNN sgemm/dgemm/gemv
# kernels and cuDNN's float engines.
_SIMT = re.compile(
    r"sgemm|dgemm|cgemm|zgemm|gemv|gemmSN|gemmk1|scudnn|<float,|<double,|_f32_f32_f32_f32"
    r"|Cijk_.*_(?:S|D)_(?!.*MI\d)",
    re.IGNORECASE,
)


@lru_cache(maxsize=8192)
def kernel_class(name: str) -> tuple[bool, bool, str]:
    """(communication, matrix work, precision class) for a kernel name; the class is
    ``"tensor"``, ``"simt"`` or ``"unknown"`` for matrix kernels and ``""`` otherwise.
    Names repeat thousands of times in a trace and the patterns scan long C++ template names,
    so results are cached by name."""
    if _COMM.search(name):
        return True, False, ""
    if not _MATRIX.search(name):
        return False, False, ""
    if _TENSOR_CORE.search(name):
        return False, True, "tensor"
    if _SIMT.search(name):
        return False, True, "simt"
    return False, True, "unknown"


# --- runtime calls -----------------------------------------------------------------------------

SYNC_APIS = frozenset(
    {
        "cudaDeviceSynchronize",
        "cudaStreamSynchronize",
        "cudaEventSynchronize",
        "cuCtxSynchronize",
        "cuStreamSynchronize",
        "cuEventSynchronize",
        "hipDeviceSynchronize",
        "hipStreamSynchronize",
        "hipEventSynchronize",
    }
)
DEVICE_SYNC_APIS = frozenset({"cudaDeviceSynchronize", "cuCtxSynchronize", "hipDeviceSynchronize"})
# Synchronous allocator calls: the caching allocator goes to the driver (cudaFree also waits
# for the whole device). Stream-ordered cudaMallocAsync does not block and is not here.
ALLOC_APIS = frozenset(
    {
        "cudaMalloc",
        "cudaFree",
        "cudaMallocHost",
        "cudaFreeHost",
        "cudaHostAlloc",
        "cudaMallocManaged",
        "cuMemAlloc",
        "cuMemAlloc_v2",
        "cuMemFree",
        "cuMemFree_v2",
        "cuMemCreate",
        "cuMemMap",
        "cuMemUnmap",
        "cuMemRelease",
        "hipMalloc",
        "hipFree",
        "hipHostMalloc",
        "hipHostFree",
        "hipExtMallocWithFlags",
    }
)
LAUNCH_APIS = frozenset(
    {
        "cudaLaunchKernel",
        "cudaLaunchKernelExC",
        "cudaLaunchKernelExC_v11060",
        "cudaLaunchCooperativeKernel",
        "cuLaunchKernel",
        "cuLaunchKernelEx",
        "cuLaunchCooperativeKernel",
        "hipLaunchKernel",
        "hipExtLaunchKernel",
        "hipExtModuleLaunchKernel",
        "hipModuleLaunchKernel",
        "hipLaunchCooperativeKernel",
    }
)
GRAPH_LAUNCH_APIS = frozenset({"cudaGraphLaunch", "cuGraphLaunch", "hipGraphLaunch"})
# Start-up by name: CUDA graph capture and instantiation, module/library loading.
_STARTUP_API = re.compile(
    r"^(cuda|cu|hip)(Stream(Begin|End)Capture|GraphInstantiate|Graph(Upload|Destroy|GetNodes)"
    r"|ThreadExchangeStreamCaptureMode|Module(Load|Unload)|LibraryLoad|ModuleGetFunction"
    r"|GetFuncBySymbol|DevicePrimaryCtxRetain|CtxCreate|Init)",
)
_CAPTURE_BEGIN = re.compile(r"^(cuda|cu|hip)StreamBeginCapture")
_CAPTURE_END = re.compile(r"^(cuda|cu|hip)StreamEndCapture")
# Calls that put work on the device or wait for it; any other runtime call (stream and event
# creation, attribute queries, ...) is driver bookkeeping that takes microseconds once the
# driver is up, so a long one is start-up (context creation happens inside the first call).
_DEVICE_WORK_API = re.compile(
    r"^(cuda|cu|hip)(Memcpy|Memset|Mem(cpy|set)|Launch|GraphLaunch|Event(Record|Query)"
    r"|StreamWait|LaunchHostFunc|StreamQuery)|Synchronize"
)
# A driver call that does no device work normally takes microseconds; one that takes a
# millisecond or more is loading something (context creation, lazy module loading).
DRIVER_INIT_US = 1000.0


def is_blocking_copy_api(name: str) -> bool:
    """Synchronous copy APIs (cudaMemcpy, hipMemcpyWithStream, cuMemcpyDtoH_v2, ...): the host
    waits for the copy, unlike their ``Async`` variants."""
    return name.startswith(("cudaMemcpy", "hipMemcpy", "cuMemcpy")) and "Async" not in name


def is_startup_api(name: str, dur: float) -> bool:
    """Graph capture/instantiation, module loading, or a bookkeeping call long enough to be
    driver initialisation. Kernel launches that load their module lazily are judged by the
    caller (only when the GPU was idle meanwhile)."""
    if _STARTUP_API.match(name):
        return True
    if name in ALLOC_APIS or name in SYNC_APIS or name in LAUNCH_APIS:
        return False
    return dur >= DRIVER_INIT_US and not _DEVICE_WORK_API.search(name)


def is_capture_begin(name: str) -> bool:
    return bool(_CAPTURE_BEGIN.match(name))


def is_capture_end(name: str) -> bool:
    return bool(_CAPTURE_END.match(name))


# --- host operators and annotations --------------------------------------------------------

DATALOADER_PREFIX = "enumerate(DataLoader)#"
ITEM_OPS = frozenset({"aten::item", "aten::_local_scalar_dense"})
COLLECTIVE_PREFIXES = ("nccl:", "gloo:", "c10d::", "mpi:", "ucc:", "_c10d_functional::")
# torch.compile marks each compilation phase with a "(dynamo_timed)" record_function (dynamo
# tracing, AOT autograd, Inductor codegen, CUDA-graph recording); the compiled region's own
# per-call markers ("Torch-Compiled Region", "TorchDynamo Cache Lookup") appear in steady state
# too and are not start-up.
COMPILE_MARK = "(dynamo_timed)"
# The host-side waits of collectives when the collective runs on a CPU thread (gloo): the
# Python binding of Work.wait(), and the functional collectives' wait op.
_HOST_WAIT = re.compile(r"^<built-in method wait of pybind11|^_c10d_functional::wait_tensor$"
                        r"|^c10d::wait")


def is_host_collective_wait(name: str) -> bool:
    return bool(_HOST_WAIT.match(name))


# --- names for people and for ncu ------------------------------------------------------------


def kernel_base_name(name: str) -> str:
    """The function name ncu's ``--kernel-name`` matches (its default --kernel-name-base is the
    function name without namespace, template arguments or parameters)."""
    text = name.strip()
    if text.startswith("void "):
        text = text[5:]
    cut = len(text)
    for ch in "<(":
        i = text.find(ch)
        if i != -1:
            cut = min(cut, i)
    text = text[:cut]
    return text.rsplit("::", 1)[-1].strip() or name[:60]


def short_kernel_name(name: str, limit: int = 60) -> str:
    """Readable kernel name: namespaces kept, template arguments and parameters elided."""
    text = name.strip()
    if text.startswith("void "):
        text = text[5:]
    text = re.sub(r"\(.*$", "", text)
    out, depth = [], 0
    for ch in text:
        if ch == "<":
            if depth == 0:
                out.append("<…>")
            depth += 1
        elif ch == ">" and depth:
            depth -= 1
        elif depth == 0:
            out.append(ch)
    text = "".join(out)
    return text if len(text) <= limit else text[: limit - 1] + "…"
