import pytest
import torch
from torch import nn

from rocm_sd import config, dispatch
from rocm_sd.modules import RocmGEGLU
from rocm_sd.ops._common import within_tolerance
from tests.shapes import GEGLU_SD
from rocm_sd.ops.geglu import geglu_kernel, geglu_ref, input_reasons, supports

GEGLU_AWKWARD = [(1, 1, 2), (3, 7, 14), (5, 2 * 333), (2, 77, 2 * 1280)]


def make_input(shape, dtype, device):
    return (torch.randn(shape, device=device, dtype=torch.float32) * 2).to(dtype)


# ------------------------------------------------------------------------------------------- CPU

def test_reference_is_diffusers_geglu():
    from diffusers.models.activations import GEGLU

    module = GEGLU(32, 48)
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        assert torch.equal(geglu_ref(module.proj(x)), module(x))
        fused = RocmGEGLU.from_geglu(module)
        assert fused.state_dict().keys() == module.state_dict().keys()
        with config.override(log_fallbacks=False):
            assert torch.equal(fused(x), module(x))


def test_cpu_call_falls_back_exactly():
    x = make_input((2, 8, 64), torch.float32, "cpu")
    with config.override(log_fallbacks=False):
        y = torch.ops.rocm_sd.geglu(x)
    assert torch.equal(y, geglu_ref(x)) and y.is_contiguous()
    assert dispatch.stats()["geglu"] == {"torch": 1}


@pytest.mark.parametrize("case, expected", [
    ("dtype", "dtype torch.float64"), ("odd", "not even"), ("empty", "empty tensor"), ("strides", "not contiguous"),
])
def test_unsupported_arguments_are_named(case, expected):
    x = make_input((2, 8, 64), torch.float16, "cpu")
    x = {"dtype": x.double(), "odd": x[..., :63], "empty": x[:0], "strides": x.transpose(0, 1)}[case]
    assert any(expected in r for r in input_reasons(x)), input_reasons(x)
    assert any(expected in r for r in supports(x))


def test_fallback_handles_what_the_kernel_refuses():
    x = torch.randn(4, 6, 10, dtype=torch.float64).transpose(0, 1)
    with config.override(log_fallbacks=False):
        assert torch.equal(torch.ops.rocm_sd.geglu(x), geglu_ref(x))


def test_module_is_differentiable():
    fused = RocmGEGLU(nn.Linear(8, 12))
    x = torch.randn(3, 8, requires_grad=True)
    fused(x).sum().backward()
    assert x.grad is not None and fused.proj.weight.grad is not None


# ------------------------------------------------------------------------------------------- GPU

def check_kernel(shape, dtype):
    x = make_input(shape, dtype, "cuda")
    assert not supports(x), supports(x)
    out = torch.full(x.shape[:-1] + (x.shape[-1] // 2,), float("nan"), device="cuda", dtype=dtype)
    y = geglu_kernel(x, out=out)
    ok, err, allowed = within_tolerance(y, geglu_ref(x.double()), geglu_ref(x))
    assert ok, f"{shape} {dtype}: max err {err:.3g} > allowed {allowed:.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", GEGLU_SD + GEGLU_AWKWARD, ids=str)
def test_kernel_matches_truth(shape, dtype):
    check_kernel(shape, dtype)


@pytest.mark.gpu
def test_kernel_misaligned_and_nan():
    base = make_input((1 + 4 * 2 * 64,), torch.float16, "cuda")
    x = base[1:].view(4, 128)  # 2-byte offset: scalar accesses
    ok, err, allowed = within_tolerance(geglu_kernel(x), geglu_ref(x.double()), geglu_ref(x))
    assert ok, (err, allowed)
    x = make_input((4, 128), torch.float16, "cuda")
    x[1, 3] = float("nan")    # value half: NaN at (1, 3) only
    x[2, 64 + 5] = float("inf")  # gate half: gelu(inf) = inf
    y, ref = geglu_kernel(x), geglu_ref(x)
    assert torch.isnan(y[1, 3]) and torch.isinf(y[2, 5]) == torch.isinf(ref[2, 5])
    assert torch.equal(torch.isnan(y), torch.isnan(ref)) and torch.equal(torch.isinf(y), torch.isinf(ref))


@pytest.mark.gpu
def test_op_dispatches_to_kernel_in_strict_mode_and_in_a_graph():
    x = make_input((2, 64, 2560), torch.float16, "cuda")
    with config.override(strict=True):
        y = torch.ops.rocm_sd.geglu(x)
    assert dispatch.stats()["geglu"] == {"rocm_sd": 1}
    graph = torch.cuda.CUDAGraph()
    static = x.clone()
    with torch.cuda.graph(graph):
        static_y = torch.ops.rocm_sd.geglu(static)
    static.copy_(x * 0.5)
    graph.replay()
    assert torch.equal(static_y, geglu_kernel(x * 0.5)) and not torch.equal(static_y, y)
