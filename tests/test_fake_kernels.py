"""Every op's fake (meta) kernel describes what the real op returns, and both refuse the same arguments.

torch.compile builds its graph from the fake kernels: where a fake says another shape, dtype or layout than
the real op returns, the compiled model computes garbage (a bias_residual with an fp16 input and an fp32 bias
once differed from eager by ~1000 under torch.compile). Random shapes, dtypes, broadcasts and layouts, valid and
not, run through both; argument errors are RuntimeErrors naming the op, as PyTorch's own ops raise them.
"""
import random

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from rocm_sd import config

FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
ODD_DTYPES = (torch.int64, torch.bool)


DEVICE = {"name": "cpu"}  # the device the cases build their tensors on (the GPU variant sets it)


def _tensor(rng: random.Random, shape, dtype, channels_last=False):
    if dtype.is_floating_point:
        t = torch.randn(shape).to(dtype)
    else:
        t = torch.randint(0, 3, shape).to(dtype)
    t = t.to(DEVICE["name"])
    return t.to(memory_format=torch.channels_last) if channels_last and len(shape) == 4 else t


def _dtype(rng, mostly=torch.float32):
    roll = rng.random()
    return mostly if roll < 0.6 else rng.choice(FLOATS) if roll < 0.9 else rng.choice(ODD_DTYPES)


def _maybe_broadcast(rng, shape):
    """The same shape, or one with size-1 dims / fewer dims, or an enlarged one (which must be refused)."""
    shape = list(shape)
    roll = rng.random()
    if roll < 0.5:
        return tuple(shape)
    if roll < 0.75:
        return tuple(1 if rng.random() < 0.5 else s for s in shape)
    if roll < 0.85:
        return tuple(shape[1:])
    shape[0] += 1
    return tuple(shape)


def case_group_norm(rng):
    n, groups = rng.randint(1, 3), rng.choice([1, 2, 3])
    c = groups * rng.randint(1, 4) + (1 if rng.random() < 0.1 else 0)
    x = _tensor(rng, (n, c, rng.randint(1, 5), rng.randint(1, 5)), _dtype(rng), rng.random() < 0.5)
    p = _dtype(rng, x.dtype)
    weight = _tensor(rng, (c if rng.random() < 0.9 else c + 1,), p) if rng.random() < 0.8 else None
    bias = _tensor(rng, (c,), p) if rng.random() < 0.8 else None
    input_bias = _tensor(rng, (n, c), _dtype(rng, x.dtype)) if rng.random() < 0.3 else None
    return torch.ops.rocm_sd.group_norm, (x, groups, weight, bias, 1e-5, rng.random() < 0.5, input_bias)


def case_layer_norm(rng):
    c = rng.randint(1, 9)
    x = _tensor(rng, (rng.randint(1, 3), rng.randint(1, 4), c), _dtype(rng))
    p = _dtype(rng, x.dtype)
    weight = _tensor(rng, (c if rng.random() < 0.9 else c + 1,), p) if rng.random() < 0.8 else None
    return torch.ops.rocm_sd.layer_norm, (x, weight, _tensor(rng, (c,), p) if rng.random() < 0.8 else None, 1e-5)


def case_add_layer_norm(rng):
    c = rng.randint(1, 9)
    x = _tensor(rng, (rng.randint(1, 3), rng.randint(1, 4), c), _dtype(rng))
    residual = _tensor(rng, _maybe_broadcast(rng, x.shape), _dtype(rng, x.dtype))
    p = _dtype(rng, x.dtype)
    return torch.ops.rocm_sd.add_layer_norm, (x, residual, _tensor(rng, (c,), p), _tensor(rng, (c,), p), 1e-5)


def _modulation(rng, x):
    """A (B, C) modulation of x (B, L, C): mostly a chunk of an embedding (strided), now and then (1, C), a wrong
    batch or width, or 1-D (which must be refused)."""
    b, c = x.shape[0], x.shape[-1]
    roll = rng.random()
    shape = (b, c) if roll < 0.75 else (1, c) if roll < 0.85 else rng.choice([(b + 1, c), (b, c + 1), (c,)])
    dtype = _dtype(rng, x.dtype)
    if len(shape) == 2 and rng.random() < 0.7:
        return _tensor(rng, (shape[0], 3 * shape[1]), dtype).chunk(3, dim=1)[rng.randint(0, 2)]
    return _tensor(rng, shape, dtype)


def case_ada_layer_norm(rng):
    shape = (rng.randint(1, 3), rng.randint(1, 4), rng.randint(1, 9))
    x = _tensor(rng, shape if rng.random() < 0.9 else shape[1:], _dtype(rng))
    if x.dim() == 2:
        return torch.ops.rocm_sd.ada_layer_norm, (x, _tensor(rng, x.shape, x.dtype), _tensor(rng, x.shape, x.dtype),
                                                  1e-6)
    return torch.ops.rocm_sd.ada_layer_norm, (x, _modulation(rng, x), _modulation(rng, x), 1e-6)


def case_add_ada_layer_norm(rng):
    op, (x, scale, shift, eps) = case_ada_layer_norm(rng)
    y = _tensor(rng, _maybe_broadcast(rng, x.shape), _dtype(rng, x.dtype))
    gate = _modulation(rng, x) if x.dim() == 3 else _tensor(rng, x.shape, x.dtype)
    return torch.ops.rocm_sd.add_ada_layer_norm, (x, y, gate, scale, shift, eps)


def case_geglu(rng):
    shape = (rng.randint(1, 3), rng.randint(1, 4), rng.randint(1, 5) * 2 - (1 if rng.random() < 0.2 else 0))
    return torch.ops.rocm_sd.geglu, (_tensor(rng, shape, _dtype(rng)),)


def case_bias_residual(rng):
    dims = rng.choice([2, 3, 4, 4, 4, 0])
    shape = (rng.randint(1, 3), rng.randint(1, 5), *[rng.randint(1, 4) for _ in range(max(0, dims - 2))])[:dims]
    x = _tensor(rng, shape, _dtype(rng), rng.random() < 0.5)
    residual = _tensor(rng, _maybe_broadcast(rng, x.shape) if dims else (), _dtype(rng, x.dtype),
                       rng.random() < 0.5)
    bias = _tensor(rng, (x.shape[1] if dims >= 2 else 3,), _dtype(rng, x.dtype))
    return torch.ops.rocm_sd.bias_residual, (x, residual, bias, rng.choice([1.0, 0.5]))


def case_parity_shuffle(rng):
    c = rng.randint(1, 3)
    parities = _tensor(rng, (rng.randint(1, 2), 4 * c + (1 if rng.random() < 0.1 else 0), rng.randint(2, 4),
                             rng.randint(2, 4)), _dtype(rng), rng.random() < 0.7)
    bias = _tensor(rng, (c,), _dtype(rng, parities.dtype)) if rng.random() < 0.7 else None
    return torch.ops.rocm_sd.parity_shuffle, (parities, bias)


def case_attention(rng):
    b, h, d = rng.randint(1, 3), rng.randint(1, 3), rng.choice([8, 16])
    lq, lk = rng.randint(1, 6), rng.randint(1, 6)
    dtype = _dtype(rng)
    q = _tensor(rng, (b, lq, h, d), dtype)
    kb = b if rng.random() < 0.8 else b + 1
    k = _tensor(rng, (kb, lk, h, d if rng.random() < 0.9 else d + 8), _dtype(rng, dtype))
    v = _tensor(rng, (kb, lk, h, d if rng.random() < 0.7 else 2 * d), _dtype(rng, dtype))
    return torch.ops.rocm_sd.attention, (q, k, v, 0.125)


def case_attention_fp8(rng):
    op, (q, k, v, scale) = case_attention(rng)
    return torch.ops.rocm_sd.attention_fp8, (q, k, v, scale, rng.choice(["e4m3fn", "e4m3fnuz", "int8"]))


def case_conv_bias_residual(rng):
    n, c, k, r = rng.randint(1, 2), rng.randint(1, 4), rng.randint(1, 4), rng.choice([1, 3])
    pad = r // 2 if rng.random() < 0.9 else 0
    x = _tensor(rng, (n, c, rng.randint(3, 5), rng.randint(3, 5)), _dtype(rng), rng.random() < 0.5)
    weight = _tensor(rng, (k, c, r, r), _dtype(rng, x.dtype))
    out_shape = (n, k, x.shape[2] + 2 * pad - r + 1, x.shape[3] + 2 * pad - r + 1)
    residual = _tensor(rng, out_shape if rng.random() < 0.9 else (n, k, 1, 1), _dtype(rng, x.dtype),
                       rng.random() < 0.5)
    return torch.ops.rocm_sd.conv_bias_residual, (x, weight, _tensor(rng, (k,), _dtype(rng, x.dtype)), residual, 1.0, pad, pad)


def case_linear_geglu(rng):
    k, n2 = rng.randint(1, 6), 2 * rng.randint(1, 4) + (1 if rng.random() < 0.1 else 0)
    x = _tensor(rng, (rng.randint(1, 2), rng.randint(1, 3), k), _dtype(rng))
    return torch.ops.rocm_sd.linear_geglu, (x, _tensor(rng, (n2, k), _dtype(rng, x.dtype)), _tensor(rng, (n2,), _dtype(rng, x.dtype)))


def case_quantize_rows(rng):
    shape = (rng.randint(1, 3), rng.randint(0, 4), rng.randint(1, 9))[:rng.choice([1, 2, 3, 0])]
    return torch.ops.rocm_sd.quantize_rows, (_tensor(rng, shape, _dtype(rng)), _format(rng))


def _format(rng):
    return rng.choice(["e4m3fn", "e4m3fnuz", "int8", "int8", "fp4"])


def case_layer_norm_quantize_rows(rng):
    op, args = case_layer_norm(rng)
    return torch.ops.rocm_sd.layer_norm_quantize_rows, (*args, _format(rng))


def case_add_layer_norm_quantize_rows(rng):
    op, args = case_add_layer_norm(rng)
    return torch.ops.rocm_sd.add_layer_norm_quantize_rows, (*args, _format(rng))


def case_layer_norm_quantized(rng):
    op, args = case_layer_norm(rng)
    return torch.ops.rocm_sd.layer_norm_quantized, (*args, _format(rng))


def case_add_layer_norm_quantized(rng):
    op, args = case_add_layer_norm(rng)
    return torch.ops.rocm_sd.add_layer_norm_quantized, (*args, _format(rng))


def case_geglu_quantize_rows(rng):
    op, args = case_geglu(rng)
    return torch.ops.rocm_sd.geglu_quantize_rows, (*args, _format(rng))


def case_geglu_quantized(rng):
    op, args = case_geglu(rng)
    return torch.ops.rocm_sd.geglu_quantized, (*args, _format(rng))


def case_im2col_quantize(rng):
    """Mostly valid calls (a 3x3 or 1x1 window that fits), and now and then a bad window, padding, bound or format."""
    n, c = rng.randint(0 if rng.random() < 0.1 else 1, 2), rng.randint(1, 9)
    shape = (n, c, rng.randint(3, 6), rng.randint(3, 6))
    x = _tensor(rng, shape if rng.random() < 0.95 else shape[:3], _dtype(rng), rng.random() < 0.7)
    k = rng.choice([1, 3, 3, 3]) if rng.random() < 0.9 else rng.choice([0, 9])
    stride = rng.choice([1, 1, 2]) if rng.random() < 0.95 else 0
    pad = (k // 2) if rng.random() < 0.9 else k
    bound = 4.0 if rng.random() < 0.9 else rng.choice([0.0, float("nan")])
    fmt = rng.choice(["e4m3fn", "e4m3fnuz"]) if rng.random() < 0.9 else "int8"
    return torch.ops.rocm_sd.im2col_quantize, (x, fmt, bound, k, k, stride, stride, pad, pad)


def case_rms_norm(rng):
    """Fused-QKV views, lead rows of another batch / head count, odd head dims with the rotary embedding, cos / sin
    tables that broadcast, and the weights' dtypes and shapes."""
    b, l, h, d = rng.randint(1, 2), rng.randint(1, 4), rng.randint(1, 3), rng.choice([2, 4, 6, 8, 3])
    x = _tensor(rng, (b, l, 3 * h * d), _dtype(rng))[..., :h * d].unflatten(-1, (h, d))
    if rng.random() < 0.1:
        x = x.flatten(2)
    p = _dtype(rng, x.dtype)
    weight = _tensor(rng, (d if rng.random() < 0.9 else d + 1,), p) if rng.random() < 0.8 else None
    lead = lead_weight = cos = sin = None
    if rng.random() < 0.6:
        lead = _tensor(rng, (b if rng.random() < 0.9 else b + 1, rng.randint(0, 3), h, d), _dtype(rng, x.dtype))
        lead_weight = _tensor(rng, (d,), p) if rng.random() < 0.8 else None
    if rng.random() < 0.5:
        rows = l + (lead.shape[1] if lead is not None else 0)
        cos, sin = (_tensor(rng, (rows if rng.random() < 0.9 else rng.choice([1, rows + 1]), d),
                            _dtype(rng, torch.float32)) for _ in range(2))
        sin = sin if rng.random() < 0.95 else None
    return torch.ops.rocm_sd.rms_norm, (x, weight, 1e-6, lead, lead_weight, cos, sin)


CASES = [case_group_norm, case_layer_norm, case_add_layer_norm, case_geglu, case_bias_residual, case_parity_shuffle,
         case_attention, case_attention_fp8, case_conv_bias_residual, case_linear_geglu, case_quantize_rows, case_layer_norm_quantize_rows,
         case_add_layer_norm_quantize_rows, case_layer_norm_quantized, case_add_layer_norm_quantized,
         case_geglu_quantize_rows, case_geglu_quantized, case_im2col_quantize, case_rms_norm]
def case_ada_layer_norm_quantized(rng):
    op, args = case_ada_layer_norm(rng)
    bound = 0.0 if rng.random() < 0.8 else rng.choice([2.0, -1.0])
    return torch.ops.rocm_sd.ada_layer_norm_quantized, (*args, _format(rng), bound)


def case_add_ada_layer_norm_quantized(rng):
    op, args = case_add_ada_layer_norm(rng)
    return torch.ops.rocm_sd.add_ada_layer_norm_quantized, (*args, _format(rng))


def case_gelu_tanh(rng):
    """Mostly (..., D) with a (D,) bias or none; now and then a bias of another length or dtype, or integers."""
    shape = tuple(rng.randint(1, 4) for _ in range(rng.randint(1, 3)))
    x = _tensor(rng, shape, _dtype(rng))
    roll = rng.random()
    bias = (None if roll < 0.3 else _tensor(rng, (shape[-1] + (1 if roll > 0.95 else 0),), _dtype(rng, x.dtype)))
    return torch.ops.rocm_sd.gelu_tanh, (x, bias)


def case_gelu_tanh_quantized(rng):
    op, args = case_gelu_tanh(rng)
    return torch.ops.rocm_sd.gelu_tanh_quantized, (*args, _format(rng))


CASES += [case_ada_layer_norm, case_add_ada_layer_norm, case_ada_layer_norm_quantized,
          case_add_ada_layer_norm_quantized, case_gelu_tanh, case_gelu_tanh_quantized]


def test_every_registered_op_is_fuzzed():
    from rocm_sd.ops import REGISTRY

    assert {case.__name__.removeprefix("case_") for case in CASES} == set(REGISTRY)


def _outcome(op, args):
    """('ok', [(shape, dtype, strides) per output]) or ('error', message)."""
    try:
        out = op(*args)
    except RuntimeError as error:
        return "error", str(error)
    outs = out if isinstance(out, tuple) else (out,)
    # A size-1 dimension's stride never addresses memory (torch leaves it arbitrary): only the others count.
    return "ok", [(tuple(o.shape), o.dtype, tuple(st if n > 1 else None for n, st in zip(o.shape, o.stride())))
                  for o in outs]


def _fake_outcome(op, args):
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        return _outcome(op, fake_args)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("case", CASES, ids=[c.__name__.removeprefix("case_") for c in CASES])
def test_fake_and_real_agree_on_random_arguments(case, device, monkeypatch):
    """On the GPU the kernels run where they take the call, PyTorch elsewhere (not strict: both are compared)."""
    monkeypatch.setitem(DEVICE, "name", device)
    rng = random.Random(case.__name__)
    seen = {"ok": 0, "error": 0}
    with config.override(log_fallbacks=False, strict=False):
        for trial in range(60):
            op, args = case(rng)
            real, fake = _outcome(op, args), _fake_outcome(op, args)
            described = [f"{tuple(a.shape)} {a.dtype} {a.stride()}" if isinstance(a, torch.Tensor) else repr(a)
                         for a in args]
            assert real[0] == fake[0], f"trial {trial}, {described}: real {real}, fake {fake}"
            if real[0] == "ok":
                assert real == fake, f"trial {trial}, {described}: real {real[1]}, fake {fake[1]}"
            else:
                assert real[1].startswith("rocm_sd::") and fake[1] == real[1], (real, fake)
            seen[real[0]] += 1
    assert seen["ok"] >= 10 and seen["error"] >= 3, seen  # both kinds of argument were really exercised


def _gn_args(**change):
    x = torch.randn(2, 4, 3, 3)
    args = {"x": x, "num_groups": 2, "weight": torch.ones(4), "bias": torch.zeros(4), "eps": 1e-5, "silu": False,
            "input_bias": None}
    args.update(change)
    return tuple(args.values())


@pytest.mark.parametrize("args, phrase", [
    (_gn_args(x=torch.randint(0, 3, (2, 4, 3, 3))), "input dtype torch.int64 is not a floating-point type"),
    (_gn_args(x=torch.randn(2, 4, 3, 3) > 0), "input dtype torch.bool"),
    (_gn_args(x=torch.randn(2, 4, 3, 3, dtype=torch.float64)), "weight dtype torch.float32 does not go with input "
                                                               "dtype torch.float64"),
    (_gn_args(weight=torch.ones(4, device="meta")), "weight is on meta, the input on cpu"),
    (_gn_args(num_groups=3), "divisible by num_groups"),
], ids=["int", "bool", "float64-with-fp32-params", "meta-weight", "groups"])
def test_group_norm_refuses_what_pytorch_refuses_even_when_strict(args, phrase):
    with config.override(strict=True), pytest.raises(RuntimeError, match=r"rocm_sd::group_norm: .*" + phrase):
        torch.ops.rocm_sd.group_norm(*args)


@pytest.mark.parametrize("call, phrase", [
    (lambda: torch.ops.rocm_sd.layer_norm(torch.arange(8).reshape(2, 4), torch.ones(4), torch.zeros(4), 1e-5), "layer_norm: input dtype"),
    (lambda: torch.ops.rocm_sd.layer_norm(torch.randn(2, 4), torch.ones(4, device="meta"), None, 1e-5), "layer_norm: weight is on meta"),
    (lambda: torch.ops.rocm_sd.add_layer_norm(torch.randn(2, 4), torch.randn(2, 4), torch.ones(4, device="meta"), None, 1e-5),
     "add_layer_norm: weight is on meta"),
    (lambda: torch.ops.rocm_sd.add_layer_norm(torch.randn(1, 4), torch.randn(2, 4), None, None, 1e-5),
     "add_layer_norm: residual of shape \\(2, 4\\) does not broadcast"),
    (lambda: torch.ops.rocm_sd.geglu(torch.randn(2, 3)), "geglu: last dimension 3 is odd"),
    (lambda: torch.ops.rocm_sd.geglu(torch.randn(2, 1)), "geglu: last dimension 1 is odd"),
    (lambda: torch.ops.rocm_sd.bias_residual(torch.randn(2, 4, 3, 3), torch.randn(2, 4, 3, 3), torch.ones(4, device="meta"), 1.0),
     "bias_residual: bias is on meta"),
    (lambda: torch.ops.rocm_sd.bias_residual(torch.tensor(1.0), torch.tensor(1.0), torch.ones(1), 1.0), "bias_residual: input of shape"),
    (lambda: torch.ops.rocm_sd.parity_shuffle(torch.randn(1, 8, 3, 3), torch.ones(2, device="meta")), "parity_shuffle: bias is on meta"),
    (lambda: torch.ops.rocm_sd.conv_bias_residual(torch.randn(1, 2, 4, 4), torch.randn(3, 2, 3, 3, device="meta"), torch.ones(3),
                                    torch.randn(1, 3, 4, 4), 1.0, 1, 1), "conv_bias_residual: weight is on meta"),
    (lambda: torch.ops.rocm_sd.attention(torch.randn(1, 5, 2, 8), torch.randn(2, 6, 2, 8), torch.randn(2, 6, 2, 8), 0.3),
     "attention: shapes"),
], ids=["ln-int", "ln-meta", "aln-meta", "aln-broadcast", "geglu-odd", "geglu-1", "bias-meta", "bias-0d",
        "parity-meta", "conv-meta", "attention-batch"])
def test_ops_refuse_invalid_arguments_naming_the_op(call, phrase):
    with config.override(strict=True), pytest.raises(RuntimeError, match="rocm_sd::" + phrase):
        call()


def test_mixed_dtypes_promote_in_eager_and_in_the_fake_kernel():
    x, residual, bias = torch.randn(2, 4, 3, 3, dtype=torch.float16), torch.randn(2, 4, 3, 3), torch.randn(4)
    with config.override(log_fallbacks=False):
        out = torch.ops.rocm_sd.bias_residual(x, residual, bias, 1.0)
    assert out.dtype == torch.float32 and torch.allclose(out, (residual + x.float() + bias.reshape(4, 1, 1)))
    assert _fake_outcome(torch.ops.rocm_sd.bias_residual, (x, residual, bias, 1.0)) == _outcome(torch.ops.rocm_sd.bias_residual,
                                                                                  (x, residual, bias, 1.0))


def test_attention_output_takes_vs_head_dim():
    q, k, v = torch.randn(2, 5, 2, 8), torch.randn(2, 6, 2, 8), torch.randn(2, 6, 2, 16)
    with config.override(log_fallbacks=False):
        out = torch.ops.rocm_sd.attention(q, k, v, 0.3)
    expected = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                                scale=0.3).transpose(1, 2)
    assert out.shape == (2, 5, 2, 16) and torch.allclose(out, expected, atol=1e-6)
