"""gelu_tanh and gelu_tanh_quantized (ops/gelu_tanh.py): the feed-forward's bias and tanh-GELU in one pass, within
PyTorch's own error of the float64 truth; the quantized rows rocm_sd::quantize_rows of the plain kernel's output bit
for bit."""
import pytest
import torch
import torch.nn.functional as F

from rocm_sd import config, dispatch
from rocm_sd.ops import REGISTRY
from rocm_sd.ops._common import within_tolerance
from rocm_sd.ops.gelu_tanh import (QUANTIZED_SPEC, SPEC, gelu_tanh, gelu_tanh_kernel, gelu_tanh_quantized,
                                   gelu_tanh_quantized_kernel, gelu_tanh_quantized_ref, gelu_tanh_ref, input_reasons)
from rocm_sd.ops.quantize import FORMATS, quantize_rows_ref
from tests.ops.test_quantize_rows import same_codes

# (rows..., D) of the transformers' feed-forward at 1024 px: SD3.5 Large's image stream with CFG (9728), its text
# stream, SD3.5 Medium's (6144), Flux's double-block image stream and single blocks' MLP (12288, batch 1).
GELU_TANH_DIT = [(2, 4096, 9728), (2, 333, 9728), (2, 4096, 6144), (1, 4096, 12288), (1, 4608, 12288)]
GELU_TANH_AWKWARD = [(1, 1, 1), (3, 7), (5, 33, 100), (2, 77, 6)]


def make(shape, dtype, device, bias=True):
    x = (torch.randn(shape, device=device) * 3).to(dtype)
    return x, (torch.randn(shape[-1], device=device).to(dtype) if bias else None)


# ---- CPU ------------------------------------------------------------------------------------------------------

def test_reference_is_diffusers_gelu():
    from diffusers.models.activations import GELU

    module = GELU(32, 48, approximate="tanh")
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        assert torch.equal(gelu_tanh_ref(F.linear(x, module.proj.weight), module.proj.bias),
                           F.gelu(F.linear(x, module.proj.weight) + module.proj.bias, approximate="tanh"))
        assert torch.allclose(gelu_tanh_ref(F.linear(x, module.proj.weight), module.proj.bias), module(x), atol=1e-6)


@pytest.mark.parametrize("with_bias", [False, True])
def test_cpu_calls_fall_back_exactly(with_bias):
    x, bias = make((2, 8, 64), torch.bfloat16, "cpu", with_bias)
    with config.override(log_fallbacks=False):
        y = gelu_tanh(x, bias)
        q, row_scale = gelu_tanh_quantized(x, bias, "e4m3fn")
    assert torch.equal(y, gelu_tanh_ref(x, bias)) and y.is_contiguous()
    q_ref, scale_ref = gelu_tanh_quantized_ref(x, bias, "e4m3fn")
    assert same_codes(q, q_ref) and torch.equal(row_scale, scale_ref)
    assert dispatch.stats()["gelu_tanh"] == {"torch": 1}


@pytest.mark.parametrize("args, why", [
    ((torch.ones(2, 4, dtype=torch.int64), None), "input dtype torch.int64"),
    ((torch.randn(2, 4), torch.randn(5)), r"bias of shape \(5,\) is not \(4,\)"),
    ((torch.randn(2, 4), torch.randn(2, 4)), r"bias of shape \(2, 4\) is not \(4,\)"),
    ((torch.randn(2, 4), torch.randn(4, device="meta")), "bias is on meta"),
    ((torch.randn(()), None), r"input of shape \(\) has 0 dims"),
], ids=["int", "length", "2-D bias", "meta", "scalar"])
def test_bad_arguments_are_named_even_when_strict(args, why):
    with config.override(strict=True):
        with pytest.raises(RuntimeError, match="rocm_sd::gelu_tanh: .*" + why):
            torch.ops.rocm_sd.gelu_tanh(*args)
        with pytest.raises(RuntimeError, match="rocm_sd::gelu_tanh_quantized: .*" + why):
            torch.ops.rocm_sd.gelu_tanh_quantized(*args, "int8")
    with pytest.raises(RuntimeError, match="format 'fp4'"):
        torch.ops.rocm_sd.gelu_tanh_quantized(torch.randn(2, 4), None, "fp4")


def test_unsupported_arguments_are_named():
    x, bias = make((2, 8, 64), torch.float16, "cpu")
    assert any("not contiguous" in r for r in input_reasons(x.transpose(0, 1), bias))
    assert any("bias dtype torch.float32 differs" in r for r in input_reasons(x, bias.float()))
    assert any("empty" in r for r in SPEC.supports(x[:, :0], bias))
    assert any("fp16 or bf16" in r for r in QUANTIZED_SPEC.supports(x.float(), bias.float(), "int8"))


def test_promoting_bias_takes_the_reference_and_the_fake_agrees():
    from torch._subclasses.fake_tensor import FakeTensorMode

    x, bias = make((2, 3, 8), torch.float16, "cpu")
    bias = bias.float()
    with config.override(log_fallbacks=False):
        y = torch.ops.rocm_sd.gelu_tanh(x, bias)
        with FakeTensorMode() as mode:
            fake = torch.ops.rocm_sd.gelu_tanh(mode.from_tensor(x), mode.from_tensor(bias))
    assert y.dtype == fake.dtype == torch.float32 and torch.equal(y, gelu_tanh_ref(x, bias))


@pytest.mark.parametrize("op", ["gelu_tanh", "gelu_tanh_quantized"])
def test_opcheck_through_the_registry(op):
    spec = REGISTRY[op]
    with config.override(log_fallbacks=False):
        for args in spec.samples("cpu", torch.float32 if op == "gelu_tanh" else torch.bfloat16):
            torch.library.opcheck(spec.op, args)


def test_gradients_are_the_references():
    x, bias = (t.detach().requires_grad_() for t in make((3, 16), torch.float64, "cpu"))
    for call in (REGISTRY["gelu_tanh"].op.call, torch.ops.rocm_sd.gelu_tanh):
        got = torch.autograd.grad(call(x, bias).square().sum(), (x, bias))
        want = torch.autograd.grad(gelu_tanh_ref(x, bias).square().sum(), (x, bias))
        assert all(torch.allclose(g, w) for g, w in zip(got, want, strict=True))


# ---- GPU: the kernel against the float64 truth (ROCM_SD_STRICT=1: no fallback passes) ---------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("shape", GELU_TANH_DIT + GELU_TANH_AWKWARD, ids=str)
def test_kernel_matches_truth(shape, dtype, with_bias):
    x, bias = make(shape, dtype, "cuda", with_bias)
    assert not SPEC.supports(x, bias), SPEC.supports(x, bias)
    y = gelu_tanh_kernel(x, bias, out=torch.full_like(x, float("nan")))
    truth = gelu_tanh_ref(x.double(), None if bias is None else bias.double())
    ok, err, allowed = within_tolerance(y, truth, gelu_tanh_ref(x, bias))
    assert ok, f"{shape} {dtype}: max err {err:.3g} > allowed {allowed:.3g}"


@pytest.mark.gpu
def test_kernel_misaligned_tails_and_non_finite():
    base = torch.randn(1 + 4 * 64, device="cuda", dtype=torch.float16)
    x = base[1:].view(4, 64)  # 2-byte offset: scalar accesses
    ok, err, allowed = within_tolerance(gelu_tanh_kernel(x, None), gelu_tanh_ref(x.double(), None),
                                        gelu_tanh_ref(x, None))
    assert ok, (err, allowed)
    x = torch.tensor([[float("nan"), float("inf"), -float("inf"), -30.0, 30.0, 0.0, -0.0, 1e-3]], device="cuda")
    assert torch.equal(gelu_tanh_kernel(x, None).nan_to_num(7.0), gelu_tanh_ref(x, None).nan_to_num(7.0))


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", list(FORMATS), ids=str)
@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", GELU_TANH_DIT[:2] + GELU_TANH_DIT[3:4] + [(3, 5, 64)], ids=str)
def test_quantized_rows_are_the_plain_kernels_output_quantized(shape, dtype, with_bias, fmt):
    x, bias = make(shape, dtype, "cuda", with_bias)
    x.view(-1, shape[-1])[1, 3] = float("nan")  # its row's scale NaN
    assert not QUANTIZED_SPEC.supports(x, bias, fmt)
    poisoned = (torch.full(shape, 0x55, dtype=torch.uint8, device="cuda").view(FORMATS[fmt][1]),
                torch.full(shape[:-1], float("nan"), device="cuda"))
    q, row_scale = gelu_tanh_quantized_kernel(x, bias, fmt, out=poisoned)
    q_ref, scale_ref = quantize_rows_ref(gelu_tanh_kernel(x, bias), fmt)
    assert torch.equal(row_scale.nan_to_num(-1.0), scale_ref.nan_to_num(-1.0)) and same_codes(q, q_ref)


@pytest.mark.gpu
def test_ops_run_the_kernels_in_strict_mode_and_in_a_graph():
    x, bias = make((2, 333, 9728), torch.bfloat16, "cuda")
    with config.override(strict=True):
        dispatch.reset_stats()
        y = gelu_tanh(x, bias)
        gelu_tanh_quantized(x, bias, "e4m3fn")
        assert dispatch.stats()["gelu_tanh"] == {"rocm_sd": 1} == dispatch.stats()["gelu_tanh_quantized"]
    graph = torch.cuda.CUDAGraph()
    static = x.clone()
    with torch.cuda.graph(graph):
        static_y = torch.ops.rocm_sd.gelu_tanh(static, bias)
    static.copy_(x * 0.5)
    graph.replay()
    assert torch.equal(static_y, gelu_tanh_kernel(x * 0.5, bias)) and not torch.equal(static_y, y)
    long_row = torch.randn(2, 40000, device="cuda", dtype=torch.bfloat16)  # 5000 vectors: over one block
    assert any("longer than one block" in r for r in QUANTIZED_SPEC.supports(long_row, None, "int8"))
