"""What an operator must compute and move, from the shapes and dtypes the profiler recorded.

``record_shapes=True`` writes each operator's ``Input Dims`` and ``Input type`` (and, since
torch 2.1, ``Concrete Inputs``: the values of its scalar and list arguments). From them this
module gives an operator's class and, where the op's arithmetic is known, its FLOPs and the
bytes it must move at the least (each input read once, each output written once: what a
kernel that keeps nothing in cache for the next op has to move). Nothing is guessed: an op
whose shapes are not recorded, or whose formula needs a value the trace lacks (a convolution's
stride), gets ``None`` and the reason.

The formulas are the ones ``torch.utils.flop_counter`` uses for matrix work: 2*M*N*K per GEMM
(times the batch), 2 x that for a convolution's forward per output element, 4*B*H*Lq*Lk*D for
attention (causal masking not discounted), twice the forward for the backward passes. Other
classes count a few FLOPs per element (the arithmetic of the formula, a transcendental as one):
what matters for them is the bytes, since their intensity is far under any GPU's machine
balance.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

CLASSES = ("gemm", "conv", "attention", "elementwise", "norm", "softmax", "reduction",
           "embedding", "optimizer", "other")
MATRIX_CLASSES = frozenset({"gemm", "conv", "attention"})

# Bytes per element of the dtypes the profiler names in ``Input type``.
DTYPE_BYTES = {
    "double": 8, "float": 4, "c10::half": 2, "c10::bfloat16": 2, "half": 2, "bfloat16": 2,
    "long int": 8, "long": 8, "int": 4, "short int": 2, "short": 2, "signed char": 1,
    "unsigned char": 1, "bool": 1, "c10::float8_e4m3fn": 1, "c10::float8_e5m2": 1,
    "c10::float8_e4m3fnuz": 1, "c10::float8_e5m2fnuz": 1, "c10::complex<float>": 8,
    "c10::complex<double>": 16, "c10::complex<c10::half>": 4,
}
# The name a precision has in ``gputop.core.peaks``.
DTYPE_PRECISION = {"double": "fp64", "float": "fp32", "c10::half": "fp16", "half": "fp16",
                   "c10::bfloat16": "bf16", "bfloat16": "bf16", "c10::float8_e4m3fn": "fp8",
                   "c10::float8_e5m2": "fp8", "c10::float8_e4m3fnuz": "fp8",
                   "c10::float8_e5m2fnuz": "fp8", "signed char": "int8"}
DTYPE_NAME = {"double": "float64", "float": "float32", "c10::half": "float16", "half": "float16",
              "c10::bfloat16": "bfloat16", "bfloat16": "bfloat16", "long int": "int64",
              "int": "int32", "bool": "bool", "unsigned char": "uint8", "signed char": "int8",
              "c10::float8_e4m3fn": "float8_e4m3fn", "c10::float8_e5m2": "float8_e5m2"}

MAX_INPUTS, MAX_RANK, MAX_LIST = 64, 12, 4096


@dataclass(frozen=True)
class OpCost:
    flops: float | None  # per call
    bytes: float | None  # per call, at the least
    why: str | None = None  # why a figure is missing


_GEMM = {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "_scaled_mm", "mv", "addmv",
         "addbmm", "dot", "_addmm_activation"}
_CONV_FWD = {"convolution", "_convolution", "conv1d", "conv2d", "conv3d", "cudnn_convolution",
             "miopen_convolution", "mkldnn_convolution", "_nnpack_spatial_convolution",
             "cudnn_convolution_relu", "cudnn_convolution_add_relu", "_conv_depthwise2d",
             "conv_depthwise3d", "slow_conv2d_forward", "thnn_conv2d"}
_CONV_BWD = {"convolution_backward", "cudnn_convolution_backward",
             "miopen_convolution_backward"}
# cuDNN's split backward of torch < 1.10: (input size, grad_output, weight) and (weight size,
# grad_output, input); the sizes are int lists, whose values are not recorded.
_CONV_BWD_INPUT = {"cudnn_convolution_backward_input", "miopen_convolution_backward_input"}
_CONV_BWD_WEIGHT = {"cudnn_convolution_backward_weight", "miopen_convolution_backward_weight"}
_ATTN = re.compile(r"attention|^_?flash_attn|fmha|sdpa|(^|_)mha(_|$)")
_NORM = re.compile(r"(layer|batch|group|instance|rms)_?norm")
_SOFTMAX = re.compile(r"softmax")
_REDUCTION = {"sum", "mean", "max", "min", "amax", "amin", "prod", "norm", "linalg_vector_norm",
              "var", "std", "var_mean", "std_mean", "argmax", "argmin", "all", "any",
              "logsumexp", "cumsum", "nll_loss_forward", "nll_loss2d_forward", "_foreach_norm",
              "nansum", "count_nonzero", "aminmax"}
_EMBEDDING = {"embedding", "embedding_backward", "embedding_dense_backward", "embedding_bag",
              "_embedding_bag", "_embedding_bag_forward_only", "_embedding_bag_backward",
              "_embedding_bag_dense_backward", "index_select", "embedding_renorm_"}
_OPTIMIZER = re.compile(r"^_fused_(adam|adamw|sgd|adagrad)_?$|^_foreach_")
# FLOPs per output element of element-wise ops; a name not listed counts one.
_ELEMENTWISE_FLOPS = {
    "copy_": 0, "_to_copy": 0, "to": 0, "clone": 0, "contiguous": 0, "cat": 0, "fill_": 0,
    "zero_": 0, "zeros_like": 0, "ones_like": 0, "stack": 0, "index_put_": 0, "_index_put_impl_": 0,
    "gelu": 8, "gelu_backward": 12, "silu": 4, "silu_backward": 6, "sigmoid": 4,
    "sigmoid_backward": 2, "tanh": 4, "tanh_backward": 2, "native_dropout": 2,
    "native_dropout_backward": 1, "addcmul": 2, "addcdiv": 2, "lerp": 2, "softplus": 4,
    "mish": 6, "hardswish": 4, "erf": 4, "pow": 2, "rsqrt": 2, "sqrt": 2, "exp": 2, "log": 2,
}
_ELEMENTWISE = set(_ELEMENTWISE_FLOPS) | {
    "add", "sub", "rsub", "mul", "div", "neg", "abs", "relu", "threshold_backward", "hardtanh",
    "hardtanh_backward", "leaky_relu", "leaky_relu_backward", "elu", "elu_backward", "clamp",
    "clamp_min", "clamp_max", "where", "masked_fill", "masked_fill_", "eq", "ne", "lt", "gt",
    "le", "ge", "logical_and", "logical_or", "logical_not", "bitwise_and", "bitwise_or",
    "bitwise_not", "cos", "sin", "reciprocal", "maximum", "minimum", "sign", "sgn", "floor",
    "ceil", "round", "trunc", "remainder", "fmod", "bernoulli_", "uniform_", "normal_",
    "exponential_", "random_", "arange", "expm1", "log1p", "square", "sigmoid_", "relu_",
    "gelu_", "silu_", "tanh_", "mul_", "add_", "sub_", "div_", "silu_and_mul", "gelu_and_mul",
    "act_and_mul", "rotary_embedding", "apply_rotary_pos_emb",
}
_BOOL_OUT = {"eq", "ne", "lt", "gt", "le", "ge", "logical_and", "logical_or", "logical_not"}
_WRITE_ONLY = {"fill_", "zero_", "bernoulli_", "uniform_", "normal_", "exponential_",
               "random_"}


def base_name(name: str) -> str:
    """``aten::addmm`` -> ``addmm``; ``sgl_kernel::silu_and_mul`` -> ``silu_and_mul``."""
    return name.rsplit("::", 1)[-1].strip()


def op_class(name: str) -> str:
    """One of ``CLASSES`` for an operator name (ATen or a library's custom op)."""
    b = base_name(name).lower()
    plain = b.rstrip("_") if b not in _ELEMENTWISE else b
    if b in _GEMM or plain in _GEMM or b.startswith("gemm") or "_gemm" in b:
        return "gemm"
    if (b in _CONV_FWD or b in _CONV_BWD or plain in _CONV_FWD or b.startswith("conv")
            or b in _CONV_BWD_INPUT or b in _CONV_BWD_WEIGHT):
        return "conv"
    if _ATTN.search(b):
        return "attention"
    if _OPTIMIZER.search(b) and b != "_foreach_norm":
        return "optimizer"
    if _SOFTMAX.search(b):
        return "softmax"
    if _NORM.search(b):
        return "norm"
    if b in _REDUCTION or plain in _REDUCTION:
        return "reduction"
    if b in _EMBEDDING:
        return "embedding"
    if b in _ELEMENTWISE or plain in _ELEMENTWISE:
        return "elementwise"
    return "other"


# --- shapes, validated (a trace is untrusted input) ------------------------------------------


def tensor_dims(dims: object) -> tuple[int, ...] | None:
    """A tensor's recorded dims, or None for anything that is not a list of sane integers."""
    if not isinstance(dims, list) or len(dims) > MAX_RANK:
        return None
    if not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 48 for d in dims):
        return None
    return tuple(dims)


def numel(dims: tuple[int, ...]) -> int:
    return math.prod(dims) if dims else 1


def parse_inputs(dims: object, types: object
                 ) -> list[tuple[tuple[int, ...] | None, str, list[tuple[int, ...]] | None]]:
    """Per input: (tensor dims or None, the type's name lower-cased, the dims of a tensor list
    or None). Scalars and absent tensors have dims ``()`` only when their type is a tensor's."""
    out: list = []
    if not isinstance(dims, list):
        return out
    type_list = types if isinstance(types, list) else []
    for i, d in enumerate(dims[:MAX_INPUTS]):
        t = type_list[i] if i < len(type_list) and isinstance(type_list[i], str) else ""
        t = t.lower()
        if isinstance(d, list) and d and all(isinstance(x, list) for x in d):
            lst = [td for td in (tensor_dims(x) for x in d[:MAX_LIST]) if td is not None]
            out.append((None, t, lst))
        else:
            out.append((tensor_dims(d), t, None))
    return out


def elsize(type_name: str) -> int | None:
    return DTYPE_BYTES.get(type_name.lower())


def _concrete_ints(concrete: object, i: int) -> list[int] | None:
    if not isinstance(concrete, list) or i >= len(concrete) or not isinstance(concrete[i], str):
        return None
    text = concrete[i][:200]
    if not text or not re.fullmatch(r"\[?\s*-?\d+(\s*,\s*-?\d+)*\s*\]?", text):
        return None
    return [int(x) for x in re.findall(r"-?\d+", text)]


def _broadcast(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(rank):
        sizes = [s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0]
        out.append(max(sizes) if sizes else 1)
    return tuple(out)


# --- the cost of one call --------------------------------------------------------------------


def op_cost(name: str, dims: object, types: object, concrete: object = None,
            conv_outputs: dict | None = None) -> OpCost:
    """FLOPs and least bytes of one call of ``name`` with these recorded inputs. ``conv_outputs``
    maps (input dims, weight dims) to the output dims that a convolution's backward recorded
    (its grad_output), for forward convolutions whose stride and padding were not recorded."""
    if not isinstance(dims, list):
        return OpCost(None, None, "shapes not recorded (profile with record_shapes=True)")
    inputs = parse_inputs(dims, types)
    cls = op_class(name)
    b = base_name(name).lower()
    namespace = name.rsplit("::", 1)[0] if "::" in name else "aten"
    if namespace != "aten":
        # A library's own operator: its signature (which input is the output) is its own.
        return OpCost(None, None, f"no FLOP model for {namespace}'s operators")
    if all(d == () for d, _, lst in inputs if lst is None) and any(
            d == () and t == "tensorlist" for d, t, _ in inputs):
        return OpCost(None, None, "tensor-list shapes not recorded")
    try:
        if cls == "gemm":
            return _gemm(b, inputs)
        if cls == "conv":
            return _conv(b, inputs, concrete, conv_outputs or {})
        if cls == "attention":
            return _attention(b, inputs)
        if cls in ("elementwise", "norm", "softmax", "reduction", "optimizer"):
            return _per_element(b, cls, inputs)
        if cls == "embedding":
            return _embedding(b, inputs, concrete)
    except (ValueError, IndexError, TypeError, OverflowError):
        return OpCost(None, None, "recorded shapes do not fit the operator's signature")
    return OpCost(None, None, "no FLOP model for this operator")


def _tensor(inputs, i) -> tuple[tuple[int, ...], int]:
    dims, t, _ = inputs[i]
    size = elsize(t)
    if dims is None or size is None:
        raise ValueError("not a tensor")
    return dims, size


def _bytes_of(inputs, indices) -> int:
    total = 0
    for i in indices:
        if i < len(inputs):
            dims, t, _ = inputs[i]
            size = elsize(t)
            if dims is not None and size is not None and dims:
                total += numel(dims) * size
    return total


def _gemm(b: str, inputs) -> OpCost:
    b = b.rstrip("_") if b not in ("_scaled_mm",) else b
    if b in ("mm", "_scaled_mm"):
        (a, s), (w, _) = _tensor(inputs, 0), _tensor(inputs, 1)
        m, k, n = a[0], a[1], w[1]
        if w[0] != k:
            raise ValueError("K differs")
        return OpCost(2.0 * m * n * k, float(_bytes_of(inputs, (0, 1)) + m * n * s))
    if b in ("addmm", "_addmm_activation"):
        (a, s), (w, _) = _tensor(inputs, 1), _tensor(inputs, 2)
        m, k, n = a[0], a[1], w[1]
        return OpCost(2.0 * m * n * k, float(_bytes_of(inputs, (0, 1, 2)) + m * n * s))
    if b in ("bmm", "baddbmm", "addbmm"):
        first = 0 if b == "bmm" else 1
        (a, s), (w, _) = _tensor(inputs, first), _tensor(inputs, first + 1)
        batch, m, k, n = a[0], a[1], a[2], w[2]
        out = batch * m * n if b != "addbmm" else m * n
        return OpCost(2.0 * batch * m * n * k,
                      float(_bytes_of(inputs, range(first + 2)) + out * s))
    if b == "linear":
        (x, s), (w, _) = _tensor(inputs, 0), _tensor(inputs, 1)
        rows, k, n = numel(x[:-1]), x[-1], w[0]
        return OpCost(2.0 * rows * n * k, float(_bytes_of(inputs, (0, 1, 2)) + rows * n * s))
    if b in ("mv", "addmv", "dot"):
        first = 1 if b == "addmv" else 0
        (a, s) = _tensor(inputs, first)
        return OpCost(2.0 * numel(a), float(_bytes_of(inputs, range(first + 2))
                                            + (a[0] if len(a) == 2 else 1) * s))
    if b == "matmul":
        (a, s), (w, _) = _tensor(inputs, 0), _tensor(inputs, 1)
        if len(a) == 1 and len(w) == 1:
            return OpCost(2.0 * a[0], float(_bytes_of(inputs, (0, 1)) + s))
        a2 = a if len(a) > 1 else (1, a[0])
        w2 = w if len(w) > 1 else (w[0], 1)
        m, k, n = a2[-2], a2[-1], w2[-1]
        batch = numel(_broadcast(a2[:-2], w2[:-2]))
        return OpCost(2.0 * batch * m * n * k,
                      float(_bytes_of(inputs, (0, 1)) + batch * m * n * s))
    return OpCost(None, None, "no FLOP model for this GEMM variant")


# Positions of stride, padding, dilation and groups per convolution signature.
_CONV_ARGS = {
    "convolution": (3, 4, 5, 8), "_convolution": (3, 4, 5, 8), "conv1d": (3, 4, 5, 6),
    "conv2d": (3, 4, 5, 6), "conv3d": (3, 4, 5, 6), "cudnn_convolution": (3, 2, 4, 5),
    "miopen_convolution": (4, 3, 5, 6), "mkldnn_convolution": (4, 3, 5, 6),
}


def _conv(b: str, inputs, concrete, conv_outputs: dict) -> OpCost:
    if b in _CONV_BWD_INPUT:
        (g, s), (w, _) = _tensor(inputs, 1), _tensor(inputs, 2)
        # grad_input's size (an int list) is not recorded: the bytes count what is read.
        return OpCost(2.0 * numel(g) * numel(w[1:]), float(_bytes_of(inputs, (1, 2))))
    if b in _CONV_BWD_WEIGHT:
        (g, s), (x, _) = _tensor(inputs, 1), _tensor(inputs, 2)
        # The weight's size is an int list, not recorded: the convolution with this input and
        # output in the trace (its combined backward) names the weight.
        w = next((cw for (cx, cw), cg in conv_outputs.items() if cx == x and cg == g), None)
        if w is None:
            return OpCost(None, None, "the weight's size is not recorded")
        return OpCost(2.0 * numel(g) * numel(w[1:]), float(_bytes_of(inputs, (1, 2))
                                                           + numel(w) * s))
    if b in _CONV_BWD:
        # convolution_backward(grad_output, input, weight, ...); cudnn's: (input, grad_output, w).
        g_i, x_i = (1, 0) if b != "convolution_backward" else (0, 1)
        (g, s), (x, _), (w, _) = _tensor(inputs, g_i), _tensor(inputs, x_i), _tensor(inputs, 2)
        fwd = 2.0 * numel(g) * numel(w[1:])
        # grad_input and grad_weight: each a convolution as large as the forward.
        return OpCost(2.0 * fwd, float(2 * _bytes_of(inputs, (0, 1, 2))))
    (x, s), (w, _) = _tensor(inputs, 0), _tensor(inputs, 1)
    spatial = len(w) - 2
    out: tuple[int, ...] | None = None
    pos = _CONV_ARGS.get(b)
    if pos is not None:
        stride, pad, dil = (_concrete_ints(concrete, p) for p in pos[:3])
        if stride and pad is not None and dil:
            def fit(v: list[int]) -> list[int]:
                return v * spatial if len(v) == 1 else v
            stride, pad, dil = fit(stride), fit(pad), fit(dil)
            out = tuple(x[:1]) + (w[0],) + tuple(
                (x[2 + i] + 2 * pad[i] - dil[i] * (w[2 + i] - 1) - 1) // stride[i] + 1
                for i in range(spatial))
    if out is None:
        out = conv_outputs.get((x, w))
    if out is None:
        return OpCost(None, None, "stride and padding not recorded (no Concrete Inputs, and no "
                      "backward of this convolution in the trace to read its output shape)")
    flops = 2.0 * numel(out) * numel(w[1:])
    return OpCost(flops, float(_bytes_of(inputs, (0, 1, 2)) + numel(out) * s))


def _attention(b: str, inputs) -> OpCost:
    backward = "backward" in b
    first = 1 if backward else 0  # the backward passes take grad_out first
    (q, s), (k, _), (v, _) = (_tensor(inputs, first), _tensor(inputs, first + 1),
                              _tensor(inputs, first + 2))
    if len(q) < 3:
        raise ValueError("rank")
    # The flash and memory-efficient kernels' own ops lay out (B, L, H, D); SDPA (..., L, D).
    blhd = b.startswith(("_flash_attention", "_efficient_attention"))
    if blhd:
        if len(q) != 4:
            return OpCost(None, None, "variable-length attention: per-sequence lengths not "
                          "recorded")
        lq, lk, rows = q[1], k[1], q[0] * q[2]
    else:
        lq, lk, rows = q[-2], k[-2], numel(q[:-2])
    d, dv = q[-1], v[-1]
    fwd = 2.0 * rows * lq * lk * d + 2.0 * rows * lq * lk * dv
    out_bytes = rows * lq * dv * s
    moved = _bytes_of(inputs, range(first, first + 3)) + out_bytes
    if backward:
        return OpCost(2.0 * fwd, float(2 * moved + out_bytes))
    return OpCost(fwd, float(moved))


def _per_element(b: str, cls: str, inputs) -> OpCost:
    tensors = [(d, elsize(t)) for d, t, _ in inputs if d is not None and elsize(t) is not None]
    lists = [(lst, t) for d, t, lst in inputs if lst is not None]
    if cls == "optimizer" or (lists and not tensors):
        if not lists:
            raise ValueError("no tensor lists")
        # Tensor lists record their shapes, not their dtype: the first tensor input says it,
        # when there is one; else the bytes are unknown and only the elements are counted.
        n = sum(numel(d) for d in lists[0][0])
        fused = b.startswith("_fused_")
        flops = (16.0 if "adam" in b else 4.0) * n if fused else float(n)
        sizes = [s for _, s in tensors]
        if not sizes:
            return OpCost(flops, None, "tensor lists record no dtype: bytes unknown")
        el = sizes[0]
        total = sum(numel(d) for lst, _ in lists for d in lst)
        written = (3 if fused else 1) * n
        return OpCost(flops, float((total + written) * el))
    if not tensors:
        raise ValueError("no tensor inputs")
    n0, el0 = numel(tensors[0][0]), tensors[0][1] or 0
    plain = b.rstrip("_")
    if cls == "norm":
        n = n0 if "backward" not in b else max(numel(d) for d, _ in tensors)
        moved = _bytes_of(inputs, range(len(inputs)))
        per = 8.0 if "backward" in b else 5.0
        return OpCost(per * n, float(moved + n * el0))
    if cls == "softmax":
        per = 3.0 if "backward" in b else 5.0
        return OpCost(per * n0, float(_bytes_of(inputs, range(len(inputs))) + n0 * el0))
    if cls == "reduction":
        return OpCost(float(n0), float(n0 * el0))
    if b in _WRITE_ONLY:
        return OpCost(0.0 if b in ("fill_", "zero_") else float(n0), float(n0 * el0))
    if b == "copy_" and len(tensors) >= 2:
        return OpCost(0.0, float(n0 * el0 + numel(tensors[1][0]) * (tensors[1][1] or 0)))
    if b in ("cat", "stack"):
        moved = sum(numel(d) for lst, _ in lists for d in lst) * el0 if lists else n0 * el0
        return OpCost(0.0, float(2 * moved))
    out_shape = _broadcast(*(d for d, _ in tensors))
    out_el = 1 if plain in _BOOL_OUT else el0
    if b.endswith("_") and b not in _ELEMENTWISE_FLOPS:
        out_shape = tensors[0][0]  # in place: written into the first input
    n_out = numel(out_shape)
    per = _ELEMENTWISE_FLOPS.get(b, _ELEMENTWISE_FLOPS.get(plain, 1))
    read = sum(numel(d) * (s or 0) for d, s in tensors)
    return OpCost(float(per * n_out), float(read + n_out * out_el))


def _embedding(b: str, inputs, concrete) -> OpCost:
    if b in ("embedding", "embedding_bag", "_embedding_bag", "_embedding_bag_forward_only"):
        (w, s), (idx, si) = _tensor(inputs, 0), _tensor(inputs, 1)
        rows = numel(idx)
        flops = float(rows * w[-1]) if "bag" in b else 0.0  # the bag's sums
        return OpCost(flops, float(rows * si + 2 * rows * w[-1] * s))
    if b == "index_select":
        (x, s), (idx, si) = _tensor(inputs, 0), _tensor(inputs, 2)
        dim = _concrete_ints(concrete, 1)
        if not dim or not x:
            return OpCost(None, None, "the dimension indexed was not recorded")
        d = dim[0] % len(x)
        picked = numel(x) // max(1, x[d]) * numel(idx)
        return OpCost(0.0, float(numel(idx) * si + 2 * picked * s))
    if "backward" in b:
        (g, s) = _tensor(inputs, 0)
        return OpCost(float(numel(g)), float(_bytes_of(inputs, (0, 1)) + numel(g) * s))
    return OpCost(None, None, "no FLOP model for this operator")


def gemm_dims(name: str, shapes: object) -> tuple[int, int, int, int] | None:
    """(batch, M, N, K) of a GEMM from its recorded shapes, or None."""
    if not isinstance(shapes, list):
        return None
    b = base_name(name).lower().rstrip("_")
    dims: list = [tensor_dims(d) for d in shapes]
    try:
        if b in ("mm", "_scaled_mm"):
            return 1, dims[0][0], dims[1][1], dims[0][1]
        if b in ("addmm", "_addmm_activation"):
            return 1, dims[1][0], dims[2][1], dims[1][1]
        if b in ("bmm", "baddbmm"):
            a, w = (dims[0], dims[1]) if b == "bmm" else (dims[1], dims[2])
            return a[0], a[1], w[2], a[2]
        if b == "linear":
            return 1, numel(dims[0][:-1]), dims[1][0], dims[0][-1]
        if b == "matmul" and len(dims[0]) >= 2 and len(dims[1]) >= 2:
            a, w = dims[0], dims[1]
            return numel(_broadcast(a[:-2], w[:-2])), a[-2], w[-1], a[-1]
    except (TypeError, IndexError):
        return None
    return None


def dtype_of(inputs) -> str | None:
    """The op's data type: its first floating tensor input's (else its first tensor's)."""
    names = [t for d, t, _ in inputs if d is not None and t in DTYPE_BYTES]
    for t in names:
        if t in DTYPE_PRECISION and t not in ("signed char",):
            return t
    return names[0] if names else None
