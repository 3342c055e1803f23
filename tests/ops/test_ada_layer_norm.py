import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from rocm_sd import config
from rocm_sd.ops import REGISTRY
from rocm_sd.ops._common import within_tolerance
from rocm_sd.ops.ada_layer_norm import (ada_layer_norm_kernel, ada_layer_norm_ref, add_ada_layer_norm_kernel,
                                         add_ada_layer_norm_ref, add_ada_layer_norm_supports, input_reasons, supports)
from tests.shapes import ADA_LAYER_NORM_DIT

# Scalar tail (C = 33), CLIP's 77 tokens, batch 3; one wave a row (C = 320); the widest row (16 vectors a lane in
# 512 threads would be too many: 4096 is the scalar path's widest at 8 a lane).
ADA_LAYER_NORM_AWKWARD = [(3, 77, 33), (1, 1, 8), (3, 7, 320), (2, 5, 4096)]


def make(shape, dtype, device, chunks=6):
    """x, and (shift, scale, gate) as views of one (B, chunks * C) embedding, as diffusers' AdaLayerNormZero
    chunks it (strides (chunks * C, 1))."""
    b, _, c = shape
    x = (torch.randn(shape, device=device) * 2 + 0.5).to(dtype)
    emb = (torch.randn(b, chunks * c, device=device) * 0.5).to(dtype)
    shift, scale, gate = emb.chunk(chunks, dim=1)[:3]
    return x, shift, scale, gate


def truth(x, scale, shift, eps):
    """The modulated LayerNorm written out in float64, independent of the reference."""
    x, scale, shift = x.double(), scale.double(), shift.double()
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * (1 + scale[:, None]) + shift[:, None]


# ---- CPU: reference, argument errors, fake, opcheck, reasons --------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_reference_is_diffusers_modulation_and_the_float64_truth(dtype):
    x, shift, scale, gate = make((2, 9, 48), dtype, "cpu")
    y = torch.randn_like(x)
    # float64: the reference is the truth (what the GPU tests judge by)
    assert torch.allclose(ada_layer_norm_ref(x.double(), scale.double(), shift.double(), 1e-6),
                          truth(x, scale, shift, 1e-6), rtol=1e-12, atol=1e-12)
    h, n = add_ada_layer_norm_ref(x, y, gate, scale, shift, 1e-6)
    assert torch.equal(h, x + gate.unsqueeze(1) * y)
    assert torch.equal(n, F.layer_norm(h, (48,), eps=1e-6) * (1 + scale[:, None]) + shift[:, None])


def test_cpu_calls_fall_back_to_the_reference_exactly():
    x, shift, scale, gate = make((2, 5, 64), torch.float32, "cpu")
    y = torch.randn_like(x)
    with config.override(log_fallbacks=False):
        for call in (torch.ops.rocm_sd.ada_layer_norm, REGISTRY["ada_layer_norm"].op.call):
            assert torch.equal(call(x, scale, shift, 1e-6), ada_layer_norm_ref(x, scale, shift, 1e-6))
        for call in (torch.ops.rocm_sd.add_ada_layer_norm, REGISTRY["add_ada_layer_norm"].op.call):
            for out, ref in zip(call(x, y, gate, scale, shift, 1e-6),
                                add_ada_layer_norm_ref(x, y, gate, scale, shift, 1e-6), strict=True):
                assert torch.equal(out, ref) and out.is_contiguous()


def _bad(x=None, scale=None, shift=None):
    base_x, base_shift, base_scale, _ = make((2, 3, 8), torch.float32, "cpu")
    return (base_x if x is None else x, base_scale if scale is None else scale,
            base_shift if shift is None else shift, 1e-6)


@pytest.mark.parametrize("args, phrase", [
    (_bad(x=torch.ones(2, 3, 8, dtype=torch.int64)), "input dtype torch.int64 is not a floating-point type"),
    (_bad(x=torch.randn(6, 8)), r"input of shape \(6, 8\) has 2 dims, expected \(B, L, C\)"),
    (_bad(scale=torch.randn(3, 8)), r"scale of shape \(3, 8\) does not broadcast"),
    (_bad(scale=torch.randn(2, 7)), r"scale of shape \(2, 7\) does not broadcast"),
    (_bad(shift=torch.randn(8)), r"shift of shape \(8,\) is not \(B, C\)"),
    (_bad(shift=torch.randn(2, 8, device="meta")), "shift is on meta, the input on cpu"),
], ids=["int", "2-D", "batch", "channels", "1-D", "meta"])
def test_ada_layer_norm_refuses_what_the_reference_refuses_even_when_strict(args, phrase):
    with config.override(strict=True), pytest.raises(RuntimeError, match=r"rocm_sd::ada_layer_norm: .*" + phrase):
        torch.ops.rocm_sd.ada_layer_norm(*args)


def test_add_ada_layer_norm_refuses_bad_residuals_and_gates():
    x, shift, scale, gate = make((2, 3, 8), torch.float32, "cpu")
    with pytest.raises(RuntimeError, match=r"rocm_sd::add_ada_layer_norm: y of shape \(2, 4, 8\) does not broadcast"):
        torch.ops.rocm_sd.add_ada_layer_norm(x, torch.randn(2, 4, 8), gate, scale, shift, 1e-6)
    with pytest.raises(RuntimeError, match="rocm_sd::add_ada_layer_norm: gate is on meta"):
        torch.ops.rocm_sd.add_ada_layer_norm(x, x, gate.to("meta"), scale, shift, 1e-6)
    with pytest.raises(RuntimeError, match="rocm_sd::add_ada_layer_norm: gate dtype torch.bool"):
        torch.ops.rocm_sd.add_ada_layer_norm(x, x, gate > 0, scale, shift, 1e-6)
    with pytest.raises(RuntimeError, match=r"rocm_sd::add_ada_layer_norm: scale of shape \(1, 9\)"):
        torch.ops.rocm_sd.add_ada_layer_norm(x, x, gate, torch.randn(1, 9), shift, 1e-6)


def test_fake_describes_mixed_dtypes_and_broadcasts_as_the_real_op():
    x, shift, scale, gate = make((2, 3, 8), torch.float16, "cpu")
    y = torch.randn(1, 3, 8)  # float32, broadcast over the batch: h and n promote
    calls = [(torch.ops.rocm_sd.ada_layer_norm, (x, scale.float(), shift, 1e-6)),
             (torch.ops.rocm_sd.ada_layer_norm, (x, scale[:1], shift, 1e-6)),
             (torch.ops.rocm_sd.add_ada_layer_norm, (x, y, gate, scale, shift, 1e-6)),
             (torch.ops.rocm_sd.add_ada_layer_norm, (x, x, gate, scale, shift.double(), 1e-6))]
    with config.override(log_fallbacks=False):
        for op, args in calls:
            real = op(*args)
            with FakeTensorMode() as mode:
                fake = op(*[mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args])
            real, fake = (real, fake) if isinstance(real, tuple) else ((real,), (fake,))
            assert [(r.shape, r.dtype, r.stride()) for r in real] == [(f.shape, f.dtype, f.stride()) for f in fake]
    assert [t.dtype for t in torch.ops.rocm_sd.add_ada_layer_norm(x, y, gate, scale, shift, 1e-6)] == \
        [torch.float32, torch.float32]


@pytest.mark.parametrize("op", ["ada_layer_norm", "add_ada_layer_norm"])
def test_opcheck_through_the_registry(op):
    spec = REGISTRY[op]
    with config.override(log_fallbacks=False):
        for args in spec.samples("cpu", torch.float32):
            torch.library.opcheck(spec.op, args)


def test_gradients_are_the_references():
    x, shift, scale, gate = (t.detach().requires_grad_() for t in make((2, 4, 16), torch.float64, "cpu"))
    y = torch.randn_like(x, requires_grad=True)
    for call in (REGISTRY["add_ada_layer_norm"].op.call, torch.ops.rocm_sd.add_ada_layer_norm):
        h, n = call(x, y, gate, scale, shift, 1e-6)
        got = torch.autograd.grad(h.sum() + (n ** 2).sum(), (x, y, gate, scale, shift))
        h, n = add_ada_layer_norm_ref(x, y, gate, scale, shift, 1e-6)
        want = torch.autograd.grad(h.sum() + (n ** 2).sum(), (x, y, gate, scale, shift))
        assert all(torch.allclose(g, w) for g, w in zip(got, want, strict=True))


def test_unsupported_arguments_are_named():
    x, shift, scale, gate = make((2, 8, 64), torch.float16, "cpu")
    y = torch.randn_like(x)
    assert any("not contiguous" in r for r in input_reasons(x.transpose(0, 1), scale, shift))
    assert any("dtype torch.float64 (supported" in r for r in input_reasons(x.double(), scale.double(),
                                                                            shift.double()))
    assert any("scale dtype torch.float32 differs" in r for r in input_reasons(x, scale.float(), shift))
    assert any("shift of shape (1, 64) is not (2, 64)" in r for r in input_reasons(x, scale, shift[:1]))
    assert any("empty" in r for r in supports(x[:, :0], scale, shift, 1e-6))
    reasons = add_ada_layer_norm_supports(x, y.transpose(0, 1).contiguous().transpose(0, 1), gate.float(), scale,
                                          shift, 1e-6)
    assert any("y strides" in r for r in reasons) and any("gate dtype torch.float32" in r for r in reasons)
    assert any("y dtype torch.float32" in r for r in add_ada_layer_norm_supports(x, y.float(), gate, scale, shift,
                                                                                 1e-6))
    assert any("not built" in r or "cpu" in r for r in supports(x, scale, shift, 1e-6))  # no kernel on the CPU


# ---- GPU: the kernel against the float64 truth (ROCM_SD_STRICT=1: no fallback passes) ---------------------------

def _check(out, want_truth, same_dtype, what):
    ok, err, allowed = within_tolerance(out, want_truth, same_dtype)
    assert ok, f"{what}: max err {err:.3g} > allowed {allowed:.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("shape", ADA_LAYER_NORM_DIT + ADA_LAYER_NORM_AWKWARD, ids=str)
def test_kernel_matches_truth(shape, dtype):
    x, shift, scale, _ = make(shape, dtype, "cuda")
    assert not supports(x, scale, shift, 1e-6), supports(x, scale, shift, 1e-6)
    out = ada_layer_norm_kernel(x, scale, shift, 1e-6, out=torch.full_like(x, float("nan")))
    _check(out, truth(x, scale, shift, 1e-6), ada_layer_norm_ref(x, scale, shift, 1e-6), f"{shape} {dtype}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("shape", ADA_LAYER_NORM_DIT + ADA_LAYER_NORM_AWKWARD, ids=str)
def test_add_kernel_matches_truth(shape, dtype):
    x, shift, scale, gate = make(shape, dtype, "cuda")
    y = torch.randn_like(x)
    assert not add_ada_layer_norm_supports(x, y, gate, scale, shift, 1e-6)
    poisoned = (torch.full_like(x, float("nan")), torch.full_like(x, float("nan")))
    h, n = add_ada_layer_norm_kernel(x, y, gate, scale, shift, 1e-6, out=poisoned)
    # h: rounded once from fp32, judged against the float64 sum like PyTorch's two roundings of it
    _check(h, x.double() + gate.double()[:, None] * y.double(), x + gate[:, None] * y, f"h {shape} {dtype}")
    # n: against the float64 modulated norm of that rounded h, as the unfused block computes it from its h
    _check(n, truth(h, scale, shift, 1e-6), ada_layer_norm_ref(h, scale, shift, 1e-6), f"n {shape} {dtype}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_strided_parameters_every_layout(dtype):
    """Parameters as chunks at offsets that break 16-byte alignment (C = 2432 + 2 elements in), transposed (channel
    stride B: the scalar path), broadcast-free (B, C) views of a (k * B, C) embedding: all run, all match."""
    b, tokens, c = 2, 333, 2432
    x = torch.randn(b, tokens, c, device="cuda", dtype=dtype)
    y = torch.randn_like(x)
    emb = torch.randn(b, 3 * c + 2, device="cuda", dtype=dtype)
    layouts = {"chunks": emb[:, :3 * c].chunk(3, dim=1),
               "offset": emb[:, 2:].chunk(3, dim=1),
               "transposed": tuple(torch.randn(c, b, device="cuda", dtype=dtype).t() for _ in range(3)),
               "rows": torch.randn(3 * b, c, device="cuda", dtype=dtype).chunk(3, dim=0)}
    for name, (shift, scale, gate) in layouts.items():
        assert not supports(x, scale, shift, 1e-6), (name, supports(x, scale, shift, 1e-6))
        _check(torch.ops.rocm_sd.ada_layer_norm(x, scale, shift, 1e-6), truth(x, scale, shift, 1e-6),
               ada_layer_norm_ref(x, scale, shift, 1e-6), name)
        h, n = torch.ops.rocm_sd.add_ada_layer_norm(x, y, gate, scale, shift, 1e-6)
        _check(n, truth(h, scale, shift, 1e-6), ada_layer_norm_ref(h, scale, shift, 1e-6), f"add {name}")


@pytest.mark.gpu
def test_in_place_outputs_are_handled():
    """h written over x, and the norm over x: each element is read by the thread that writes it, before it does."""
    x, shift, scale, gate = make((2, 333, 2432), torch.bfloat16, "cuda")
    y = torch.randn_like(x)
    h_want, n_want = add_ada_layer_norm_kernel(x, y, gate, scale, shift, 1e-6)
    stream = x.clone()
    h, n = add_ada_layer_norm_kernel(stream, y, gate, scale, shift, 1e-6, out=(stream, torch.empty_like(x)))
    assert h.data_ptr() == stream.data_ptr() and torch.equal(h, h_want) and torch.equal(n, n_want)
    same = x.clone()
    assert torch.equal(ada_layer_norm_kernel(same, scale, shift, 1e-6, out=same), ada_layer_norm_kernel(x, scale,
                                                                                                         shift, 1e-6))
    # x and y the same tensor: inputs only, any aliasing among them is fine
    _, n = torch.ops.rocm_sd.add_ada_layer_norm(x, x, gate, scale, shift, 1e-6)
    h = x + gate[:, None] * x
    _check(n, truth(h, scale, shift, 1e-6), ada_layer_norm_ref(h, scale, shift, 1e-6), "x is y")


@pytest.mark.gpu
def test_large_mean_two_pass_statistics():
    x = torch.randn(1, 64, 3072, device="cuda") * 0.01 + 100.0
    shift, scale = torch.randn(2, 1, 3072, device="cuda").unbind(0)
    _check(ada_layer_norm_kernel(x, scale, shift, 1e-6), truth(x, scale, shift, 1e-6),
           ada_layer_norm_ref(x, scale, shift, 1e-6), "mean 100, spread 0.01")


@pytest.mark.gpu
def test_nan_stays_in_its_row():
    x, shift, scale, gate = make((2, 6, 2432), torch.float16, "cuda")
    y = torch.randn_like(x)
    y[1, 2, 17] = float("nan")
    h, n = torch.ops.rocm_sd.add_ada_layer_norm(x, y, gate, scale, shift, 1e-6)
    assert torch.isnan(h).sum() == 1 and torch.isnan(n[1, 2]).all()
    n[1, 2] = 0
    assert not torch.isnan(n).any()


@pytest.mark.gpu
def test_too_wide_rows_and_mismatches_fall_back_with_a_reason():
    x, shift, scale, gate = make((1, 4, 65536), torch.float16, "cuda")
    assert any("too large" in r for r in supports(x, scale, shift, 1e-6))
    y = torch.randn_like(x)
    with config.override(strict=False, log_fallbacks=False):  # the GPU suite runs with ROCM_SD_STRICT=1
        assert torch.equal(torch.ops.rocm_sd.ada_layer_norm(x, scale, shift, 1e-6),
                           ada_layer_norm_ref(x, scale, shift, 1e-6))
        h, n = torch.ops.rocm_sd.add_ada_layer_norm(x[..., :64], y[..., :64].float(), gate[:, :64], scale[:, :64],
                                                    shift[:, :64], 1e-6)
        assert h.dtype == n.dtype == torch.float32
    assert any("y dtype" in r for r in add_ada_layer_norm_supports(x, y.float(), gate, scale, shift, 1e-6))
