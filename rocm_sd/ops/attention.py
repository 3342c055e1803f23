"""rocm_sd::attention: flash-style attention forward on the matrix units (hip/attention/attention.hip).

    out[b, i, h] = sum_j softmax_j(scale * q[b, i, h] . k[b, j, h]) v[b, j, h]

q, k, v as [batch, seq, heads, head_dim] with any batch / sequence / head strides (head dim contiguous):
the projections' outputs viewed per head, packed QKV or KV included, so nothing is copied on the way in;
out comes back contiguous [batch, q_len, heads, head_dim], which the output projection takes as a free
view. The PyTorch path is scaled_dot_product_attention (cuDNN / flash on NVIDIA, AOTriton on ROCm).

Which runs: a forced backend, then the tuning database's measured choice for the shape. An untuned call runs
PyTorch's SDPA with its own backend pick where SDPA has a fused kernel for it. Where it has none, SDPA would take
its math path and materialise every score: on ROCm above AOTriton's head dim limit (256 in older releases), and on
the GPUs where AOTriton's fused kernels are experimental (off unless TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL=1:
gfx1100, gfx1101, gfx1151, gfx1200 in recent releases; docs/amd.md). There rocm_sd's kernel runs untuned, once its
self-check on that GPU passed (ops/attention_self_check.py: a few shapes of the call's head dim against a float64
truth, cached per GPU, build and kernel sources); where the check failed or the kernel cannot take the call, SDPA's
math path runs, in query chunks above head dim 256 on ROCm. PyTorch says per call whether it has a fused kernel
(torch.backends.cuda.can_use_flash_attention / _efficient_ / _cudnn_, asked once per shape).
ROCM_SD_REPLACE_SDPA_MATH=0 keeps those calls on SDPA too.

Elsewhere the kernel is the default nowhere without a measurement, because vendors' fused attention is strong
(bench/results/attention-h200.md): `python -m rocm_sd.tune` validates it against a float64 truth on the user's
GPU and times it. The tuner also measures each SDPA backend on its own ("torch:flash", "torch:efficient",
"torch:cudnn": on ROCm the AOTriton flash and efficient kernels), because SDPA's pick is a fixed priority order,
not a measurement. On ROCm builds with Composable Kernel headers the tuner also measures CK's batched
GEMM-softmax-GEMM instances (fp16, "ck:<instance>" choices).
"""
from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F

from .. import _ext, config, dispatch
from . import attention_self_check
from ._checks import check_floating, check_same_device, fail
from ._common import DTYPE_CODES, ck_listing, stream_handle
from .spec import (OpSpec, Plan, PlanCache, as_meta, device_of, dispatcher_needed, dtype_name, kernel_reasons,
                   problem_key, tensor_key)

OP = "attention"
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 512  # kMaxHeadDim in hip/attention/attention.hip
MAX_NARROW_HEAD_DIM = 160  # above it the wide family runs (hip/attention/attention_wide.hip)


def default_scale(q: torch.Tensor) -> float:
    return 1.0 / math.sqrt(q.shape[-1])


# ROCm builds of PyTorch have long had no fused SDPA kernel above head dim 256 (pytorch/pytorch#148850; AOTriton
# 0.9 and later take 512, except on gfx11 with AOTriton 0.11), so SDPA takes its math path there and materialises
# every score: 2.4 GB at the VAE mid-block of a 1024x1024 decode, ~24 GB at 2048x2048 (ComfyUI turns PyTorch
# attention off for AMD VAEs for this reason). Where rocm_sd's kernel does not run such a call (module docstring),
# the PyTorch path runs in query chunks whose scores (and their fp32 softmax) stay within SCORE_BUDGET_BYTES.
CHUNKED_ABOVE_HEAD_DIM = 256
SCORE_BUDGET_BYTES = 256 << 20


def _sdpa(q, k, v, scale):
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=scale)


# The SDPA backends the tuner measures one by one ("torch:<name>" choices), by torch.nn.attention.SDPBackend name.
SDPA_BACKENDS = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION"}


def sdpa_backends() -> list[str]:
    """The SDPA backends this PyTorch has for GPU tensors: flash and efficient everywhere (AOTriton on ROCm),
    cuDNN on CUDA builds only."""
    from torch.nn.attention import SDPBackend

    names = [n for n, member in SDPA_BACKENDS.items() if hasattr(SDPBackend, member)]
    return [n for n in names if n != "cudnn" or torch.version.hip is None]


def attention_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, backend: str) -> torch.Tensor:
    """SDPA restricted to one backend (SDPA_BACKENDS); raises RuntimeError where that backend cannot take the call."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(getattr(SDPBackend, SDPA_BACKENDS[backend])):
        return _sdpa(q, k, v, scale).transpose(1, 2).contiguous()


def query_chunk(q: torch.Tensor, kv_len: int, budget_bytes: int) -> int:
    """Queries a chunk may hold so that its scores, stored and softmaxed in fp32, fit in `budget_bytes`."""
    batch, _, heads, _ = q.shape
    per_query = batch * heads * kv_len * (q.element_size() + 4)
    return max(1, budget_bytes // max(1, per_query))


def default_score_budget(head_dim: int, device_type: str, hip: bool) -> int | None:
    """SCORE_BUDGET_BYTES where SDPA would materialise every score (ROCm GPUs above head dim 256), else None."""
    return SCORE_BUDGET_BYTES if hip and device_type == "cuda" and head_dim > CHUNKED_ABOVE_HEAD_DIM else None


def attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                  budget_bytes: int | None = None) -> torch.Tensor:
    """PyTorch's SDPA on the same [B, L, H, D] views; contiguous [B, Lq, H, D] out (float64 works: the
    math path, the tuner's truth). In query chunks when `budget_bytes` is given, or by default on ROCm above
    head dim 256 (see SCORE_BUDGET_BYTES): the same result, chunk by chunk."""
    if budget_bytes is None:
        budget_bytes = default_score_budget(q.shape[-1], q.device.type, torch.version.hip is not None)
    chunk = query_chunk(q, k.shape[1], budget_bytes) if budget_bytes is not None else q.shape[1]
    if chunk >= q.shape[1]:
        return _sdpa(q, k, v, scale).transpose(1, 2).contiguous()
    out = _output(q, v)
    for start in range(0, q.shape[1], chunk):
        out[:, start:start + chunk] = _sdpa(q[:, start:start + chunk], k, v, scale).transpose(1, 2)
    return out


def check_args(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Raises what SDPA would raise for [B, L, H, D] views, and for batches or heads SDPA would broadcast (this op
    maps query b, head h to key b, head h; its output has q's batch and heads and v's head dim)."""
    check_floating(OP, q=q, k=k, v=v)
    check_same_device(OP, q, k=k, v=v)
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        fail(OP, f"q, k, v must be 4-D [batch, seq, heads, head_dim], got {q.dim()}-D, {k.dim()}-D, {v.dim()}-D")
    if not q.dtype == k.dtype == v.dtype:
        fail(OP, f"expected q, k and v of one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.shape[0] != q.shape[0] or k.shape[2] != q.shape[2] or k.shape[3] != q.shape[3] or v.shape[:3] != k.shape[:3]:
        fail(OP, f"shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: q and k need one batch, head "
                 "count and head dim, k and v one batch, length and head count")


def input_reasons(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> list[str]:
    """Reasons in the arguments themselves that the kernel cannot take (no GPU needed to ask)."""
    reasons = []
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return [f"q, k, v must be 4-D [batch, seq, heads, head_dim], got {q.dim()}-D, {k.dim()}-D, {v.dim()}-D"]
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in SUPPORTED_DTYPES:
        reasons.append(f"dtypes {q.dtype}, {k.dtype}, {v.dtype} (supported: one of float16, bfloat16 for all three)")
    if not (q.device == k.device == v.device):
        reasons.append(f"q, k, v on different devices ({q.device}, {k.device}, {v.device})")
    batch, _, heads, dim = q.shape
    if k.shape[0] != batch or k.shape[2] != heads or k.shape[3] != dim or v.shape[:3] != k.shape[:3]:
        reasons.append(f"shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: batch, heads, head dim "
                       "or k/v lengths differ")
    elif v.shape[3] != dim:
        reasons.append(f"v head dim {v.shape[3]} differs from q/k head dim {dim}")
    if q.numel() == 0 or k.numel() == 0:
        reasons.append("empty tensor")
    if dim % 8 or dim > MAX_HEAD_DIM:
        reasons.append(f"head dim {dim} (the kernel takes multiples of 8 up to {MAX_HEAD_DIM})")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() == 4 and t.stride(-1) != 1 and t.shape[-1] > 1:
            reasons.append(f"{name} head dim is not contiguous (strides {tuple(t.stride())})")
    if not (scale > 0 and math.isfinite(scale)):
        reasons.append(f"scale {scale} is not a positive finite number")
    return reasons


def _strides(t: torch.Tensor) -> list[int]:
    return [t.stride(0), t.stride(1), t.stride(2)]


def _kernel_args(q, k, v, out_ptr: int, out_strides: list[int], scale: float) -> tuple:
    sizes = [q.shape[0], q.shape[2], q.shape[1], k.shape[1], q.shape[3]]
    return (q.data_ptr(), k.data_ptr(), v.data_ptr(), out_ptr, DTYPE_CODES[q.dtype], sizes,
            [_strides(q), _strides(k), _strides(v), out_strides], float(scale))


def _output(q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.empty(q.shape[:3] + v.shape[3:], dtype=q.dtype, device=q.device)


def _call(q, k, v, scale, out: torch.Tensor | None, instance: str, mode: str, stream: int = 0) -> str:
    if out is None:  # checks only: the output the op allocates is contiguous and 256-byte aligned
        out_ptr, out_strides = q.data_ptr(), [q.shape[1] * q.shape[2] * q.shape[3], q.shape[2] * q.shape[3], q.shape[3]]
    else:
        out_ptr, out_strides = out.data_ptr(), _strides(out)
    args = _kernel_args(q, k, v, out_ptr, out_strides, scale)
    if mode == "check":
        return _ext._C.attention_check(*args, q.device.index, instance)
    if mode == "describe":
        return _ext._C.attention_describe(*args, q.device.index, instance)
    _ext._C.attention_forward(*args, stream, q.device.index, instance)
    return ""


def supports(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, instance: str = "") -> list[str]:
    """Reasons the kernel (or the named instance) cannot run this call; empty when it can."""
    return kernel_reasons(q.device, input_reasons(q, k, v, scale), lambda: _call(q, k, v, scale, None, instance, "check"))


def instances() -> list[str]:
    """The compiled kernel instances (the tuner's candidates); [] without _C."""
    return list(_ext._C.attention_instances()) if _ext._C is not None else []


def instance_fits(name: str, dtype: torch.dtype, head_dim: int) -> bool:
    """Whether instance `name` ("f16_d64_w4_r2_n64": dtype, padded head dim, ...) takes this dtype and head dim.
    Wide instances ("..._wide") would run any head dim they hold, but are candidates only above the narrow
    family's range, where nothing else can."""
    code, padded = name.split("_")[:2]
    if name.endswith("_wide") and head_dim <= MAX_NARROW_HEAD_DIM:
        return False
    return code == {torch.float16: "f16", torch.bfloat16: "bf16"}.get(dtype) and int(padded[1:]) >= head_dim


def describe(q, k, v, scale: float, instance: str = "") -> str:
    """The instance and grid the kernel would run for this call, or 'error: <why>'."""
    return _call(q, k, v, scale, None, instance, "describe")


def attention_kernel(q, k, v, scale: float, out: torch.Tensor | None = None, instance: str = "") -> torch.Tensor:
    """The HIP kernel itself, no dispatch (tests call it with a poisoned `out`; the tuner names instances)."""
    y = _output(q, v) if out is None else out
    _call(q, k, v, scale, y, instance, "run", stream_handle(q.device))
    return y


def ck_instances(device: torch.device | None = None) -> list[str]:
    """The Composable Kernel attention instances in this build (those with code for `device`'s GPU, given one):
    ROCm builds with CK headers only (ck_templates/); empty elsewhere."""
    return ck_listing("ck_attention_instances", device)


def ck_reasons(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> list[str]:
    """Why the CK instances cannot take this call (no GPU needed to ask): they take what the kernel takes,
    in fp16 only. Lengths a tile does not divide are each instance's own check (IsSupportedArgument)."""
    reasons = input_reasons(q, k, v, scale)
    if q.dtype != torch.float16:
        reasons.append(f"CK attention instances take float16, not {q.dtype}")
    return reasons


def attention_ck(name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """One Composable Kernel instance, by name (`ck_instances()`); it raises when it cannot take the call."""
    y = _output(q, v)
    _ext._C.ck_attention_forward(name, *_kernel_args(q, k, v, y.data_ptr(), _strides(y), scale),
                                 stream_handle(q.device), q.device.index)
    return y


# ---- where SDPA has no fused kernel: rocm_sd's kernel, untuned (module docstring) ------------------------------

# The fused SDPA backends and the torch.backends.cuda functions that say whether one can take a call.
FUSED_SDPA_CHECKS = {"flash": "can_use_flash_attention", "efficient": "can_use_efficient_attention",
                     "cudnn": "can_use_cudnn_attention"}


def _off() -> bool:
    return False


# torch.backends.cuda.{flash,mem_efficient,cudnn}_sdp_enabled without their Python wrappers (asked on every call).
_FLASH_ON, _EFFICIENT_ON, _CUDNN_ON = (getattr(torch._C, f"_get_{name}_sdp_enabled", _off)
                                       for name in ("flash", "mem_efficient", "cudnn"))


def sdpa_enabled() -> tuple[bool, bool, bool]:
    """Which fused SDPA backends are switched on (torch.backends.cuda.enable_*_sdp, sdpa_kernel): they change what
    PyTorch answers, so every cached answer is keyed by them."""
    return _FLASH_ON(), _EFFICIENT_ON(), _CUDNN_ON()


def _sdpa_params(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """torch.backends.cuda.SDPAParams of an unmasked, non-causal call without dropout on [B, H, L, D] views: query,
    key, value, mask, dropout, causal and (torch >= 2.5) enable_gqa; None where this torch builds them otherwise."""
    params = getattr(torch.backends.cuda, "SDPAParams", None)
    for gqa in ((False,), ()):
        try:
            return params(q, k, v, None, 0.0, False, *gqa)
        except TypeError:  # the other signature, or no SDPAParams at all (None is not callable)
            continue
    return None


def _ask_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[str, ...] | None:
    params = _sdpa_params(q, k, v)
    if params is None:
        return None
    checks = {name: getattr(torch.backends.cuda, check, None) for name, check in FUSED_SDPA_CHECKS.items()}
    # PyTorch asks the current device (its architecture, AOTriton's check_gpu): make it the tensors'.
    with torch.cuda.device(q.device) if q.device.type == "cuda" else contextlib.nullcontext():
        try:
            return tuple(name for name, can_use in checks.items() if can_use is not None and can_use(params, False))
        except RuntimeError:
            return None


_fused_sdpa = PlanCache()  # (q, k, v keys, enabled backends) -> [the fused backends that can take the call, or None]


def sdpa_fused_backends(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[str, ...] | None:
    """The fused SDPA backends PyTorch could run for this unmasked call on [B, L, H, D] views ("flash",
    "efficient", "cudnn"): () where SDPA would take its math path, None where this torch cannot say (its
    SDPAParams differ). Asked once per shape, strides, dtype, device and set of enabled backends."""
    key = (tensor_key(q), tensor_key(k), tensor_key(v), sdpa_enabled())
    return _fused_sdpa.get_or_compute(key, lambda: [_ask_sdpa(q.transpose(1, 2), k.transpose(1, 2),
                                                              v.transpose(1, 2))])[0]


def _replacing_sdpa_math() -> bool:
    """Whether untuned calls SDPA has no fused kernel for may run the kernel at all: not with a backend forced by
    name (it decides), nor with ROCM_SD_REPLACE_SDPA_MATH=0."""
    return config.current.replace_sdpa_math and dispatch.forced_backend(OP) is None


def self_check(q: torch.Tensor) -> dict:
    """The kernel's self-check on q's GPU at q's dtype and head dim (ops/attention_self_check.py): run once, cached."""
    return attention_self_check.result(q.device, q.dtype, q.shape[-1], attention_kernel, attention_ref)


def replaces_sdpa_math(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether this untuned call, which the kernel can take (supports() gave no reason), runs the kernel because
    SDPA has no fused kernel for it: asked of PyTorch, then of the kernel's self-check on this GPU."""
    return _replacing_sdpa_math() and sdpa_fused_backends(q, k, v) == () and self_check(q)["ok"]


_host_math = PlanCache()  # (device, dtype, head dim, enabled backends) -> [whether SDPA would take its math path]


def _probe_math(device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
    q, k, v = torch.empty(3, 1, 64, 1, head_dim, device=device, dtype=dtype).unbind(0)
    return sdpa_fused_backends(q, k, v) == ()


def may_replace_sdpa_math(device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
    """Whether an untuned unmasked call of this dtype and head dim on `device` may run the kernel because SDPA has
    no fused kernel for it, for the host entry points, which decide before the op sees the call's views (the op's
    plan then decides per call): PyTorch is asked about contiguous views of 64 tokens."""
    if not _replacing_sdpa_math() or dtype not in SUPPORTED_DTYPES or head_dim % 8 or not 0 < head_dim <= MAX_HEAD_DIM:
        return False
    if _ext.unavailable_reason(device) is not None or attention_self_check.failed(device, dtype, head_dim):
        return False
    key = (device, dtype, head_dim, sdpa_enabled())
    return _host_math.get_or_compute(key, lambda: [_probe_math(device, dtype, head_dim)])[0]


def untuned_path(device: torch.device, head_dim: int, dtype: torch.dtype = torch.float16) -> str:
    """Which path an untuned unmasked call of this head dim takes on GPU `device`, and why (`python -m rocm_sd
    info`); runs the kernel's self-check where that decides."""
    forced = dispatch.forced_backend(OP)
    if forced is not None:
        return f"{'rocm_sd kernel' if forced == dispatch.KERNEL else 'PyTorch SDPA'}, forced by name (ROCM_SD_BACKEND)"
    q, k, v = torch.empty(3, 2, 256, 2, head_dim, device=device, dtype=dtype).unbind(0)
    fused = sdpa_fused_backends(q, k, v)
    if fused:
        return f"PyTorch SDPA, fused ({', '.join(fused)})"
    if fused is None:
        return "PyTorch SDPA with its own pick (this torch's SDPAParams differ: it cannot be asked for a fused kernel)"
    reasons = supports(q, k, v, default_scale(q))
    if not config.current.replace_sdpa_math:
        why = "ROCM_SD_REPLACE_SDPA_MATH=0"
    elif reasons:
        why = "the kernel cannot take it: " + "; ".join(reasons)
    else:
        check = self_check(q)
        if check["ok"]:
            return "rocm_sd kernel: SDPA has no fused kernel for it (it would take its math path); self-check passed"
        why = f"the kernel failed its self-check: {check['error']}"
    chunked = default_score_budget(head_dim, device.type, torch.version.hip is not None) is not None
    return f"PyTorch SDPA's {'chunked ' if chunked else ''}math path: no fused SDPA kernel, and {why}"


_kernel_chosen = PlanCache()  # device -> whether its tuning database chose anything but SDPA's own pick anywhere


def kernel_may_run(device: torch.device) -> bool:
    """Whether any attention call on `device` could run something other than SDPA with its own backend pick: rocm_sd's
    kernel is asked for by name, or the tuning database chose it, a CK instance or one SDPA backend for some
    attention problem (its nearest-shape lookup may then pick it for other shapes too). When not, every call that
    SDPA has a fused kernel for is PyTorch's SDPA by this op's policy (may_replace_sdpa_math answers for the rest)."""
    forced = dispatch.forced_backend(OP)
    if forced is not None:
        return forced == dispatch.KERNEL
    if device.type != "cuda":
        return False
    return _kernel_chosen.get_or_compute(device, lambda: any(dispatch.chose_anywhere(device, OP, backend)
                                                             for backend in (dispatch.KERNEL, dispatch.CK))
                                         or dispatch.chose_anywhere(device, OP, dispatch.TORCH, variants_only=True))


def host_call_uses_op(q: torch.Tensor, head_dim: int, mask: torch.Tensor | None) -> bool:
    """Whether a host app's attention call (a diffusers processor, ComfyUI's override, A1111's optimization) goes
    to this op rather than straight to SDPA. Masked calls go to SDPA. So does every call where the op would run
    SDPA with its own pick anyway (untuned, with a fused SDPA kernel: the common case), unless something watches
    the op (the tuner's harvest, torch.compile, the profiler): that saves the op's host cost in eager hosts. Calls
    SDPA has no fused kernel for (may_replace_sdpa_math) and the ROCm chunking of large head dims go through it."""
    if mask is not None:
        return False
    if default_score_budget(head_dim, q.device.type, torch.version.hip is not None) is not None or dispatcher_needed():
        return True
    return q.dtype in SUPPORTED_DTYPES and (kernel_may_run(q.device)
                                            or may_replace_sdpa_math(q.device, q.dtype, head_dim))


def scaled_dot_product_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
                                 scale: float | None = None) -> torch.Tensor:
    """The host apps' entry, F.scaled_dot_product_attention's layout: softmax(q k^T * scale + mask) v over
    [B, H, L, D] (strided views welcome); mask broadcastable to [B, H, Lq, Lk] (bool: keep). Through the op
    where host_call_uses_op says so, on [B, L, H, D] views of the same memory (no copies)."""
    if q.dim() != 4 or not host_call_uses_op(q, q.shape[-1], mask):
        if q.dim() == 4 and mask is None:
            dispatch.count(OP, dispatch.TORCH)  # what the op would have run and counted
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, is_causal=False, scale=scale)
    scale = scale if scale is not None else default_scale(q)
    return attention.call(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale).transpose(1, 2)


def _plan(q, k, v, scale) -> Plan:
    """Reasons against the kernel, the choice, and as detail the kernel instance (a rocm_sd instance name, or
    "ck:<name>"). Untuned shapes take the vendor's SDPA (module docstring): a policy, counted as torch with no
    notice; except where SDPA has no fused kernel for the call and the kernel can take it and passed its
    self-check: then the kernel, untuned (also in place of a tuned SDPA backend that cannot take it). A tuned CK
    instance this build or call cannot run gives way to rocm_sd's own kernel."""
    tuned = SPEC.tuned_choice(q, k, v, scale)
    choice = tuned or dispatch.TORCH
    if dispatch.ck_instance(choice) in ck_instances(q.device) and not ck_reasons(q, k, v, scale):
        return Plan([], choice, choice)
    instance = choice.partition(":")[2] if choice.startswith(dispatch.KERNEL + ":") else ""
    reasons = supports(q, k, v, scale, instance)
    # A tuned SDPA backend ("torch:cudnn") that cannot take the call now (switched off since) measured nothing SDPA
    # would run: the call is as good as untuned. Plain "torch" stays: it may have measured the math path itself
    backend = dispatch.torch_variant(tuned)
    backend_gone = bool(backend) and backend not in (sdpa_fused_backends(q, k, v) or ())
    if (tuned is None or backend_gone) and not reasons and replaces_sdpa_math(q, k, v):
        return Plan([], None, "")
    return Plan(reasons, choice, instance)


def _launch(plan: Plan, q, k, v, scale):
    ck = dispatch.ck_instance(plan.detail)
    if ck is not None:
        return attention_ck(ck, q, k, v, scale)
    return attention_kernel(q, k, v, scale, instance=plan.detail)


def _tuned_torch_path(plan: Plan, q, k, v, scale):
    """SDPA restricted to the tuned backend ("torch:<backend>"), else SDPA with its own pick."""
    backend = dispatch.torch_variant(plan.tuned) if dispatch.forced_backend(OP) is None else None
    if backend:
        try:
            return attention_sdpa(q, k, v, scale, backend)
        except RuntimeError:  # a backend tuned at a nearby shape that cannot take this one: SDPA's own pick from now
            plan.tuned, plan.detail = dispatch.TORCH, ""
    return attention_ref(q, k, v, scale)


def _plan_key(q, k, v, scale) -> tuple:
    """The arguments' keys, and what else decides an untuned call's plan: a backend forced by name,
    ROCM_SD_REPLACE_SDPA_MATH, the enabled SDPA backends."""
    return (tensor_key(q), tensor_key(k), tensor_key(v), scale, dispatch.forced_backend(OP),
            config.current.replace_sdpa_math, sdpa_enabled())


def _fake(q, k, v, scale):
    check_args(q, k, v)
    return _output(q, v)


def _key(q, k, v, scale) -> str:
    q, k = as_meta(q), as_meta(k)
    return problem_key(OP, dtype_name(q), "bshd", B=q.shape[0], H=q.shape[2], Lq=q.shape[1], Lk=k.shape[1],
                       D=q.shape[3])


def _candidates(q, k, v, scale) -> dict:
    """SDPA with its own backend pick, each SDPA backend on its own (one that cannot take the shape raises and is
    rejected), each compiled kernel instance that holds the head dim and dtype (block shapes differ), and each
    Composable Kernel instance (ROCm builds with CK only; fp16)."""
    candidates = {dispatch.TORCH: attention_ref}
    for backend in sdpa_backends():
        candidates[f"{dispatch.TORCH}:{backend}"] = lambda *a, _backend=backend: attention_sdpa(*a, _backend)
    meta = [as_meta(t) for t in (q, k, v)]
    if not input_reasons(*meta, scale):
        for name in instances():
            if instance_fits(name, meta[0].dtype, meta[0].shape[-1]):
                candidates[f"rocm_sd:{name}"] = lambda *a, _name=name: attention_kernel(*a, instance=_name)
    if not ck_reasons(*meta, scale):
        for name in ck_instances(device_of(q)):
            candidates[f"{dispatch.CK}:{name}"] = lambda *a, _name=name: attention_ck(_name, *a)
    return candidates


def _samples(device, dtype) -> list[tuple]:
    """Separate q, k, v of head dim 40 with 16 queries and 9 keys, and a packed QKV projection's per-head views."""
    separate = tuple(torch.randn(2, length, 2, 40, device=device, dtype=dtype) for length in (16, 9, 9))
    packed = tuple(torch.randn(2, 16, 3, 2, 64, device=device, dtype=dtype).unbind(2))
    return [separate + (0.125,), packed + (0.125,)]


SPEC = OpSpec(OP, reference=attention_ref, check_args=lambda q, k, v, scale: check_args(q, k, v), fake=_fake,
              supports=supports, plan=_plan, launch=_launch, torch_path=attention_ref,
              tuned_torch_path=_tuned_torch_path,
              plan_key=_plan_key, key=_key,
              candidates=_candidates, samples=_samples, kernel=attention_kernel, ck_instances=ck_instances)


@SPEC.define
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(scale q k^T) v per batch and head, over [batch, seq, heads, head_dim] views."""
