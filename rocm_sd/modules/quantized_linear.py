"""RocmQuantizedLinear: a Linear (or a 1x1 convolution over channels_last activations) as an 8-bit GEMM.

The weight is quantized once, per output channel; the input per row (per token / pixel) on the fly by
rocm_sd::quantize_rows; the GEMM multiplies the 8-bit operands with fp32 accumulation and applies both scales and
the bias in its epilogue, writing the input's dtype:

    fp8  (e4m3fn / e4m3fnuz): torch._scaled_mm with row-wise scales (cuBLASLt / hipBLASLt), fast accumulation
    int8:                     torch._int_mm (int32 accumulators), then scales and bias

Per tensor (fp8, `per_tensor_weight`): where the layer's input comes from a LayerNorm or GEGLU that bounds its output
(patch/precision.py), the input has one scale (a 0-dim tensor) and the weight one too, and torch._scaled_mm runs its
per-tensor GEMM, faster than the row-wise one at SD's narrow layers. A per-tensor operand meeting a row-wise one is
expanded to rows.

Off a GPU (and wherever those GEMMs cannot run) the same product is computed from the dequantized operands in fp32:
the numbers a GPU gives up to accumulation order, which is how the CPU tests check the math.

An input is quantized once, however many layers take it: its (q, scale) travel with the tensor (remember_rows),
so attention's to_q / to_k / to_v share one quantization of the norm's output, and the cross-attention keys and
values of every block one of the text embedding. The norms and the GEGLU in front of these layers write it
themselves (ops/quantized_outputs.py; patch/precision.py says which), so most layers quantize nothing.

Where an 8-bit GEMM does not pay (small layers: its GEMM is no faster, and quantizing its input costs more), the layer
can go back to its fp16 original at its first call: optimize() hands it the original (`offer_fp16`), and the first
call looks up the tuning database's `linear_8bit` problem for the call's shape (tune/linear_8bit.py measures it).
"""
from __future__ import annotations

import math
import weakref
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .. import dispatch
from ..op_names import LINEAR_8BIT
from ..ops.quantize import FORMATS, MIN_AMAX, dequantize_rows, quantize_rows, quantize_rows_ref, row_batches
from ..ops.spec import dtype_name, problem_key
from .fusing import called_plainly


# Layers whose input is one row per image, which stay as they are (an 8-bit GEMM of two rows saves nothing): the time
# and class embeddings and the resnets' time projections, by their names in diffusers and in the ldm lineage.
FEW_ROWS = ("time_embedding", "add_embedding", "class_embedding", "encoder_hid_proj", "time_emb_proj",
            "time_embed", "label_emb", "emb_layers")

# NVIDIA's FP8 tensor cores (sm_89+) accumulate with fewer mantissa bits than fp32; by default cuBLASLt promotes the
# partial sums to fp32 every few k-steps, which costs throughput. Inference engines (TensorRT, torchao, fbgemm) skip
# the promotion, and so does rocm_sd: its error is far below the FP8 rounding of the operands (the tests bound the
# whole layer against float64). MFMA and WMMA accumulate FP8 products in fp32 at full rate, so ROCm builds keep
# torch's default.
FAST_ACCUMULATION = torch.version.hip is None

WEIGHT_ROWS_AT_ONCE = 256  # quantize_weight(per_tensor=True)'s block of output channels
# A producer's bound (patch/precision.py, modules/quantized_conv.py) is taken this much above what the algebra gives:
# the operands' fp8 rounding (at most 2^-4 relative each) and fp16's of the outputs, with room to spare.
BOUND_MARGIN = 1.25

OP = LINEAR_8BIT  # the tuning problem
_REMEMBERED = "_rocm_sd_quantized_rows"
_STAND_IN = "_rocm_sd_rows_stand_in"
_call = [0]  # which model call a remembered quantization belongs to (new_model_call)


def new_model_call(*_) -> None:
    """Forgets every remembered quantization: a forward pre-hook of each quantized model. A quantization is only ever
    used inside the model call that made it, so inside one captured graph, where replays recompute it: one kept
    from an earlier call would be read at its old address by every replay, never refreshed."""
    _call[0] += 1


def _scope(x: torch.Tensor) -> tuple[int, bool]:
    """The model call, and whether x's stream (for a remembered quantization: its q's) is being captured into a graph:
    the warm-up calls before a capture are the same model call, and their quantizations must not be baked into the
    graph either. (Asked of GPU tensors only: a CPU-only torch cannot answer, and a CPU tensor is never in a graph.)"""
    return _call[0], x.is_cuda and torch.cuda.is_current_stream_capturing()


def _version(x: torch.Tensor) -> int | None:
    try:
        return x._version
    except RuntimeError:  # an inference tensor (ComfyUI samples in inference mode) has no version counter
        return None


def remember_rows(x: torch.Tensor, format: str, q: torch.Tensor, scale: torch.Tensor, trusted: bool = False) -> None:
    """Keeps x's per-row quantization on x for the next layers that take x in this model call, while x is unchanged:
    an in-place write bumps its version and the memory is ignored. Inference tensors have no version; their quantization is kept
    only when `trusted` (a norm or GEGLU whose every consumer is a quantized layer: patch/precision.py)."""
    if torch.compiler.is_compiling():
        return
    version = _version(x)
    if version is not None or trusted:
        setattr(x, _REMEMBERED, (format, version, _scope(q), q, scale))


def one_scale(scale: torch.Tensor, bound: float) -> torch.Tensor:
    """A producer's row scales as the GEMM takes them: with a bound every row has the same scale, bound / fmax, and the
    first row's (a 0-dim view) stands for the tensor; without one (or without rows) the rows' own."""
    return scale.reshape(-1)[0] if bound > 0 and scale.numel() else scale


def remembered_rows(x: torch.Tensor, format: str) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(q, scale) of x in `format` as remember_rows kept it, if x has not changed since."""
    memory = getattr(x, _REMEMBERED, None)
    if memory is None or torch.compiler.is_compiling():
        return None
    kept_format, version, scope, q, scale = memory
    return (q, scale) if kept_format == format and scope == _scope(q) and version == _version(x) else None


def rows_stand_in(shape: torch.Size, dtype: torch.dtype, format: str, q: torch.Tensor,
                  scale: torch.Tensor) -> torch.Tensor:
    """What a producer that wrote only its quantized rows (q, scale) returns in place of its output: a tensor of the
    output's shape and dtype holding nothing but those rows, for the 8-bit layers that take them. It lives on the
    meta device, so anything else that reads it fails loudly instead of reading memory nobody wrote."""
    stand_in = torch.empty(shape, dtype=dtype, device="meta")
    remember_rows(stand_in, format, q, scale, trusted=True)
    setattr(stand_in, _STAND_IN, True)  # a meta tensor of a meta run (the tuner's listing) is none
    return stand_in


def rows_device(x: torch.Tensor) -> torch.device:
    """Where x's rows are: x's device, or for a stand-in (rows_stand_in, on meta) its quantized rows'."""
    memory = getattr(x, _REMEMBERED, None) if getattr(x, _STAND_IN, False) else None
    return x.device if memory is None else memory[3].device


# Who quantizes an 8-bit layer's input: quantize_rows, or the kernel writing it (a LayerNorm / SkipLayerNorm, the GEGLU:
# ops/quantized_outputs.py), which costs that kernel less than a quantize_rows pass; "-tensor": with one scale for
# the input (a bound: patch/precision.py) and the weight, multiplied by the per-tensor GEMM.
INPUT_QUANTIZERS = ("rows", "norm", "geglu", "norm-tensor", "geglu-tensor")


def linear_8bit_key(dtype: torch.dtype, format: str, rows: int, in_features: int, out_features: int,
                    sharers: int, quantizer: str) -> str:
    """The tuning problem of an 8-bit layer: 'linear_8bit|float16|e4m3fn|K=1280,N=10240,shared=1,input=norm|M=2048'.
    `sharers`: how many layers take the same quantized input (each is charged its share of quantizing it);
    `quantizer`: who quantizes it (INPUT_QUANTIZERS). Only the rows are the last part, which the database's nearest
    lookup compares (tune/db.py): another resolution takes the same layer's nearest tuned rows, and a layer shape that
    was never tuned finds nothing and stays 8-bit."""
    layer = problem_key(OP, str(dtype).removeprefix("torch."), format, K=in_features, N=out_features,
                        shared=sharers, input=quantizer)
    return f"{layer}|M={rows}"


def input_sharing(x: torch.Tensor, sharers: int, quantizer: str) -> tuple[int, str]:
    """(sharers, quantizer) of x's quantization as it will really happen: an input the layers quantize themselves is
    shared only when remember_rows can keep it, which an inference tensor (no version counter) it cannot."""
    return (1 if quantizer == "rows" and _version(x) is None else sharers), quantizer


def linear_8bit_problem(x: torch.Tensor, format: str, in_features: int, out_features: int, sharers: int,
                        quantizer: str) -> str:
    """The tuning problem of an 8-bit layer of these features taking x, its quantization as it will really happen."""
    return linear_8bit_key(x.dtype, format, x.numel() // in_features, in_features, out_features,
                           *input_sharing(x, sharers, quantizer))


def fp16_measured_faster(x: torch.Tensor, problem: str) -> bool:
    """Whether the tuning database chose the fp16 GEMM for `problem` (linear_8bit_problem) on x's device."""
    return dispatch.tuned_choice(x.device, lambda: problem) == dispatch.TORCH


class EightBit(NamedTuple):
    """What an 8-bit linear layer's GEMM multiplies: its quantized weight (N, K), column scales (1, N), bias, format."""
    in_features: int
    weight_q: torch.Tensor
    weight_scale: torch.Tensor
    bias: torch.Tensor | None
    format: str

    def output_block(self, start: int, stop: int) -> "EightBit | None":
        """The GEMM of output features [start, stop): the weight's rows (a contiguous view), their column scales and
        bias. None where the block does not start on a GEMM boundary (_BLOCK_ALIGNMENT)."""
        if not (_on_boundary(start, stop - start) and 0 <= start < stop <= self.weight_q.shape[0]):
            return None
        scale = self.weight_scale if self.weight_scale.numel() == 1 else self.weight_scale[:, start:stop]
        return EightBit(self.in_features, self.weight_q[start:stop], scale,
                        None if self.bias is None else self.bias[start:stop], self.format)

    def input_block(self, start: int, stop: int) -> "EightBit | None":
        """The GEMM of input features [start, stop) (x's columns, quantized per row on their own): the weight's
        columns, a view whose leading dimension stays the whole row (torch._scaled_mm and torch._int_mm take it
        as it is), every column scale, and the bias with the first block only; the blocks' products sum to the layer's.
        None where the block does not start on a GEMM boundary (_BLOCK_ALIGNMENT)."""
        if not (_on_boundary(start, stop - start) and 0 <= start < stop <= self.in_features):
            return None
        return EightBit(stop - start, self.weight_q[:, start:stop], self.weight_scale,
                        self.bias if start == 0 else None, self.format)


# The 8-bit GEMMs take operands starting on 16 bytes and inner dimensions of multiples of 16 (cuBLASLt's and
# hipBLASLt's fp8 kernels; torch._int_mm asks for 8).
_BLOCK_ALIGNMENT = 16


def _on_boundary(start: int, width: int) -> bool:
    return start % _BLOCK_ALIGNMENT == 0 and width % _BLOCK_ALIGNMENT == 0


def eight_bit(layer: nn.Module, x: torch.Tensor | None = None) -> EightBit | None:
    """The operands of `layer`'s 8-bit GEMM where its call on x (or on a stand-in of x's rows: rows_stand_in) runs that
    GEMM as the product of x's rows: a RocmQuantizedLinear (not a 1x1 convolution) with no fp16 offer left to decide and
    not gone back to fp16, or, given x, a host's layer copied as an 8-bit one (QuantizedHostCopy) where the host leaves
    this call to it; with no hooks. Else None (its own forward runs it)."""
    if not called_plainly(layer):
        return None
    if type(layer) is RocmQuantizedLinear:
        if not layer.runs_8bit or layer.conv:
            return None
        return EightBit(layer.in_features, layer.weight_q, layer.weight_scale, layer.bias, layer.format)
    if x is not None and isinstance(layer, QuantizedHostCopy):
        return layer.rocm_sd_eight_bit(x)
    return None


def takes_rows_for_good(layers, format: str, x: torch.Tensor | None = None) -> bool:
    """Whether every one of `layers` is an 8-bit linear layer of `format` that multiplies its producer's quantized rows
    from now on (eight_bit). A producer can then write only its rows for them (modules/geglu.py,
    modules/transformer.py, modules/mmdit_8bit.py). With x (the producer's output as it would be, or its input of that
    shape and dtype), a host's 8-bit copies count too: the host decides per call whether a copy runs its GEMM
    (offloaded or patched weights), so for them "for good" holds for this call."""
    return all((way := eight_bit(layer, x)) is not None and way.format == format for layer in layers)


class RocmQuantizedLinear(nn.Module):
    """Holds the 8-bit weight (`weight_q`, `weight_scale` buffers) and the original bias (the `bias` parameter); once
    its first call has found fp16 the faster (offer_fp16), the original layer (`fp16_layer`) instead."""

    input_sharers = 1  # layers taking the same quantized input (patch/precision.py): the tuning problem's `shared`
    input_quantizer = "rows"  # who quantizes that input (INPUT_QUANTIZERS; patch/precision.py): its `input`

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, format: str, conv: bool = False):
        super().__init__()
        if format not in FORMATS:
            raise ValueError(f"RocmQuantizedLinear: format {format!r} is not one of {', '.join(FORMATS)}")
        self.conv = conv  # a 1x1 convolution: (N, C, H, W) in and out
        self._hold(*quantize_weight(weight, format), bias, format)

    def _hold(self, weight_q: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None,
              format: str) -> None:
        self.format = format
        self.out_features, self.in_features = weight_q.shape
        self.register_buffer("weight_q", weight_q)
        self.register_buffer("weight_scale", weight_scale)  # (1, N): the GEMM's column scales
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)
        self.fp16_layer: nn.Module | None = None  # the original layer, once measured faster (offer_fp16)

    @classmethod
    def from_module(cls, module: nn.Module, format: str) -> "RocmQuantizedLinear":
        return cls(module.weight, module.bias, format, conv=isinstance(module, nn.Conv2d))

    @classmethod
    def from_quantized(cls, weight_q: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None,
                       format: str) -> "RocmQuantizedLinear":
        """A layer of an already quantized weight: weight_q (N, K) (made contiguous), its column scales (1, N)."""
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer.conv = False
        layer._hold(weight_q.contiguous(), weight_scale, bias, format)
        return layer

    def extra_repr(self) -> str:
        kind = "conv1x1" if self.conv else "linear"
        kept = ", kept in the model's dtype (measured faster)" if self.fp16_layer is not None else ""
        return f"{kind}, in={self.in_features}, out={self.out_features}, format={self.format}{kept}"

    def per_tensor_weight(self, weight: torch.Tensor) -> None:
        """Quantizes `weight` (the original layer's) again with one scale for the whole tensor (fp8 only)."""
        if self.format == "int8":
            raise ValueError("RocmQuantizedLinear: int8 weights are quantized per output channel only")
        q, scale = quantize_weight(weight.to(self.weight_q.device), self.format, per_tensor=True)
        self.weight_q, self.weight_scale = q, scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.conv and x.dim() != 4:
            raise ValueError(f"RocmQuantizedLinear (1x1 convolution): input of shape {tuple(x.shape)} is not 4-D")
        if not self.conv and x.shape[-1] != self.in_features:
            raise ValueError(f"RocmQuantizedLinear: input of shape {tuple(x.shape)} does not end in "
                             f"{self.in_features} features")
        if "_fp16_offer" in self.__dict__ and x.numel() and not _scope(x)[1]:  # never in a capture: warm-ups decide
            self._choose(x, *self.__dict__.pop("_fp16_offer"))
        if self.fp16_layer is not None:
            return self.fp16_layer(x)
        return forward_8bit(x, self.conv, self.in_features, self.weight_q, self.weight_scale, self.bias, self.format)

    @property
    def runs_8bit(self) -> bool:
        """Whether every call from now on runs the 8-bit GEMM: no fp16 offer left to decide at a first call, and not
        gone back to fp16."""
        return "_fp16_offer" not in self.__dict__ and self.fp16_layer is None

    def multiply_rows(self, q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The layer's output (in `dtype`) for input rows its producer already quantized in its format: q (...,
        in_features), scale (...)."""
        out = linear_8bit(q.reshape(-1, self.in_features), scale if scale.dim() == 0 else scale.reshape(-1),
                          self.weight_q, self.weight_scale, self.bias, self.format, dtype)
        return out.view(*q.shape[:-1], self.out_features)

    def offer_fp16(self, original: nn.Module, producers: list[nn.Module], counts) -> None:
        """Lets the first call go back to `original` (the fp16 layer, waiting in CPU memory) if the tuning database
        measured fp16 faster for the call's shape; the `producers` writing this layer's input quantized then stop
        (their `quantized_output`), and `counts` (the optimize report's) says so. Plain attributes, not submodules:
        the original is no part of this layer until chosen, and copies of the model copy them along."""
        self.__dict__["_fp16_offer"] = (original, producers, counts)

    def problem_key(self, x: torch.Tensor) -> str:
        return linear_8bit_problem(x, self.format, self.in_features, self.out_features, self.input_sharers,
                                   self.input_quantizer)

    def _choose(self, x: torch.Tensor, original: nn.Module, producers: list[nn.Module], counts) -> None:
        if not fp16_measured_faster(x, self.problem_key(x)):
            return
        self.fp16_layer = original.to(x.device)
        self.weight_q = self.weight_scale = None  # the 8-bit weight is freed
        for producer in producers:
            producer.quantized_output = None
        kind = "conv1x1" if self.conv else "linear"
        counts[f"{kind} -> {self.format} GEMM"] -= 1
        counts[f"{kind} kept in {dtype_name(x)} (measured faster than {self.format})"] += 1


class RocmQuantizedSplitLinear(nn.Module):
    """A Linear whose input is two tensors side by side (Flux's single blocks' proj_out takes the attention output
    and the MLP's, concatenated) as two 8-bit layers over its weight's column blocks, `first` (with the bias) and
    `second`: their outputs' sum is the layer's, and no concatenation is written. The weight is quantized once, per
    output channel over the whole row, then split, so each block dequantizes to the original's columns exactly; each
    input is quantized per row on its own. Each half is a RocmQuantizedLinear of its own, with its own measured fp16
    fallback (offer_fp16) and tuning problem."""

    def __init__(self, linear: nn.Linear, width: int, format: str):
        super().__init__()
        if not 0 < width < linear.in_features:
            raise ValueError(f"RocmQuantizedSplitLinear: split at {width} is not inside {linear.in_features} features")
        self.width, self.in_features, self.out_features = width, linear.in_features, linear.out_features
        q, scale = quantize_weight(linear.weight, format)
        self.first = RocmQuantizedLinear.from_quantized(q[:, :width], scale, linear.bias, format)
        self.second = RocmQuantizedLinear.from_quantized(q[:, width:], scale, None, format)

    def originals(self, linear: nn.Linear) -> tuple[nn.Linear, nn.Linear]:
        """The halves of `linear` (the layer this one replaced) as Linear layers: the fp16 layers each half can go
        back to (offer_fp16). Views of its weight, so they cost no memory until one is chosen."""
        first = nn.Linear(self.width, self.out_features, bias=linear.bias is not None, device="meta")
        second = nn.Linear(self.in_features - self.width, self.out_features, bias=False, device="meta")
        first.weight = nn.Parameter(linear.weight.detach()[:, :self.width], requires_grad=False)
        second.weight = nn.Parameter(linear.weight.detach()[:, self.width:], requires_grad=False)
        if linear.bias is not None:
            first.bias = nn.Parameter(linear.bias.detach(), requires_grad=False)
        return first, second

    def extra_repr(self) -> str:
        return f"in={self.in_features} split at {self.width}, out={self.out_features}"

    def forward_parts(self, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
        """The layer of cat([first, second], -1), without the concatenation."""
        return self.first(first).add_(self.second(second))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_parts(x[..., :self.width], x[..., self.width:])


def forward_8bit(x: torch.Tensor, conv: bool, in_features: int, weight_q: torch.Tensor, weight_scale: torch.Tensor,
                 bias: torch.Tensor | None, format: str) -> torch.Tensor:
    """A Linear over x's last dimension, or with `conv` a 1x1 convolution of (N, C, H, W) x, as the 8-bit GEMM of
    x's rows (with x's remembered quantization if it has one) and the quantized weight."""
    if conv:
        rows = x.permute(0, 2, 3, 1)  # a view for channels_last input, which the convolution patches keep
        flat = rows.reshape(-1, in_features)
        out = linear_8bit(*input_rows(x, flat, format), weight_q, weight_scale, bias, format, x.dtype)
        return out.view(*rows.shape[:-1], weight_q.shape[0]).permute(0, 3, 1, 2)
    out = linear_8bit(*input_rows(x, _gemm_rows(x, in_features), format), weight_q, weight_scale, bias, format,
                      x.dtype)
    return out.view(*x.shape[:-1], weight_q.shape[0])


def forward_8bit_blocks(x: torch.Tensor, blocks: list[EightBit]) -> list[torch.Tensor]:
    """forward_8bit of x through each of `blocks` (EightBit.output_block of one layer), x quantized once for all: one
    output tensor (..., its features) per block."""
    q, scale = input_rows(x, _gemm_rows(x, blocks[0].in_features), blocks[0].format)
    return [linear_8bit(q, scale, b.weight_q, b.weight_scale, b.bias, b.format, x.dtype).view(
        *x.shape[:-1], b.weight_q.shape[0]) for b in blocks]


def forward_8bit_parts(parts: list[torch.Tensor], blocks: list[EightBit]) -> torch.Tensor:
    """The layer of cat(parts, -1) as the sum of each part's forward_8bit through its block (EightBit.input_block):
    no concatenation written, each part quantized per row on its own (or as its producer wrote it)."""
    out = None
    for x, b in zip(parts, blocks):
        y = forward_8bit(x, False, b.in_features, b.weight_q, b.weight_scale, b.bias, b.format)
        out = y if out is None else out.add_(y)
    return out


def _gemm_rows(x: torch.Tensor, in_features: int) -> torch.Tensor:
    """x's rows as quantize_rows reads them: x itself where they are batches of contiguous rows (a joint attention
    output's image or text rows, quantized where they lie), else x as (M, K)."""
    return x if row_batches(x) not in (None, (0, 0)) else x.reshape(-1, in_features)


def forward_8bit_into(x: torch.Tensor, in_features: int, weight_q: torch.Tensor, weight_scale: torch.Tensor,
                      bias: torch.Tensor | None, format: str, out: torch.Tensor) -> None:
    """forward_8bit of a (B, L, K) x written into `out`, a (B, L, N) view whose batches each are L contiguous rows (a
    stream's part of a joint buffer, modules/joint_rows.py): one GEMM a batch, each writing its rows in place."""
    q, scale = input_rows(x, _gemm_rows(x, in_features), format)
    length = x.shape[1]
    for b in range(x.shape[0]):
        rows = slice(b * length, (b + 1) * length)
        linear_8bit(q[rows], scale if scale.dim() == 0 else scale[rows], weight_q, weight_scale, bias, format,
                    out.dtype, out=out[b])


def quantizable_weight(weight) -> bool:
    """A plain floating-point weight (fp8 storage included); not a tensor subclass such as a host's own quantized
    layout, whose values only its own forward knows how to read."""
    return type(weight) in (nn.Parameter, torch.Tensor) and weight.dtype.is_floating_point


def quantize_weight(weight: torch.Tensor, format: str, per_tensor: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """A Linear's (N, K) weight, or a 1x1 convolution's (N, K, 1, 1), quantized per output channel: (q (N, K), the
    GEMM's column scales (1, N)); with `per_tensor`, with one scale: (q, (1, 1)). Weights a host stores in fp8 itself
    are read in fp32."""
    rows = weight.detach().reshape(weight.shape[0], -1)
    rows = rows.float() if rows.element_size() == 1 else rows
    if per_tensor:
        # The tensor's max as every row's bound, a block of rows at a time: quantize_rows_ref's fp32 temporaries of
        # the largest weights at once would add ~200 MB to optimize()'s peak. (Empty or non-finite weights: at once.)
        bound = max(rows.abs().amax().item(), MIN_AMAX) if rows.numel() else 0.0
        if not math.isfinite(bound) or bound <= 0:
            q, scale = quantize_rows_ref(rows.reshape(1, -1), format)
            return q.view(rows.shape), scale.view(1, 1)
        q = torch.cat([quantize_rows_ref(block, format, bound)[0] for block in rows.split(WEIGHT_ROWS_AT_ONCE)])
        return q, quantize_rows_ref(rows[:1], format, bound)[1].view(1, 1)
    q, scale = quantize_rows_ref(rows, format)
    return q, scale.unsqueeze(0)


def input_rows(x: torch.Tensor, rows: torch.Tensor, format: str) -> tuple[torch.Tensor, torch.Tensor]:
    """x's rows (`rows`: x as (M, K), a view or a copy, or x itself where quantize_rows reads its row batches in
    place) quantized: (q (M, K), scale (M,)), from x's remembered quantization if it has one, else by
    rocm_sd::quantize_rows, remembered for the next layers that take x."""
    quantized = remembered_rows(x, format)
    if quantized is None:
        if getattr(x, _STAND_IN, False):
            raise RuntimeError(f"rocm_sd: an 8-bit layer got a stand-in (rows_stand_in) without its {format} rows: the "
                               "producer wrote no output for this layer to read")
        quantized = quantize_rows.call(rows if row_batches(rows) is not None else rows.contiguous(), format)
        remember_rows(x, format, *quantized)
    q, scale = quantized
    k = rows.shape[-1]
    return q.reshape(-1, k), scale if scale.dim() == 0 else scale.reshape(-1)


def _aligned(scale: torch.Tensor) -> torch.Tensor:
    """A contiguous row-scale vector on a 16-byte boundary, as cuBLASLt's row-wise fp8 GEMM needs (it answers
    CUBLAS_STATUS_NOT_SUPPORTED otherwise): one batch's scales sliced from a joint sequence's (the second batch's of
    333 text rows start 1332 bytes in) are copied."""
    if scale.is_contiguous() and scale.data_ptr() % 16 == 0:
        return scale
    return scale.clone(memory_format=torch.contiguous_format)


def linear_8bit(q: torch.Tensor, scale: torch.Tensor, weight_q: torch.Tensor, weight_scale: torch.Tensor,
                bias: torch.Tensor | None, format: str, dtype: torch.dtype,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """(q * scale) @ (weight_q * weight_scale).T + bias in `dtype`: the 8-bit GEMM on a GPU, the same product of the
    dequantized operands in fp32 elsewhere. scale: (M,) per row or 0-dim per tensor; weight_scale: (1, N) per output
    channel or (1, 1) per tensor. Both per tensor: the per-tensor GEMM; else the row-wise one. `out`: a contiguous
    (M, N) tensor of `dtype` to write the product into (returned), else a new one."""
    if bias is not None and bias.dtype != dtype:
        bias = bias.to(dtype)  # a host that stores its weights in another dtype casts per call too
    if q.is_cuda and q.shape[0] > 0 and format != "int8":
        if scale.dim() == 0 and weight_scale.numel() == 1:
            return torch._scaled_mm(q, weight_q.t(), scale_a=scale, scale_b=weight_scale.reshape(()), bias=bias,
                                    out_dtype=dtype, use_fast_accum=FAST_ACCUMULATION, out=out)
        scale = scale.expand(q.shape[0]) if scale.dim() == 0 else scale
        if weight_scale.numel() == 1:
            weight_scale = weight_scale.expand(1, weight_q.shape[0]).contiguous()
        return torch._scaled_mm(q, weight_q.t(), scale_a=_aligned(scale.unsqueeze(1)), scale_b=weight_scale,
                                bias=bias, out_dtype=dtype, use_fast_accum=FAST_ACCUMULATION, out=out)
    if q.is_cuda and q.shape[0] > 16:  # int8: torch._int_mm's smallest M
        acc = torch._int_mm(q, weight_q.t())
        # Two passes over the int32 product (not five): the row scale makes it fp32, then one pass applies the column
        # scale and the bias in fp32 and writes `dtype`.
        rows_scaled = torch.mul(acc, scale.unsqueeze(1))
        if out is None:
            out = torch.empty(acc.shape, dtype=dtype, device=acc.device)
        if bias is None:
            return torch.mul(rows_scaled, weight_scale, out=out)
        return torch.addcmul(bias, rows_scaled, weight_scale, out=out)
    product = F.linear(dequantize_rows(q, scale), dequantize_rows(weight_q, weight_scale.squeeze(0)),
                       None if bias is None else bias.float())
    return product.to(dtype) if out is None else out.copy_(product)


class QuantizedHostCopy:
    """Mixed into a copy of a host app's own Linear or 1x1 Conv2d (modules/host_copies.quantized_linear_copy): its
    forward as the 8-bit GEMM of the module's weight as the host has it now.

    Like the other host copies, it shares the module's attribute dictionary: the host's per-module bookkeeping
    (ComfyUI's patched-weights and low-VRAM flags, its weight functions) is read from the module at call time,
    whichever face the host set it through. The copy's own settings are slots.

    The host keeps its weights its own way: ComfyUI patches LoRA into them (a new Parameter on this copy), offloads
    and reloads them, may store them in fp8 itself. So the weight is quantized from the current Parameter, again
    whenever the host has replaced it or changed it in place (rocm_sd_refresh), into non-persistent buffers of the
    module, one pair per 8-bit format (two copies of one module in different formats do not clash), with the record
    of which weight they hold beside them: they move with the module when the host offloads it, stay out of its
    state_dict (saved checkpoints) and of its LoRA key maps, and are part of a graph's signature (graphs.py refreshes
    them before each call, so a graph never replays a quantization of other weights). Weights a host changes in
    place inside inference mode carry no version and go unnoticed until they are replaced. Calls the host takes on
    its own path (rocm_sd_host_path: weights cast or streamed per call, LoRA applied in the forward) and inputs the
    GEMM does not take run the host's forward."""

    rocm_sd_format: str
    rocm_sd_conv: bool
    rocm_sd_fp16: bool  # the tuning database measured fp16 faster at this copy's first call: the host's forward

    @property
    def _rocm_sd_names(self) -> tuple[str, str, str]:
        """The module's buffer names of this format's 8-bit weight and scale, and its dictionary key of their source."""
        fmt = self.rocm_sd_format
        return f"rocm_sd_weight_q_{fmt}", f"rocm_sd_weight_scale_{fmt}", f"_rocm_sd_source_{fmt}"

    @property
    def rocm_sd_weight_q(self) -> torch.Tensor | None:
        return self._buffers.get(self._rocm_sd_names[0])

    @property
    def rocm_sd_weight_scale(self) -> torch.Tensor | None:
        return self._buffers.get(self._rocm_sd_names[1])

    def rocm_sd_refresh(self) -> None:
        """graphs.GraphedCall's hook, before it compares signatures."""
        if (not self.rocm_sd_host_path(self) and quantizable_weight(self.weight)  # else the host's forward runs
                and not self.rocm_sd_fp16):
            self._rocm_sd_quantize_if_stale()

    def rocm_sd_offer_fp16(self, sharers: int, producers: list[nn.Module]) -> None:
        """RocmQuantizedLinear.offer_fp16 for a host's layer: at the first call it takes, if the tuning database
        measured fp16 faster for the call's shape, the layer runs the host's own forward from then on (its 8-bit
        weight freed) and the `producers` writing its input quantized stop (`rocm_sd_quantized_output`)."""
        object.__setattr__(self, "rocm_sd_fp16_offer", (sharers, producers))

    @property
    def _rocm_sd_features(self) -> tuple[int, int]:
        """(in, out) features of the GEMM: a Linear's, or a 1x1 convolution's channels."""
        return (self.in_channels, self.out_channels) if self.rocm_sd_conv else (self.in_features, self.out_features)

    def _rocm_sd_choose(self, x: torch.Tensor, sharers: int, producers: list[nn.Module]) -> None:
        problem = linear_8bit_problem(x, self.rocm_sd_format, *self._rocm_sd_features, sharers,
                                      "norm" if producers else "rows")
        if not fp16_measured_faster(x, problem):
            return
        object.__setattr__(self, "rocm_sd_fp16", True)
        q_name, scale_name, source_key = self._rocm_sd_names
        self.__dict__.pop(source_key, None)
        for name in (q_name, scale_name):
            self.register_buffer(name, None, persistent=False)  # freed; a registration: graphs walk the model again
        for producer in producers:
            producer.rocm_sd_quantized_output = None

    def _rocm_sd_quantize_if_stale(self) -> None:
        weight = self.weight
        q_name, scale_name, source_key = self._rocm_sd_names
        source = self.__dict__.get(source_key)
        if (source is not None and source[0]() is weight and source[1] == _version(weight)
                and self._buffers.get(q_name) is not None):
            return
        q, scale = quantize_weight(weight, self.rocm_sd_format)
        # New tensors, not copies into the old ones: a graph captured on the old quantization must not match.
        self.register_buffer(q_name, q, persistent=False)
        self.register_buffer(scale_name, scale, persistent=False)
        self.__dict__[source_key] = (weakref.ref(weight), _version(weight))

    def _rocm_sd_takes(self, x: torch.Tensor) -> bool:
        if (self.rocm_sd_host_path(self) or torch.compiler.is_compiling() or not quantizable_weight(self.weight)
                or rows_device(x) != self.weight.device
                or x.dtype not in (torch.float16, torch.bfloat16, torch.float32)):
            return False
        if self.rocm_sd_conv:
            return x.dim() == 4 and x.shape[1] == self.in_channels
        return x.dim() >= 1 and x.shape[-1] == self.in_features

    def rocm_sd_eight_bit(self, x: torch.Tensor) -> EightBit | None:
        """eight_bit for this copy: its GEMM's operands (the weight quantized again if the host changed it) where its
        call on x runs the 8-bit GEMM with no first-call fp16 decision left to make, else None."""
        if (self.rocm_sd_conv or self.rocm_sd_fp16 or self.rocm_sd_fp16_offer is not None
                or not self._rocm_sd_takes(x)):
            return None
        self._rocm_sd_quantize_if_stale()
        return EightBit(self.in_features, self.rocm_sd_weight_q, self.rocm_sd_weight_scale, self.bias,
                        self.rocm_sd_format)

    def rocm_sd_decide(self, x: torch.Tensor) -> None:
        """The first call's choice (rocm_sd_offer_fp16) for an input of x's shape, made as the copy's forward makes it,
        for a caller that runs the copy's GEMM itself (eight_bit) from its first call on."""
        offer = self.rocm_sd_fp16_offer
        if offer is not None and x.numel() and not _scope(x)[1] and self._rocm_sd_takes(x):  # never inside a capture
            object.__setattr__(self, "rocm_sd_fp16_offer", None)
            self._rocm_sd_choose(x, *offer)

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        if args or kwargs or not self._rocm_sd_takes(x):  # arguments of a host's own forward: its own path
            return super().forward(x, *args, **kwargs)
        self.rocm_sd_decide(x)
        if self.rocm_sd_fp16:
            return super().forward(x)
        self._rocm_sd_quantize_if_stale()
        return forward_8bit(x, self.rocm_sd_conv, self._rocm_sd_features[0], self.rocm_sd_weight_q,
                            self.rocm_sd_weight_scale, self.bias, self.rocm_sd_format)
