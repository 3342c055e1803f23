import pytest
import torch

from rocm_sd import config, dispatch
from rocm_sd.ops.attention import attention_ref
from rocm_sd.ops.attention_fp8 import (attention_fp8_kernel, attention_fp8_ref, describe, fp16_attention,
                                       input_reasons, supports)
from rocm_sd.ops.quantize import FORMATS, fp8_format
from tests.ops.test_attention import make_qkv
from tests.shapes import ATTENTION_AWKWARD, ATTENTION_SD

SHAPES = [s for s in ATTENTION_SD + ATTENTION_AWKWARD if s[-1] <= 160]


def max_err(a, b) -> float:
    return (a.double() - b.double()).abs().max().item()


# ------------------------------------------------------------------------------------------- CPU

@pytest.mark.parametrize("format", ["e4m3fn", "e4m3fnuz"])
def test_reference_is_attention_to_within_fp8_and_exact_on_fp8_inputs(format):
    q, k, v = make_qkv(2, 37, 29, 3, 40, torch.float64, "cpu")
    exact = attention_ref(q, k, v, 0.2)
    out = attention_fp8_ref(q, k, v, 0.2, format)
    assert out.dtype == torch.float64 and out.shape == exact.shape
    assert 1e-4 < max_err(out, exact) < 0.08 * exact.abs().max().item()  # it quantizes, and only by FP8's steps
    # FP8 values whose largest magnitude per channel is the format's max quantize with scale 1, without error, and
    # equal scores (zero) give every key the probability 1 (FP8 max after scaling, exact): the result is V's mean.
    _, fp8, fmax = FORMATS[format]
    v8 = torch.randn(2, 29, 3, 40, dtype=torch.float64).to(fp8).to(torch.float64)
    v8[:, 0] = fmax
    zeros = torch.zeros(2, 37, 3, 40, dtype=torch.float64)
    mean = v8.mean(1, keepdim=True).expand(2, 37, 3, 40)
    assert max_err(attention_fp8_ref(zeros, zeros[:, :29], v8, 0.2, format), mean) < 1e-12


def test_values_are_scaled_per_channel():
    """A channel 1000x larger than the others leaves their error where it was: V's scale is per head dim."""
    q, k, v = make_qkv(1, 64, 64, 2, 32, torch.float64, "cpu")
    loud = v.clone()
    loud[..., 5] *= 1000
    quiet = [d for d in range(32) if d != 5]
    err = (attention_fp8_ref(q, k, v, 0.2, "e4m3fn") - attention_ref(q, k, v, 0.2))[..., quiet].abs().max()
    err_loud = (attention_fp8_ref(q, k, loud, 0.2, "e4m3fn") - attention_ref(q, k, loud, 0.2))[..., quiet].abs().max()
    assert err_loud <= 1.5 * err


def test_unsupported_arguments_are_named():
    q, k, v = make_qkv(1, 16, 16, 2, 168, torch.float16, "cpu")
    assert any("head dim 168 > 160" in r for r in input_reasons(q, k, v, 0.1, "e4m3fn"))
    q, k, v = make_qkv(1, 16, 16, 2, 64, torch.float32, "cpu")
    assert any("dtypes" in r for r in input_reasons(q, k, v, 0.1, "e4m3fn"))
    assert supports(q, k, v, 0.1, "e4m3fn")
    with pytest.raises(RuntimeError, match="not an FP8 format"):
        torch.ops.rocm_sd.attention_fp8(q, k, v, 0.1, "int8")
    with pytest.raises(RuntimeError, match="fp4"):
        torch.ops.rocm_sd.attention_fp8(q, k, v, 0.1, "fp4")


def test_untuned_calls_run_the_fp16_attention_and_a_forced_kernel_on_cpu_raises():
    q, k, v = make_qkv(2, 16, 9, 2, 40, torch.float16, "cpu")
    with config.override(strict=True):
        out = torch.ops.rocm_sd.attention_fp8(q, k, v, 0.1, "e4m3fn")
    assert torch.equal(out, attention_ref(q, k, v, 0.1)) and dispatch.stats()["attention_fp8"] == {"torch": 1}
    with dispatch.force_backend("attention_fp8", "rocm_sd"), pytest.raises(dispatch.FallbackError, match="cannot run"):
        torch.ops.rocm_sd.attention_fp8(q, k, v, 0.1, "e4m3fn")


def test_tuning_problem_key_and_candidates():
    from rocm_sd.ops.attention_fp8 import SPEC

    q, k, v = make_qkv(2, 4096, 77, 10, 64, torch.float16, "meta")
    assert SPEC.key(q, k, v, 0.125, "e4m3fnuz") == "attention_fp8|float16|bshd|format=e4m3fnuz,B=2,H=10,Lq=4096,Lk=77,D=64"
    assert set(SPEC.candidates(q, k, v, 0.125, "e4m3fn")) == {"torch", "rocm_sd"}
    assert SPEC.candidates(q, k, v, 0.125, "e4m3fn")["torch"] is fp16_attention


# ------------------------------------------------------------------------------------------- GPU

def fp8_of_this_gpu() -> str:
    from rocm_sd import platform

    fmt, why = fp8_format(platform.device_arch(torch.device("cuda")))
    if fmt is None:
        pytest.skip(why)
    return fmt


def rms(x: torch.Tensor) -> float:
    return x.double().pow(2).mean().sqrt().item()


def check_kernel(shape, dtype, packed=False):
    """The kernel is as accurate as the FP8 definition: its error against exact attention is that of
    attention_fp8_ref (in RMS and at the worst element), where a layout or scaling bug errs by the whole output.
    Not the same roundings: the kernel rounds each tile of probabilities against its online softmax's running
    maximum (ops/attention_fp8.py)."""
    fmt = fp8_of_this_gpu()
    batch, q_len, kv_len, heads, dim = shape
    q, k, v = make_qkv(batch, q_len, kv_len, heads, dim, dtype, "cuda", packed=packed)
    scale = dim ** -0.5
    y = torch.full(q.shape, float("nan"), dtype=dtype, device="cuda")  # poisoned: every element must be written
    attention_fp8_kernel(q, k, v, scale, fmt, out=y)
    definition = attention_fp8_ref(q.double(), k.double(), v.double(), scale, fmt)
    exact = attention_ref(q.double(), k.double(), v.double(), scale)
    rounding = 2 ** -8 * exact.abs().max().item()  # the output's own fp16 / bf16 rounding
    err_rms, fp8_rms = rms(y - exact), rms(definition - exact)
    err_max, fp8_max = max_err(y, exact), max_err(definition, exact)
    where = f"{shape} {dtype} {describe(q, k, v, scale, fmt)}"
    assert not torch.isnan(y).any(), where
    assert err_rms <= 1.25 * fp8_rms + rounding / 4, f"{where}: rms err {err_rms:.3g}, the definition's {fp8_rms:.3g}"
    assert err_max <= 1.5 * fp8_max + rounding, f"{where}: max err {err_max:.3g}, the definition's {fp8_max:.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_kernel_matches_the_fp8_truth(shape, dtype):
    check_kernel(shape, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(2, 1024, 1024, 8, 40), (1, 77, 77, 3, 64), (2, 256, 256, 4, 160)], ids=str)
def test_kernel_takes_packed_qkv_views(shape):
    check_kernel(shape, torch.float16, packed=True)


@pytest.mark.gpu
def test_refusals_are_named():
    fmt = fp8_of_this_gpu()
    q, k, v = make_qkv(1, 16, 16, 1, 64, torch.float16, "cuda")
    other = "e4m3fnuz" if fmt == "e4m3fn" else "e4m3fn"
    assert any(f"format {other} is not" in r for r in supports(q, k, v, 0.1, other))
    assert describe(q, k, v, 0.1, fmt).startswith(f"f16_d64_w4_r1_n64 {fmt} grid=1x1x1")
    misaligned = torch.randn(1 + 16 * 64, device="cuda", dtype=torch.float16)[1:].view(1, 16, 1, 64)
    assert any("16-byte" in r for r in supports(misaligned, k, v, 0.1, fmt))


@pytest.mark.gpu
def test_nan_in_a_key_poisons_its_head_only():
    fmt = fp8_of_this_gpu()
    q, k, v = make_qkv(2, 64, 64, 2, 64, torch.float16, "cuda")
    k[1, 5, 0, 3] = float("nan")
    y = attention_fp8_kernel(q, k, v, 0.125, fmt)
    assert torch.isnan(y[1, :, 0]).all() and not torch.isnan(y[0]).any() and not torch.isnan(y[1, :, 1]).any()


@pytest.mark.gpu
def test_op_runs_the_kernel_when_forced_and_in_a_graph():
    fmt = fp8_of_this_gpu()
    q, k, v = make_qkv(2, 256, 77, 8, 80, torch.float16, "cuda")
    with config.override(strict=True), dispatch.force_backend("attention_fp8", "rocm_sd"):
        y = torch.ops.rocm_sd.attention_fp8(q, k, v, 0.1, fmt)
        graph = torch.cuda.CUDAGraph()
        static_q = q.clone()
        with torch.cuda.graph(graph):
            static_y = torch.ops.rocm_sd.attention_fp8(static_q, k, v, 0.1, fmt)
    assert dispatch.stats()["attention_fp8"] == {"rocm_sd": 2}
    static_q.copy_(q * 0.5)
    graph.replay()
    assert torch.equal(static_y, attention_fp8_kernel(q * 0.5, k, v, 0.1, fmt)) and not torch.equal(static_y, y)
    assert torch.equal(y, attention_fp8_kernel(q, k, v, 0.1, fmt))
