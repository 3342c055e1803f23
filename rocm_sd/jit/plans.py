"""Launch plans of the runtime-compiled kernels: the decisions the C++ launchers of hip/<op>/*.hip make (argument
checks, vector width, template instance, grid), as pure functions of the arguments and two device facts
(multiprocessors, wave size), so they run and are tested without a GPU.

Why a Python mirror rather than one planner shared with C++: without a host compiler, no C++ runs on the user's
machine (that is the point of the JIT backend), and hiprtc / NVRTC compile device code only. So the plan exists
twice; tests/test_jit_plans.py compiles the shared C++ helpers (rocm_sd/launch.h, rsd::FastDiv) with g++ and
compares them with these for many inputs, and the GPU test tests/ops/test_jit_matches_built.py requires
bit-identical outputs from _C and the JIT backend where both exist (the vector width changes the order of a
reduction, so a different plan shows). Each function names the C++ it mirrors."""
from __future__ import annotations

import math
from dataclasses import dataclass

from .sources import TYPES, ada_layer_norm_unit, layer_norm_unit, rms_norm_unit

THREADS = 256  # kThreads of every kernel here
F32 = 0
NCHW, NHWC = 0, 1
TWO_31 = 1 << 31
FORMAT_CODES = (0, 1, 2)  # rsd::QuantFormat: e4m3fn, e4m3fnuz, int8
INT8 = 2


@dataclass(frozen=True)
class Launch:
    unit: str          # sources.UNITS key
    expression: str    # the template instance (a name expression of the unit)
    grid: int | tuple[int, int, int]
    signature: str     # kernel parameter types, launch.CTYPES letters
    args: tuple
    block: int = THREADS


@dataclass(frozen=True)
class Memset:
    """Zeroing `nbytes` at `pointer` on the stream, in order with the launches around it (hipMemsetAsync /
    cuMemsetD8Async: a memset node under graph capture), as the C++ launchers' hipMemsetAsync."""
    pointer: int
    nbytes: int


def elem_bytes(dtype: int) -> int:
    return 4 if dtype == F32 else 2


def ceil_div(a: int, b: int) -> int:
    return (a + b - 1) // b


def aligned(pointer: int, nbytes: int) -> bool:
    return pointer % nbytes == 0


def widest_vec(dtype: int, unit: int, pointers) -> int:
    """rsd::widest_vec (launch.h): widest access of at most 16 bytes whose element count divides `unit`, with
    every pointer aligned for it."""
    eb = elem_bytes(dtype)
    vec = 16 // eb
    while vec > 1:
        if unit % vec == 0 and all(aligned(p, vec * eb) for p in pointers):
            return vec
        vec //= 2
    return 1


def grid_stride_blocks(multiprocessors: int, work_items: int, threads: int, blocks_per_sm: int = 8) -> int:
    """rsd::grid_stride_blocks (launch.h)."""
    return max(1, min(ceil_div(work_items, threads), blocks_per_sm * multiprocessors))


# ---- bias_residual (hip/bias_residual/bias_residual.hip) ----------------------------------------------------------

def bias_residual_check(x, residual, bias, y, dtype, layout, n, c, hw, scale) -> str:
    if n <= 0 or c <= 0 or hw <= 0:
        return "empty tensor"
    eb = elem_bytes(dtype)
    if not all(aligned(p, eb) for p in (x, residual, y, bias)):
        return "misaligned data pointer"
    if n * c * hw >= TWO_31:
        return "2^31 or more elements"
    return ""


def bias_residual_plan(x, residual, bias, y, dtype, layout, n, c, hw, scale, sms) -> Launch:
    vec = widest_vec(dtype, hw if layout == NCHW else c, (x, residual, y))
    vectors = n * c * hw // vec
    nhwc = "true" if layout == NHWC else "false"
    return Launch("bias_residual", f"rsd::bias_residual_kernel<{TYPES[dtype]}, {vec}, {nhwc}>",
                  grid_stride_blocks(sms, vectors, THREADS), "ppppqddf",
                  (x, residual, bias, y, vectors, hw, c, scale))


# ---- parity_shuffle (hip/parity_shuffle/parity_shuffle.hip) -------------------------------------------------------

def parity_shuffle_check(parities, bias, out, dtype, n, h, w, c) -> str:
    if n <= 0 or h <= 0 or w <= 0 or c <= 0:
        return "empty tensor"
    eb = elem_bytes(dtype)
    if not all(aligned(p, eb) for p in (parities, out, bias)):
        return "misaligned data pointer"
    if n * 4 * (h + 1) * (w + 1) * c >= TWO_31 or n * 4 * h * w * c >= TWO_31:
        return "2^31 or more elements"
    return ""


def parity_shuffle_plan(parities, bias, out, dtype, n, h, w, c, sms) -> Launch:
    vec = widest_vec(dtype, c, (parities, out))
    vectors = n * 4 * h * w * c // vec
    return Launch("parity_shuffle", f"rsd::parity_shuffle_kernel<{TYPES[dtype]}, {vec}>",
                  grid_stride_blocks(sms, vectors, THREADS), "pppqdddiii",
                  (parities, bias, out, vectors, c // vec, 2 * w, 2 * h, h, w, c))


# ---- geglu (hip/geglu/geglu.hip) ----------------------------------------------------------------------------------

GEGLU_ROW_MAX_THREADS, GEGLU_ROW_VECTORS = 1024, 2  # geglu.hip's kRowMaxThreads, kRowVectors


def geglu_row_block_threads(d: int, vec: int, wave: int) -> int:
    """geglu.hip's geglu_row_block_threads: a row block's threads, or 0 where a row takes a wave."""
    threads = ceil_div(ceil_div(d // vec, GEGLU_ROW_VECTORS), wave) * wave
    return threads if threads <= GEGLU_ROW_MAX_THREADS else 0


def bound_problem(bound: float, format: int) -> str:
    """rocm_sd/quantize/api.h's bound_ok / bound_problem: '' for 0 or a finite positive bound with an fp8 format."""
    if bound == 0 or (math.isfinite(bound) and bound > 0 and format != INT8):
        return ""
    return f"bound {bound:f} is not 0 (a scale per row) or a finite positive value with an fp8 format"


def _geglu_quantized_vec(x, y, dtype, d, q) -> int:
    """geglu.hip's quantized_vec: the widest vector d and the pointers allow, narrowed to q's alignment."""
    vec = widest_vec(dtype, d, (x, y))
    while vec > 1 and not aligned(q, vec):
        vec //= 2
    return vec


def geglu_check(x, y, dtype, rows, d, q=0, scale=0, format=0, bound=0.0, wave=32) -> str:
    if rows <= 0 or d <= 0:
        return "empty tensor"
    if not y and not q:
        return "no output: y, or q and scale, are needed"
    if not (aligned(x, elem_bytes(dtype)) and aligned(y, elem_bytes(dtype))):
        return "misaligned data pointer"
    if rows * d >= TWO_31:
        return "2^31 or more output elements"
    if (q == 0) != (scale == 0):
        return "q and scale come together"
    if q:
        if format not in FORMAT_CODES:
            return f"unknown format code {format}"
        if elem_bytes(dtype) != 2:
            return "quantized output needs fp16 or bf16 activations"
        if not aligned(scale, 4):
            return "misaligned scale pointer"
        why = bound_problem(bound, format)
        if why:
            return why
        if not y and bound == 0 and not geglu_row_block_threads(d, _geglu_quantized_vec(x, y, dtype, d, q), wave):
            return f"rows of {d} features are quantized by a wave that reads y back: y is needed"
    return ""


def _rows_only(y) -> str:
    """The quantized kernels' kRowsOnly: no y to write (and the GELU for 8-bit rows)."""
    return "false" if y else "true"


def geglu_plan(x, y, dtype, rows, d, sms, wave, q=0, scale=0, format=0, bound=0.0) -> Launch:
    vec = widest_vec(dtype, d, (x, y))
    if q:  # geglu_forward's quantized branch: launch_quantized, a block a row where it fits, else a wave a row
        vec = _geglu_quantized_vec(x, y, dtype, d, q)
        if bound > 0:  # one scale for the tensor: the elementwise grid
            vectors = rows * d // vec
            return Launch("geglu", f"rsd::geglu_bounded_quantized<{TYPES[dtype]}, {vec}, {_rows_only(y)}>",
                          grid_stride_blocks(sms, vectors, THREADS), "ppppqdqif",
                          (x, y, q, scale, vectors, d // vec, d, format, bound))
        threads = geglu_row_block_threads(d, vec, wave)
        if threads:
            return Launch("geglu", f"rsd::geglu_row_block_quantized<{TYPES[dtype]}, {vec}, {_rows_only(y)}>", rows,
                          "ppppqi", (x, y, q, scale, d, format), block=threads)
        return Launch("geglu", f"rsd::geglu_rows_quantized<{TYPES[dtype]}, {vec}>", ceil_div(rows, THREADS // wave),
                      "ppppqqi", (x, y, q, scale, rows, d, format))
    vectors = rows * d // vec
    return Launch("geglu", f"rsd::geglu_kernel<{TYPES[dtype]}, {vec}>", grid_stride_blocks(sms, vectors, THREADS),
                  "ppqdq", (x, y, vectors, d // vec, d))


# ---- gelu_tanh (hip/gelu_tanh/gelu_tanh.hip) ------------------------------------------------------------------------

GELU_TANH_ROW_MAX_THREADS, GELU_TANH_ROW_VECTORS = 1024, 4  # gelu_tanh.hip's kRowMaxThreads, kRowVectors


def gelu_tanh_row_block_threads(d: int, vec: int, wave: int) -> int:
    """gelu_tanh.hip's gelu_tanh_row_block_threads: a row block's threads, or 0 where a row is longer than one."""
    threads = ceil_div(ceil_div(d // vec, GELU_TANH_ROW_VECTORS), wave) * wave
    return threads if threads <= GELU_TANH_ROW_MAX_THREADS else 0


def gelu_tanh_check(x, bias, y, dtype, rows, d, q=0, scale=0, format=0, bound=0.0, wave=32) -> str:
    if rows <= 0 or d <= 0:
        return "empty tensor"
    if (q == 0) != (scale == 0):
        return "q and scale come together"
    if (q == 0) == (y == 0):
        return "one output: y, or q and scale"
    if not all(aligned(p, elem_bytes(dtype)) for p in (x, bias, y)):
        return "misaligned data pointer"
    if rows * d >= TWO_31:
        return "2^31 or more elements"
    if q:
        if format not in FORMAT_CODES:
            return f"unknown format code {format}"
        if bound != 0:
            return "quantized output takes a scale per row only (bound 0)"
        if (elem_bytes(dtype) != 2 or widest_vec(dtype, d, (x, bias, y)) != QUANTIZE_VEC or not aligned(q, QUANTIZE_VEC)
                or not aligned(scale, 4)):
            return "quantized output needs fp16/bf16 rows of a multiple of 8 features, 16-byte aligned"
        if not gelu_tanh_row_block_threads(d, QUANTIZE_VEC, wave):
            return f"quantized output: rows of {d} features are longer than one block holds"
    return ""


def gelu_tanh_plan(x, bias, y, dtype, rows, d, sms, wave, q=0, scale=0, format=0, bound=0.0) -> Launch:
    with_bias = "true" if bias else "false"
    if q:  # gelu_tanh_forward's quantized rows: a block a row
        return Launch("gelu_tanh", f"rsd::gelu_tanh_row_block_quantized<{TYPES[dtype]}, {QUANTIZE_VEC}, {with_bias}>",
                      rows, "ppppqi", (x, bias, q, scale, d, format),
                      block=gelu_tanh_row_block_threads(d, QUANTIZE_VEC, wave))
    vec = widest_vec(dtype, d, (x, bias, y))
    vectors = rows * d // vec
    return Launch("gelu_tanh", f"rsd::gelu_tanh_kernel<{TYPES[dtype]}, {vec}, {with_bias}>",
                  grid_stride_blocks(sms, vectors, THREADS), "pppqd", (x, bias, y, vectors, d // vec))


# ---- quantize_rows (hip/quantize/quantize_rows.hip) ---------------------------------------------------------------

def quantize_rows_check(x, q, scale, dtype, format, rows, k, rows_per_batch=0, batch_stride=0) -> str:
    if rows <= 0 or k <= 0:
        return "empty tensor"
    if format not in FORMAT_CODES:
        return f"unknown format code {format}"
    if not (aligned(x, elem_bytes(dtype)) and aligned(scale, 4)):
        return "misaligned data pointer"
    if rows >= TWO_31 // (THREADS // 32):
        return "too many rows"
    if rows_per_batch < 0 or rows_per_batch > 0 and (rows % rows_per_batch or batch_stride < rows_per_batch * k):
        return "batches of rows: rows_per_batch must divide rows, and batch_stride hold a batch's rows"
    return ""


def quantize_rows_plan(x, q, scale, dtype, format, rows, k, wave, rows_per_batch=0, batch_stride=0) -> Launch:
    vec = widest_vec(dtype, k, (x,))
    while vec > 1 and (not aligned(q, vec) or batch_stride % vec):
        vec //= 2
    per_batch, stride = (rows_per_batch, batch_stride) if rows_per_batch > 0 else (rows, rows * k)
    return Launch("quantize_rows", f"rsd::quantize_rows_kernel<{TYPES[dtype]}, {vec}>",
                  ceil_div(rows, THREADS // wave), "pppqqiqq", (x, q, scale, rows, k, format, per_batch, stride))


# ---- layer_norm and add_layer_norm (hip/layer_norm/layer_norm.hip) ------------------------------------------------

MAX_VECS_PER_LANE = 16
QUANTIZE_VEC = 8  # kQuantizeVec: the quantized output's one vector width
MAX_QUANTIZED_VECS_PER_LANE = 8


def _layer_norm_vec(dtype, c, x, y, residual, sum_) -> int:
    return widest_vec(dtype, c, (x, y, residual, sum_))


def _vecs_per_lane(c: int, vec: int, wave: int) -> int:
    need = ceil_div(c // vec, wave)
    count = 1
    while count < need:
        count *= 2
    return count


def layer_norm_check(x, y, gamma, beta, dtype, param_dtype, rows, c, eps, wave, residual=0, sum=0, q=0, scale=0,
                     format=0, bound=0.0) -> str:
    if rows <= 0 or c <= 0:
        return "empty tensor"
    if param_dtype != dtype and param_dtype != F32:
        return "weight/bias dtype must be the input's or float32"
    if (residual == 0) != (sum == 0):
        return "residual and sum come together"
    if (q == 0) != (scale == 0):
        return "q and scale come together"
    vec = _layer_norm_vec(dtype, c, x, y, residual, sum)
    if q:
        if format not in FORMAT_CODES:
            return f"unknown format code {format}"
        if why := bound_problem(bound, format):
            return why
        if elem_bytes(dtype) != 2 or vec != QUANTIZE_VEC or not aligned(q, QUANTIZE_VEC) or not aligned(scale, 4):
            return "quantized output needs fp16/bf16 rows of a multiple of 8 channels, 16-byte aligned"
        if _vecs_per_lane(c, QUANTIZE_VEC, wave) > MAX_QUANTIZED_VECS_PER_LANE:
            return f"quantized output: normalized size {c} is over 8 vectors a lane"
    if not all(aligned(p, elem_bytes(dtype)) for p in (x, y, residual, sum)):
        return "misaligned data pointer"
    if rows * c >= 1 << 40:
        return "tensor too large"
    if _vecs_per_lane(c, vec, wave) > MAX_VECS_PER_LANE:
        return f"normalized size {c} is too large for the one-wave-per-row kernel"
    return ""


def layer_norm_plan(x, y, gamma, beta, dtype, param_dtype, rows, c, eps, wave, residual=0, sum=0, q=0, scale=0,
                    format=0, bound=0.0) -> Launch:
    vec = _layer_norm_vec(dtype, c, x, y, residual, sum)
    vecs = _vecs_per_lane(c, vec, wave)
    vecs = vecs if vecs in (1, 2, 4, 8) else 16  # the launcher's switch
    t = TYPES[dtype]
    p = "float" if param_dtype == F32 else t
    quantize = bool(q) and vec == QUANTIZE_VEC and elem_bytes(dtype) == 2  # launch_quantized_or_not
    flags = f"{'true' if residual else 'false'}, {'true' if quantize else 'false'}"
    return Launch(layer_norm_unit(dtype, param_dtype == F32 and dtype != F32, vec, quantize),
                  f"rsd::layer_norm_rows<{t}, {p}, {vec}, {vecs}, {flags}>",
                  ceil_div(rows, THREADS // wave), "ppppppqifo",
                  (x, residual, sum, y, gamma, beta, rows, c, eps, (q, scale, format, bound)))


# ---- ada_layer_norm and add_ada_layer_norm (hip/ada_layer_norm/ada_layer_norm.hip) --------------------------------

ADA_MAX_THREADS, ADA_BLOCK_THREADS = 512, 256  # kMaxThreads, kBlockThreads
ADA_MAX_VECS_PER_LANE, ADA_TARGET_VECS_PER_LANE = 8, 2
TWO_40 = 1 << 40


def _ada_param_vec(vec, dtype, p, stride) -> int:
    """param_vec: a channel stride of 1, pointer and batch stride aligned for the vector."""
    if stride[1] != 1:
        return 1
    while vec > 1 and (not aligned(p, vec * elem_bytes(dtype)) or stride[0] % vec):
        vec //= 2
    return vec


def _ada_plan(x, out, scale, shift, dtype, c, scale_stride, shift_stride, wave, y, gate, gate_stride, h):
    """plan_launch: (vec, vecs, row_threads, rows_per_block)."""
    vec = widest_vec(dtype, c, (x, out, y, h))
    vec = _ada_param_vec(_ada_param_vec(vec, dtype, scale, scale_stride), dtype, shift, shift_stride)
    if gate:
        vec = _ada_param_vec(vec, dtype, gate, gate_stride)
    vectors = c // vec
    wanted = ceil_div(ceil_div(vectors, ADA_TARGET_VECS_PER_LANE), wave) * wave
    row_threads = min(max(wanted, wave), ADA_MAX_THREADS)
    need = ceil_div(vectors, row_threads)
    vecs = 1
    while vecs < need and vecs <= ADA_MAX_VECS_PER_LANE:
        vecs *= 2
    return vec, vecs, row_threads, max(1, ADA_BLOCK_THREADS // row_threads)


def ada_layer_norm_check(x, out, scale, shift, dtype, batch, tokens, c, scale_stride, shift_stride, eps, wave, y=0,
                         gate=0, gate_stride=(0, 0), h=0, q=0, q_scale=0, format=0, bound=0.0) -> str:
    if batch <= 0 or tokens <= 0 or c <= 0:
        return "empty tensor"
    if (y == 0) != (gate == 0) or (y == 0) != (h == 0):
        return "y, gate and h come together"
    if (q == 0) != (q_scale == 0):
        return "q and scale come together"
    if (q == 0) == (out == 0):
        return "one output: out, or q and scale"
    if q:
        if format not in FORMAT_CODES:
            return f"unknown format code {format}"
        if why := bound_problem(bound, format):
            return why
        vec = _ada_plan(x, out, scale, shift, dtype, c, scale_stride, shift_stride, wave, y, gate, gate_stride, h)[0]
        if elem_bytes(dtype) != 2 or vec != QUANTIZE_VEC or not aligned(q, QUANTIZE_VEC) or not aligned(q_scale, 4):
            return "quantized output needs fp16/bf16 rows of a multiple of 8 channels and parameters, 16-byte aligned"
    if not all(aligned(p, elem_bytes(dtype)) for p in (x, out, scale, shift, y, gate, h)):
        return "misaligned data pointer"
    if tokens >= TWO_31 or batch * tokens * c >= TWO_40:
        return "tensor too large"
    if any(s < 0 or s >= TWO_31 for stride in (scale_stride, shift_stride, gate_stride) for s in stride):
        return "parameter strides out of range"
    if _ada_plan(x, out, scale, shift, dtype, c, scale_stride, shift_stride, wave, y, gate, gate_stride,
                 h)[1] > ADA_MAX_VECS_PER_LANE:
        return f"normalized size {c} is too large for the kernel's row of {ADA_MAX_THREADS} threads"
    return ""


def ada_layer_norm_plan(x, out, scale, shift, dtype, batch, tokens, c, scale_stride, shift_stride, eps, wave, y=0,
                        gate=0, gate_stride=(0, 0), h=0, q=0, q_scale=0, format=0, bound=0.0) -> Launch:
    vec, vecs, row_threads, rows_per_block = _ada_plan(x, out, scale, shift, dtype, c, scale_stride, shift_stride,
                                                       wave, y, gate, gate_stride, h)
    quantize = bool(q) and vec == QUANTIZE_VEC and elem_bytes(dtype) == 2  # launch_quantized_or_not
    flags = f"{'true' if y else 'false'}, {'true' if quantize else 'false'}"
    return Launch(ada_layer_norm_unit(dtype, vec, quantize),
                  f"rsd::ada_layer_norm_rows<{TYPES[dtype]}, {vec}, {vecs}, {flags}>",
                  ceil_div(batch * tokens, rows_per_block), "pppppppqiiiiiiiifio",
                  (x, y, gate, scale, shift, h, out, batch * tokens, tokens, c, *gate_stride, *scale_stride,
                   *shift_stride, eps, row_threads, (q, q_scale, format, bound)), block=row_threads * rows_per_block)


# ---- rms_norm (hip/rms_norm/rms_norm.hip) ---------------------------------------------------------------------------

RMS_NORM_MAX_VECS_PER_LANE = 8  # kMaxVecsPerLane
RMS_NORM_MAX_D = 65536          # kMaxD


def _rms_norm_vec(x, weight, lead, lead_weight, cos, sin, y, dtype, param_dtype, d, x_stride, lead_stride) -> int:
    """pick_vec: the widest vector every row start allows (x, lead, y in T; the weights in P; cos, sin in float)."""
    eb, pb = elem_bytes(dtype), elem_bytes(param_dtype)
    vec = 16 // eb
    while vec > 1:
        if (d % vec == 0 and all(aligned(p, vec * eb) for p in (x, lead, y))
                and all(aligned(p, min(vec * pb, 16)) for p in (weight, lead_weight))
                and all(aligned(p, min(vec * 4, 16)) for p in (cos, sin))
                and all(s % vec == 0 for s in (*x_stride, *lead_stride))):
            return vec
        vec //= 2
    return 1


def rms_norm_check(x, weight, lead, lead_weight, cos, sin, y, dtype, param_dtype, sizes, x_stride, lead_stride,
                   eps) -> str:
    batch, length, lead_len, heads, d = sizes
    if batch <= 0 or heads <= 0 or d <= 0 or length < 0 or lead_len < 0 or lead_len + length <= 0:
        return "empty tensor"
    if param_dtype != dtype and param_dtype != F32:
        return "weight dtype must be the input's or float32"
    if (cos == 0) != (sin == 0):
        return "cos and sin come together"
    if lead_len > 0 and lead == 0:
        return "lead rows without lead"
    if d > RMS_NORM_MAX_D:
        return f"head dim {d} is beyond the kernel's limit of 65536"
    if cos and d % 2:
        return "the rotary embedding needs an even head dim"
    if batch * (lead_len + length) * heads >= TWO_31:
        return "2^31 or more rows"
    eb, pb = elem_bytes(dtype), elem_bytes(param_dtype)
    if not (all(aligned(p, eb) for p in (x, lead, y)) and all(aligned(p, pb) for p in (weight, lead_weight))
            and all(aligned(p, 4) for p in (cos, sin))):
        return "misaligned data pointer"
    if cos and _rms_norm_vec(x, weight, lead, lead_weight, cos, sin, y, dtype, param_dtype, d, x_stride,
                             lead_stride) < 2:
        return "the rotary embedding needs rows aligned to 2 elements (pointers and strides)"
    return ""


def rms_norm_plan(x, weight, lead, lead_weight, cos, sin, y, dtype, param_dtype, sizes, x_stride, lead_stride, eps,
                  wave) -> Launch:
    batch, length, lead_len, heads, d = sizes
    vec = _rms_norm_vec(x, weight, lead, lead_weight, cos, sin, y, dtype, param_dtype, d, x_stride, lead_stride)
    vectors = d // vec
    lanes_log2 = 0
    while (1 << lanes_log2) < vectors and (2 << lanes_log2) <= wave:  # plan(): a group of lanes per row
        lanes_log2 += 1
    need, vecs = ceil_div(vectors, 1 << lanes_log2), 1
    while vecs < need:
        vecs *= 2
    vecs = vecs if vecs <= RMS_NORM_MAX_VECS_PER_LANE else 0  # 0: the row is read twice
    rows = batch * (lead_len + length) * heads
    t = TYPES[dtype]
    p = "float" if param_dtype == F32 else t
    return Launch(rms_norm_unit(dtype, param_dtype == F32 and dtype != F32, vec),
                  f"rsd::rms_norm_rows<{t}, {p}, {vec}, {vecs}, {'true' if cos else 'false'}>",
                  ceil_div(rows, THREADS >> lanes_log2), "pppppppqiiddiqqqqqqf",
                  (x, weight, lead, lead_weight, cos, sin, y, rows, d, lanes_log2, heads, lead_len + length, lead_len,
                   *x_stride, *lead_stride, eps))
