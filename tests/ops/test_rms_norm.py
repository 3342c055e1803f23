import pytest
import torch
from diffusers.models.embeddings import apply_rotary_emb
from diffusers.models.normalization import RMSNorm

from rocm_sd import config, dispatch
from rocm_sd.ops._common import within_tolerance
from rocm_sd.ops.rms_norm import input_reasons, rms_norm, rms_norm_kernel, rms_norm_ref, supports
from tests.shapes import RMS_NORM_AWKWARD, RMS_NORM_DIT

EPS = 1e-6


def make(shape, dtype, device, param_dtype=None, repeated=True):
    """(x, weight, eps, lead, lead_weight, cos, sin) for one RMS_NORM_* entry. fused: x is the middle third (K) of a
    fused QKV projection's output. cos / sin: FluxPosEmbed's form (each angle twice) or, with repeated=False, tables
    whose pairs differ (a swapped index shows)."""
    b, l, h, d, lead_len, rope, fused = shape
    if fused:
        x = (torch.randn(b, l, 3 * h * d, device=device) * 2 + 0.5).to(dtype)[..., h * d:2 * h * d].unflatten(-1, (h, d))
    else:
        x = (torch.randn(b, l, h, d, device=device) * 2 + 0.5).to(dtype)
    weight = (torch.rand(d, device=device) + 0.5).to(param_dtype or dtype)
    lead = lead_weight = cos = sin = None
    if lead_len is not None:
        lead = (torch.randn(b, lead_len, h, d, device=device) * 3).to(dtype)
        lead_weight = (torch.rand(d, device=device) + 0.5).to(param_dtype or dtype)
    if rope:
        rows = l + (lead_len or 0)
        if repeated:
            angles = (torch.randn(rows, d // 2, device=device) * 3).repeat_interleave(2, dim=1)
            cos, sin = angles.cos(), angles.sin()
        else:
            cos, sin = torch.randn(rows, d, device=device), torch.randn(rows, d, device=device)
    return x, weight, EPS, lead, lead_weight, cos, sin


def double(args):
    return tuple(a.double() if isinstance(a, torch.Tensor) else a for a in args)


# ---- the reference is what diffusers computes ------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_reference_is_diffusers_joint_attention_op_for_op(dtype):
    """SD3 / Flux: norm_q on the image stream, norm_added_q on the text stream, cat([text, image], dim=1), then
    apply_rotary_emb: bit for bit."""
    x, weight, eps, lead, lead_weight, cos, sin = make((2, 9, 3, 16, 5, True, True), dtype, "cpu")
    norm, norm_added = RMSNorm(16, eps=eps), RMSNorm(16, eps=eps)
    with torch.no_grad():
        norm.weight.copy_(weight.float()), norm_added.weight.copy_(lead_weight.float())
    norm, norm_added = norm.to(dtype), norm_added.to(dtype)
    with torch.no_grad():
        expected = apply_rotary_emb(torch.cat([norm_added(lead), norm(x)], dim=1), (cos, sin), use_real=True,
                                    use_real_unbind_dim=-1, sequence_dim=1)
    assert torch.equal(rms_norm_ref(x, weight, eps, lead, lead_weight, cos, sin), expected)
    with torch.no_grad():
        assert torch.equal(rms_norm_ref(x, None, eps), RMSNorm(16, eps=eps, elementwise_affine=False)(x))


def test_reference_agrees_with_torch_rms_norm_and_t5_layer_norm():
    """Flux's torch.nn.RMSNorm: within the accuracy rule of the float64 truth (torch rounds its own way); T5's
    T5LayerNorm: bit for bit (the same arithmetic as diffusers')."""
    x, weight, eps, *_ = make((1, 12, 4, 128, None, False, False), torch.bfloat16, "cpu")
    norm = torch.nn.RMSNorm(128, eps=eps, dtype=torch.bfloat16)
    with torch.no_grad():
        norm.weight.copy_(weight)
        theirs = norm(x)
    truth = rms_norm_ref(*double((x, weight, eps)))
    assert within_tolerance(rms_norm_ref(x, weight, eps), truth, theirs)[0]
    assert within_tolerance(theirs, truth, rms_norm_ref(x, weight, eps))[0]
    t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    hidden = (torch.randn(2, 7, 64) * 3).to(torch.bfloat16)
    layer = t5.T5LayerNorm(64, eps=eps).to(torch.bfloat16)
    with torch.no_grad():
        layer.weight.copy_(torch.rand(64) + 0.5)
        assert torch.equal(rms_norm_ref(hidden.unsqueeze(2), layer.weight, eps).squeeze(2), layer(hidden))


def test_rotation_pairs_channels_as_written():
    """y[2i] = y[2i] cos[2i] - y[2i+1] sin[2i], y[2i+1] = y[2i+1] cos[2i+1] + y[2i] sin[2i+1], at the joint row."""
    x, weight, eps, lead, lead_weight, cos, sin = make((1, 3, 2, 4, 2, True, False), torch.float64, "cpu",
                                                        repeated=False)
    cos, sin = cos.double(), sin.double()
    y = rms_norm_ref(x, weight, eps, lead, lead_weight)
    expected = y.clone()
    expected[..., 0::2] = y[..., 0::2] * cos[None, :, None, 0::2] - y[..., 1::2] * sin[None, :, None, 0::2]
    expected[..., 1::2] = y[..., 1::2] * cos[None, :, None, 1::2] + y[..., 0::2] * sin[None, :, None, 1::2]
    assert torch.allclose(rms_norm_ref(x, weight, eps, lead, lead_weight, cos, sin), expected, rtol=0, atol=1e-12)


# ---- the op without a kernel: the reference, laid out as the kernel's output --------------------------------

@pytest.mark.parametrize("param_dtype", [None, torch.float32], ids=["weights-like-x", "fp32-weights"])
def test_cpu_op_is_the_reference_in_x_dtype_contiguous(param_dtype):
    args = make((2, 5, 3, 8, 4, True, True), torch.bfloat16, "cpu", param_dtype)
    with config.override(log_fallbacks=False):
        y = torch.ops.rocm_sd.rms_norm(*args)
        direct = rms_norm.call(*args)
    assert y.dtype == torch.bfloat16 and y.shape == (2, 9, 3, 8) and y.is_contiguous()
    assert torch.equal(y, rms_norm_ref(*args).to(torch.bfloat16)) and torch.equal(direct, y)
    assert dispatch.stats()["rms_norm"] == {"torch": 2}


def test_gradients_are_the_reference_gradients():
    x, weight, eps, lead, lead_weight, cos, sin = make((1, 4, 2, 8, 3, True, False), torch.float32, "cpu")
    leaves = [t.requires_grad_() for t in (x, weight, lead, lead_weight)]
    with config.override(log_fallbacks=False):
        torch.ops.rocm_sd.rms_norm(x, weight, eps, lead, lead_weight, cos, sin).square().sum().backward()
    ours = [t.grad.clone() for t in leaves]
    for t in leaves:
        t.grad = None
    rms_norm_ref(x, weight, eps, lead, lead_weight, cos, sin).square().sum().backward()
    assert all(torch.allclose(a, t.grad) for a, t in zip(ours, leaves))


def _call(**change):
    x, weight, eps, lead, lead_weight, cos, sin = make((2, 5, 3, 8, 4, True, False), torch.float16, "cpu")
    args = {"x": x, "weight": weight, "eps": eps, "lead": lead, "lead_weight": lead_weight, "cos": cos, "sin": sin}
    args.update(change)
    return lambda: torch.ops.rocm_sd.rms_norm(*args.values())


@pytest.mark.parametrize("call, phrase", [
    (_call(x=torch.randint(0, 3, (2, 5, 3, 8))), "input dtype torch.int64 is not a floating-point type"),
    (_call(x=torch.randn(2, 5, 24), cos=None, sin=None, lead=None), r"has 3 dims, expected \(B, L, H, D\)"),
    (_call(weight=torch.ones(4)), r"weight of shape \(4,\) is not a \(8,\) vector"),
    (_call(lead_weight=torch.ones(8, device="meta")), "lead_weight is on meta"),
    (_call(lead=torch.randn(2, 4, 2, 8)), r"lead of shape \(2, 4, 2, 8\) does not join"),
    (_call(lead=torch.randn(1, 4, 3, 8)), "does not join"),
    (_call(sin=None), "cos and sin come together"),
    (_call(cos=torch.randn(8, 8)), r"cos of shape \(8, 8\) does not broadcast to \(9, 8\)"),
    (_call(x=torch.randn(2, 5, 3, 7), weight=None, lead=None, lead_weight=None, cos=torch.randn(5, 7),
           sin=torch.randn(5, 7)), "head dim 7 is odd"),
], ids=["int", "3d", "weight-shape", "meta-weight", "lead-heads", "lead-batch", "sin-missing", "cos-rows", "odd-rope"])
def test_refuses_what_the_reference_refuses_even_when_strict(call, phrase):
    with config.override(strict=True), pytest.raises(RuntimeError, match=r"rocm_sd::rms_norm: .*" + phrase):
        call()


def test_unsupported_arguments_are_named():
    x, weight, eps, lead, lead_weight, cos, sin = args = make((2, 5, 3, 8, 4, True, False), torch.float16, "cpu")
    assert input_reasons(*args) == []

    def reasons(**change):
        named = {"x": x, "weight": weight, "eps": eps, "lead": lead, "lead_weight": lead_weight, "cos": cos, "sin": sin}
        return " | ".join(input_reasons(*{**named, **change}.values()))

    assert "dtype torch.float64" in reasons(x=x.double(), lead=lead.double())
    assert "input strides" in reasons(x=x.transpose(1, 3).contiguous().transpose(1, 3))
    assert "lead strides" in reasons(lead=lead.transpose(2, 3).contiguous().transpose(2, 3))
    assert "lead dtype torch.float32 differs" in reasons(lead=lead.float())
    assert "weight dtype torch.bfloat16 is neither" in reasons(weight=weight.bfloat16())
    assert "differs from lead_weight dtype" in reasons(weight=weight.float())
    assert "lead_weight is not contiguous" in reasons(lead_weight=torch.ones(16, dtype=x.dtype)[::2])
    assert "cos (9, 8) torch.float64" in reasons(cos=cos.double())
    assert "sin (1, 8)" in reasons(sin=sin[:1])  # broadcasts in the reference; the kernel reads (L0 + L, D)
    assert "cos (9, 8)" in reasons(cos=cos.t().contiguous().t())
    assert "empty tensor" in reasons(x=x[:, :0], lead=lead[:, :0], cos=cos[:0], sin=sin[:0])
    assert "empty tensor" not in reasons(x=x[:, :0], cos=cos[:4], sin=sin[:4])  # the lead rows alone are work
    assert "not built" in supports(*args)[0] or "no GPU" in supports(*args)[0]


# ---- the kernel (GPU) -------------------------------------------------------------------------------------------

def _judge(args, y, what):
    truth = rms_norm_ref(*double(args))
    ok, err, allowed = within_tolerance(y, truth, rms_norm_ref(*args).to(y.dtype))
    assert ok, f"{what}: max err {err:.3g} > allowed {allowed:.3g}"


def _poisoned(args):
    x, lead = args[0], args[3]
    b, l, h, d = x.shape
    return torch.full((b, l + (lead.shape[1] if lead is not None else 0), h, d), float("nan"), dtype=x.dtype,
                      device=x.device)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", RMS_NORM_DIT + RMS_NORM_AWKWARD, ids=str)
def test_kernel_matches_truth(shape, dtype):
    args = make(shape, dtype, "cuda", repeated=shape[5] and shape[0] != 3)  # batch 3: tables whose pairs differ
    assert not supports(*args), supports(*args)
    y = rms_norm_kernel(*args, out=_poisoned(args))
    _judge(args, y, f"{shape} {dtype}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_kernel_with_float32_weights(dtype):
    """Mixed precision: float32 norm weights with a 16-bit input compute in float32 and round once."""
    args = make((2, 77, 3, 64, 9, True, True), dtype, "cuda", param_dtype=torch.float32)
    assert not supports(*args), supports(*args)
    truth = rms_norm_ref(*double(args))
    ok, err, allowed = within_tolerance(rms_norm_kernel(*args, out=_poisoned(args)), truth,
                                        rms_norm_ref(*args).to(dtype))
    assert ok, (err, allowed)


@pytest.mark.gpu
def test_op_dispatches_to_kernel_in_strict_mode_and_without_a_weight():
    x, _, eps, lead, _, cos, sin = make((1, 64, 4, 128, 16, True, True), torch.bfloat16, "cuda")
    with config.override(strict=True):
        y = torch.ops.rocm_sd.rms_norm(x, None, eps, lead, None, cos, sin)
        direct = rms_norm.call(x, None, eps, lead, None, cos, sin)
    assert dispatch.stats()["rms_norm"] == {"rocm_sd": 2}
    assert torch.equal(y, direct) and y.is_contiguous() and y.shape == (1, 80, 4, 128)
    _judge((x, None, eps, lead, None, cos, sin), y, "no weights")


@pytest.mark.gpu
def test_too_long_rows_fall_back_with_a_reason():
    x = torch.randn(1, 2, 1, 65536 + 8, device="cuda", dtype=torch.float16)
    assert any("beyond the kernel's limit" in r for r in supports(x, None, EPS))
    with config.override(strict=False, log_fallbacks=False):  # the GPU suite runs with ROCM_SD_STRICT=1
        assert torch.equal(torch.ops.rocm_sd.rms_norm(x, None, EPS), rms_norm_ref(x, None, EPS))


@pytest.mark.gpu
def test_nan_stays_in_its_row():
    x, weight, eps, lead, lead_weight, cos, sin = make((1, 8, 2, 64, 4, True, False), torch.float16, "cuda")
    x[0, 3, 1, 17] = float("nan")
    with config.override(strict=True):
        y = torch.ops.rocm_sd.rms_norm(x, weight, eps, lead, lead_weight, cos, sin)
    assert torch.isnan(y[0, 4 + 3, 1]).all()
    y[0, 4 + 3, 1] = 0
    assert not torch.isnan(y).any()
