"""How the device computes in a trace: matrix work without tensor cores.
"""

from __future__ import annotations

from gputop.core.format import ms_h
from gputop.diagnostics.findings import (
    Finding,
)
from gputop.diagnostics.trace.causes.common import (
    INFO_SHARE,
    TENSOR_CORE_SAVING,
    is_amd,
    kernel_profile,
    of_what,
    percent,
    share_of,
)
from gputop.diagnostics.trace.measuring.kernels import short_kernel_name
from gputop.diagnostics.trace.measuring.metrics import TraceMetrics


def no_tensor_cores(m: TraceMetrics) -> list[Finding]:
    tc = m.values["tensor_cores"]
    if not m.gpu_present or not m.devices:
        return []
    dev = m.devices[0]
    major = dev.compute_major
    if major is None:
        return []
    # Tensor cores from compute capability 7.0 (Volta); AMD matrix cores on CDNA (gfx9, major 9).
    capable = major >= 9 if is_amd(m) else major >= 7
    if not capable:
        return []
    # When tensor cores already do most of the matrix work whose precision is known, mixed
    # precision is on and the remaining fp32 GEMMs are usually deliberate (loss, norms).
    if tc["tensor_core_share_of_matrix_pct"] >= 50.0:
        return []
    simt_ms = tc["simt_kernel_ms"]
    saving = TENSOR_CORE_SAVING * simt_ms
    share = share_of(m, saving)
    if share < INFO_SHARE:
        return []
    top = m.details.get("top_non_tensor_core_kernel")
    top_txt = f"; top: {short_kernel_name(top)}" if top else ""
    unknown = tc["unknown_kernel_ms"]
    unknown_txt = (
        f"; {ms_h(unknown)} more of matrix kernels do not say their precision" if unknown else ""
    )
    # Info only: precision is a modelling choice a trace cannot judge (fp32 may be deliberate).
    return [
        Finding(
            id="no-tensor-cores",
            severity="info",
            title=f"Matrix work runs without tensor cores on {dev.name}",
            evidence=(
                f"{ms_h(simt_ms)} of GEMM/convolution kernels run in fp32 on the SIMT units "
                f"(compute capability {tc['compute_capability']}; tensor cores do "
                f"{tc['tensor_core_share_of_matrix_pct']:.0f}% of the matrix time whose "
                f"precision the names tell){top_txt}{unknown_txt}; mixed precision would save "
                f"an estimated {ms_h(saving)} ({percent(share)} of the {of_what(m)})."
            ),
            fix=(
                "Use mixed precision: torch.autocast('cuda', dtype=torch.bfloat16) on Ampere and "
                "newer, float16 with torch.amp.GradScaler on Volta/Turing; at least allow TF32 "
                "on Ampere+ (torch.set_float32_matmul_precision('high')); keep GEMM dimensions "
                "multiples of 8."
            ),
            next_step=kernel_profile(m, top),
            cost_s=saving / 1e3,
        )
    ]
