"""rocm_sd::ada_layer_norm: the AdaLN-Zero modulation of diffusion transformers (SD3 / SD3.5 MMDiT, Flux), LayerNorm
without affine parameters and the per-sample modulation in one pass (hip/ada_layer_norm/ada_layer_norm.hip):

    y = layer_norm(x) * (1 + scale[:, None, :]) + shift[:, None, :]     x: (B, L, C) contiguous; scale, shift: (B, C)

rocm_sd::add_ada_layer_norm: its gated-residual form, the block's "h = h + gate * attn_out; n = norm2(h) * (1 +
scale) + shift" in one pass (the DiT analogue of add_layer_norm):

    h = x + gate[:, None, :] * y;  n = ada_layer_norm(h, scale, shift)      returns (h, n)

scale, shift and gate may have any strides: they are views of chunk() of one embedding (B, k * C).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import _ext, dispatch
from ._checks import check_broadcasts_to, check_floating, check_same_device, fail
from ._common import DTYPE_CODES, dtype_reasons, stream_handle
from .layer_norm import _residual_reasons
from .spec import OpSpec, as_meta, dtype_name, kernel_reasons, layout_name, problem_key, tensor_key

OP = "ada_layer_norm"


def ada_layer_norm_ref(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, eps: float) -> torch.Tensor:
    """What diffusers' SD3 / Flux blocks compute, op for op in the input dtype (AdaLayerNormZero's
    `norm(x) * (1 + scale[:, None]) + shift[:, None]`, the norm without affine parameters); differentiable."""
    return F.layer_norm(x, (x.shape[-1],), None, None, eps) * (1 + scale[:, None]) + shift[:, None]


def _check_modulation(op: str, x: torch.Tensor, **params: torch.Tensor) -> None:
    """Each (B, C) parameter broadcasts over x's tokens as `p[:, None]` without enlarging x."""
    for name, p in params.items():
        if p.dim() != 2:
            fail(op, f"{name} of shape {tuple(p.shape)} is not (B, C)")
        try:
            broadcast = torch.broadcast_shapes(p[:, None].shape, x.shape)
        except RuntimeError:
            broadcast = None
        if broadcast != x.shape:
            fail(op, f"{name} of shape {tuple(p.shape)} does not broadcast over the tokens of the input's shape "
                     f"{tuple(x.shape)}")


def check_args(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, op: str = OP) -> torch.dtype:
    """Raises what the reference's PyTorch ops would raise (and for anything but a (B, L, C) input, whose output
    shape the op states); returns the output dtype (PyTorch's type promotion)."""
    check_floating(op, input=x, scale=scale, shift=shift)
    if x.dim() != 3:
        fail(op, f"input of shape {tuple(x.shape)} has {x.dim()} dims, expected (B, L, C)")
    check_same_device(op, x, scale=scale, shift=shift)
    _check_modulation(op, x, scale=scale, shift=shift)
    return torch.promote_types(torch.promote_types(x.dtype, scale.dtype), shift.dtype)


def _param_reasons(x: torch.Tensor, **params: torch.Tensor) -> list[str]:
    reasons = []
    for name, p in params.items():
        if p.shape != (x.shape[0], x.shape[-1]):
            reasons.append(f"{name} of shape {tuple(p.shape)} is not ({x.shape[0]}, {x.shape[-1]})")
        if p.dtype != x.dtype:
            reasons.append(f"{name} dtype {p.dtype} differs from the input's {x.dtype}")
        if p.device != x.device:
            reasons.append(f"{name} on {p.device}, input on {x.device}")
    return reasons


def input_reasons(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> list[str]:
    reasons = dtype_reasons(x.dtype)
    if x.numel() == 0:
        reasons.append("empty tensor")
    if not x.is_contiguous():
        reasons.append(f"strides {tuple(x.stride())} are not contiguous")
    return reasons + _param_reasons(x, scale=scale, shift=shift)


def _args(x, out, scale, shift, eps):
    b, tokens, c = x.shape
    return (x.data_ptr(), out.data_ptr(), scale.data_ptr(), shift.data_ptr(), DTYPE_CODES[x.dtype], b, tokens, c,
            scale.stride(), shift.stride(), float(eps))


def _gate_args(y, gate, h):
    return {"y": y.data_ptr(), "gate": gate.data_ptr(), "gate_stride": gate.stride(), "h": h.data_ptr()}


def supports(x, scale, shift, eps) -> list[str]:
    """Reasons the kernel cannot run this call; empty when it can."""
    return kernel_reasons(x.device, input_reasons(x, scale, shift),
                          lambda: _ext._C.ada_layer_norm_check(*_args(x, x, scale, shift, eps), x.device.index))


def ada_layer_norm_kernel(x, scale, shift, eps, out=None):
    """The HIP kernel itself, no dispatch; `out` may be x (each element is read before it is written, by the same
    thread), never scale or shift."""
    y = torch.empty_like(x) if out is None else out
    _ext._C.ada_layer_norm_forward(*_args(x, y, scale, shift, eps), stream_handle(x.device), x.device.index)
    return y


def _torch_path(x, scale, shift, eps):
    """The reference, contiguous as the kernel's output."""
    return ada_layer_norm_ref(x, scale, shift, eps).contiguous()


def _fake(x, scale, shift, eps):
    dtype = check_args(x, scale, shift)
    return torch.empty_like(x, dtype=dtype, memory_format=torch.contiguous_format)


def _key(x, *params, op=OP) -> str:
    x = as_meta(x)
    return problem_key(op, dtype_name(x), layout_name(x), rows=x.numel() // max(x.shape[-1], 1), D=x.shape[-1])


def _embedding_chunks(batch: int, c: int, device, dtype, chunks: int = 6) -> tuple[torch.Tensor, ...]:
    """(batch, c) views of one (batch, chunks * c) embedding, as AdaLayerNormZero's `emb.chunk(6, dim=1)`: strides
    (chunks * c, 1)."""
    return torch.randn(batch, chunks * c, device=device, dtype=dtype).chunk(chunks, dim=1)


def _samples(device, dtype) -> list[tuple]:
    """Modulations as chunks of one embedding; 320 channels (the kernel's vectors) and 33 (its scalar tail)."""
    samples = []
    for c in (320, 33):
        shift, scale = _embedding_chunks(2, c, device, dtype)[:2]
        samples.append((torch.randn(2, 8, c, device=device, dtype=dtype), scale, shift, 1e-6))
    return samples


SPEC = OpSpec(OP, reference=ada_layer_norm_ref, check_args=lambda x, scale, shift, eps: check_args(x, scale, shift),
              fake=_fake, supports=supports, launch=lambda plan, *args: ada_layer_norm_kernel(*args),
              torch_path=_torch_path,
              plan_key=lambda x, scale, shift, eps: (tensor_key(x), tensor_key(scale), tensor_key(shift)),
              key=lambda x, scale, shift, eps: _key(x),
              candidates=lambda *args: {dispatch.TORCH: ada_layer_norm_ref, "rocm_sd": ada_layer_norm_kernel},
              samples=_samples, kernel=ada_layer_norm_kernel)


@SPEC.define
def ada_layer_norm(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, eps: float) -> torch.Tensor:
    """layer_norm(x) * (1 + scale[:, None]) + shift[:, None]."""


# ---- add_ada_layer_norm ---------------------------------------------------------------------------------------

ADD_OP = "add_ada_layer_norm"


def add_ada_layer_norm_ref(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor, scale: torch.Tensor,
                           shift: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + gate[:, None] * y, its ada_layer_norm): the gated residual of diffusers' SD3 / Flux blocks, then the next
    norm's modulation."""
    h = x + gate.unsqueeze(1) * y
    return h, ada_layer_norm_ref(h, scale, shift, eps)


def check_add_args(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor, scale: torch.Tensor,
                   shift: torch.Tensor, op: str = ADD_OP) -> tuple[torch.dtype, torch.dtype]:
    """Raises what the reference's PyTorch ops would raise; returns the dtypes of h and n (type promotion)."""
    check_floating(op, y=y, gate=gate)
    check_args(x, scale, shift, op)  # h has x's shape and device
    check_same_device(op, x, y=y, gate=gate)
    check_broadcasts_to(op, "y", y, x)
    _check_modulation(op, x, gate=gate)
    h = torch.promote_types(x.dtype, torch.promote_types(gate.dtype, y.dtype))
    return h, torch.promote_types(torch.promote_types(h, scale.dtype), shift.dtype)


def add_ada_layer_norm_supports(x, y, gate, scale, shift, eps) -> list[str]:
    """Reasons the kernel cannot run this call; empty when it can."""
    reasons = input_reasons(x, scale, shift) + _residual_reasons(x, y, "y") + _param_reasons(x, gate=gate)
    return kernel_reasons(x.device, reasons,
                          lambda: _ext._C.ada_layer_norm_check(*_args(x, x, scale, shift, eps), x.device.index,
                                                               **_gate_args(y, gate, x)))


def add_ada_layer_norm_kernel(x, y, gate, scale, shift, eps, out=None):
    """The HIP kernel itself, no dispatch; `out`: (h, n) to write into (h may be x: each element is read before it
    is written, by the same thread; neither may be a parameter)."""
    h, n = (torch.empty_like(x), torch.empty_like(x)) if out is None else out
    _ext._C.ada_layer_norm_forward(*_args(x, n, scale, shift, eps), stream_handle(x.device), x.device.index,
                                   **_gate_args(y, gate, h))
    return h, n


def _add_torch_path(x, y, gate, scale, shift, eps):
    h = (x + gate.unsqueeze(1) * y).contiguous()
    return h, _torch_path(h, scale, shift, eps)


def _add_fake(x, y, gate, scale, shift, eps):
    h_dtype, n_dtype = check_add_args(x, y, gate, scale, shift)
    return (torch.empty_like(x, dtype=h_dtype, memory_format=torch.contiguous_format),
            torch.empty_like(x, dtype=n_dtype, memory_format=torch.contiguous_format))


def _add_samples(device, dtype) -> list[tuple]:
    samples = []
    for x, scale, shift, eps in _samples(device, dtype):
        gate = _embedding_chunks(x.shape[0], x.shape[-1], device, dtype)[2]
        samples.append((x, torch.randn_like(x), gate, scale, shift, eps))
    return samples


ADD_SPEC = OpSpec(ADD_OP, reference=add_ada_layer_norm_ref,
                  check_args=lambda x, y, gate, scale, shift, eps: check_add_args(x, y, gate, scale, shift),
                  fake=_add_fake, supports=add_ada_layer_norm_supports,
                  launch=lambda plan, *args: add_ada_layer_norm_kernel(*args), torch_path=_add_torch_path,
                  plan_key=lambda x, y, gate, scale, shift, eps: tuple(tensor_key(t) for t in (x, y, gate, scale,
                                                                                               shift)),
                  key=lambda x, *args: _key(x, op=ADD_OP),
                  candidates=lambda *args: {dispatch.TORCH: add_ada_layer_norm_ref,
                                            "rocm_sd": add_ada_layer_norm_kernel},
                  samples=_add_samples, kernel=add_ada_layer_norm_kernel)


@ADD_SPEC.define
def add_ada_layer_norm(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor, scale: torch.Tensor,
                       shift: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + gate[:, None] * y, ada_layer_norm of it)."""
