import pytest
import torch

from rocm_sd import config, dispatch
from rocm_sd.ops.quantize import (FORMATS, dequantize_rows, fp8_format, quantize_rows, quantize_rows_kernel,
                                  quantize_rows_ref, supports)

# One element; 7 and 333 wide (scalar accesses); 320 and 1280 (the projections' inputs, 16-byte vectors); 5120
# (the feed-forward's GEGLU output: longer rows than a wave holds in registers); a row of zeros inside make_rows.
QUANTIZE_SHAPES = [(1, 1), (3, 7), (5, 333), (2, 9, 320), (77, 1280), (4, 5120)]


def make_rows(shape, dtype, device):
    x = torch.randn(shape, dtype=torch.float32) * torch.logspace(-3, 3, shape[-1])[torch.randperm(shape[-1])]
    x = x.reshape(-1, shape[-1])
    if x.shape[0] > 2:
        x[1] = 0
    return x.reshape(shape).to(device, dtype)


def every_fp16_value(fmt):
    """Rows [fmax, v] for every fp16 bit pattern v (see the emulation test)."""
    values = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.float16)
    return torch.stack([torch.full_like(values, FORMATS[fmt][2]), values], dim=1)


def same_codes(q: torch.Tensor, q_ref: torch.Tensor) -> bool:
    """The same code for every value that is a number, NaN where the reference is NaN (its sign bit may differ: in
    e4m3fn 0x7F and 0xFF are both NaN)."""
    q = q.view(q_ref.dtype)
    nan = q_ref.float().isnan()
    return torch.equal(q.float().isnan(), nan) and torch.equal(q.view(torch.uint8)[~nan], q_ref.view(torch.uint8)[~nan])


def _code_steps(values: torch.Tensor, fmt: str) -> torch.Tensor:
    """The spacing of the format's codes at each value (in the format's units): 1 for int8; for e4m3, 2^(e - 3) in
    the binade 2^e, the subnormal quantum below the smallest normal."""
    if fmt == "int8":
        return torch.ones_like(values)
    bias = 8 if fmt == "e4m3fnuz" else 7
    exponent = torch.floor(torch.log2(values.abs().clamp_min(2.0 ** (1 - bias))))
    return torch.exp2(exponent - 3)


def rows_within_a_code(q, scale, q_ref, scale_ref, fmt: str, most_differing: float = 0.002) -> str:
    """'' if (q, scale) is (q_ref, scale_ref) up to a slightly different rounding of the values before encoding (a
    kernel's GELU of other accuracy than the definition's, for one): NaN where the reference has NaN, row scales
    within 2^-7 (one bf16 step of the row's largest value), every value within one code step of the reference's, and
    at most `most_differing` of the codes differing (two codes in any case: tiny tensors). Else what does not hold."""
    q, q_ref = (codes.view(FORMATS[fmt][1]).float().cpu() for codes in (q, q_ref))
    scale, scale_ref = scale.float().cpu(), scale_ref.float().cpu()
    if not torch.equal(q.isnan(), q_ref.isnan()) or not torch.equal(scale.isnan(), scale_ref.isnan()):
        return "NaN codes or scales where the reference has none, or the other way"
    if not torch.isclose(scale, scale_ref, rtol=2.0 ** -7, atol=0.0, equal_nan=True).all():
        return f"row scales differ by more than 2^-7: {scale} against {scale_ref}"
    ok = ~q_ref.isnan()
    rows_scale = scale.unsqueeze(-1).expand_as(q)[ok]
    values, values_ref = (q[ok] * rows_scale), (q_ref[ok] * scale_ref.unsqueeze(-1).expand_as(q_ref)[ok])
    step = torch.maximum(_code_steps(q[ok], fmt), _code_steps(q_ref[ok], fmt)) * rows_scale
    worst = ((values - values_ref).abs() - step - values_ref.abs() * 2.0 ** -7).max().item() if ok.any() else 0.0
    if worst > 0:
        return f"a value differs by more than a code step: by {worst:.3g} more"
    differing = int((q[ok] != q_ref[ok]).sum())
    if differing > max(2, most_differing * q.numel()):
        return f"{differing} of {q.numel()} codes differ (at most {most_differing:.2%} or 2)"
    return ""


# ------------------------------------------------------------------------------------------- CPU

@pytest.mark.parametrize("fmt", list(FORMATS))
def test_rows_within_a_code_takes_a_step_and_refuses_two(fmt):
    y = torch.randn(64, 256, dtype=torch.float64) * 3
    q_ref, scale_ref = quantize_rows_ref(y.half(), fmt)
    assert rows_within_a_code(q_ref, scale_ref, q_ref, scale_ref, fmt) == ""
    nudged, _ = quantize_rows_ref((y * (1 + 2.0 ** -12)).half(), fmt)  # a few values cross a rounding boundary
    assert not torch.equal(nudged.view(torch.uint8), q_ref.view(torch.uint8))
    assert rows_within_a_code(nudged, scale_ref, q_ref, scale_ref, fmt, most_differing=0.05) == ""
    two_steps = q_ref.clone().view(torch.int8)  # two codes away, where that stays a finite code
    small = two_steps[0].abs() < 100
    two_steps[0][small] += torch.where(two_steps[0][small] < 0, -2, 2).to(torch.int8) if fmt != "int8" else 2
    assert "more than a code step" in rows_within_a_code(two_steps.view(q_ref.dtype), scale_ref, q_ref, scale_ref, fmt)
    assert "codes differ" in rows_within_a_code(nudged, scale_ref, q_ref, scale_ref, fmt, most_differing=1e-4)
    assert "row scales" in rows_within_a_code(q_ref, scale_ref * 1.05, q_ref, scale_ref, fmt)

@pytest.mark.parametrize("fmt", list(FORMATS))
def test_reference_error_is_within_the_format_rounding(fmt):
    """Against float64: fp8 e4m3 keeps 3 mantissa bits (relative error <= 2^-4 for normal values, plus the
    subnormal quantum), int8 an absolute error <= half a step of amax / 127."""
    x = torch.randn(64, 320, dtype=torch.float64) * torch.logspace(-2, 2, 320, dtype=torch.float64)
    q, scale = quantize_rows_ref(x, fmt)
    back = dequantize_rows(q, scale).double()
    amax = x.abs().amax(-1, keepdim=True)
    if fmt == "int8":
        assert ((back - x).abs() <= amax / 127 * 0.5 * (1 + 1e-6)).all()
    else:
        fmax = FORMATS[fmt][2]
        smallest_normal = 2.0 ** (1 - (8 if fmt == "e4m3fnuz" else 7))
        quantum = scale.double().unsqueeze(-1) * smallest_normal / 8
        assert ((back - x).abs() <= torch.maximum(x.abs() / 16, quantum / 2) * (1 + 1e-6)).all()
        assert (q.float().abs().amax(-1) == fmax).all()  # the row's extreme uses the format's whole range


def test_reference_zero_rows_nan_and_empty():
    x = torch.tensor([[0.0, 0.0], [1.0, float("nan")], [-2.0, 1.0]])
    q, scale = quantize_rows_ref(x, "e4m3fn")
    assert torch.equal(q[0].float(), torch.zeros(2)) and scale[0] > 0
    assert scale[1].isnan() and q[1].float().isnan().all()  # NaN stays visible
    assert q[2, 0].float() == -448 and scale[2] == 2 / 448
    q, scale = quantize_rows_ref(torch.tensor([[1.0, float("nan")]]), "int8")
    assert scale.isnan().all()  # int8 has no NaN code: the scale carries it
    q, scale = quantize_rows_ref(torch.empty(3, 0), "int8")
    assert q.shape == (3, 0) and scale.shape == (3,)


@pytest.mark.parametrize("arch, expected", [
    ("gfx942", "e4m3fnuz"), ("gfx950", "e4m3fn"), ("gfx1200", "e4m3fn"), ("gfx1201", "e4m3fn"), ("sm_89", "e4m3fn"),
    ("sm_90", "e4m3fn"), ("sm_100", "e4m3fn"), ("gfx1100", None), ("gfx90a", None), ("sm_80", None)])
def test_fp8_format_per_arch(arch, expected):
    fmt, why = fp8_format(arch)
    assert fmt == expected
    assert (why is None) == (expected is not None)
    if arch == "gfx1100":
        assert "int8" in why and "gfx942" in why


def test_cpu_call_falls_back_to_the_reference():
    x = make_rows((3, 7), torch.float16, "cpu")
    with config.override(log_fallbacks=False):
        q, scale = quantize_rows(x, "e4m3fnuz")
    q_ref, scale_ref = quantize_rows_ref(x, "e4m3fnuz")
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)) and torch.equal(scale, scale_ref)
    assert dispatch.stats()["quantize_rows"] == {"torch": 1}


@pytest.mark.parametrize("case, expected", [
    (lambda: (torch.zeros(4, 8, dtype=torch.float64), "int8"), "dtype torch.float64"),
    (lambda: (torch.zeros(8, 4).t(), "int8"), "neither contiguous nor batches of contiguous rows"),
    (lambda: (torch.zeros(2, 5, 8)[:, :, :4], "int8"), "neither contiguous"),
    (lambda: (torch.zeros(0, 4), "int8"), "empty tensor"),
])
def test_unsupported_arguments_are_named(case, expected):
    assert any(expected in r for r in supports(*case()))


def test_batches_of_contiguous_rows_are_read_where_they_lie():
    """x[:, :L] of (B, L + L_txt, K): the kernel takes it (its row batches), the CPU path is the definition."""
    from rocm_sd.ops.quantize import row_batches

    joint = torch.randn(2, 7, 16)
    assert row_batches(joint[:, :5]) == (5, 7 * 16) and row_batches(joint[:, 5:]) == (2, 7 * 16)
    assert row_batches(joint) == (0, 0) and row_batches(joint[:, :, :8]) is None
    assert not any("contiguous" in r for r in supports(joint[:, :5], "int8"))
    with config.override(log_fallbacks=False):
        q, scale = quantize_rows(joint[:, :5], "e4m3fn")
    q_ref, scale_ref = quantize_rows_ref(joint[:, :5].contiguous(), "e4m3fn")
    assert q.is_contiguous() and same_codes(q, q_ref) and torch.equal(scale, scale_ref)


def test_bad_format_is_a_clear_error():
    with pytest.raises(RuntimeError, match="rocm_sd::quantize_rows: format .fp4. is not one of"):
        quantize_rows(torch.zeros(2, 4), "fp4")


# ------------------------------------------------------------------------------------------- GPU

@pytest.mark.gpu
@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("shape", QUANTIZE_SHAPES, ids=str)
def test_kernel_is_bit_exact(shape, dtype, fmt):
    x = make_rows(shape, dtype, "cuda")
    out = (torch.full(shape, 0x55, dtype=torch.uint8, device="cuda").view(FORMATS[fmt][1]),
           torch.full(shape[:-1], float("nan"), device="cuda"))
    q, scale = quantize_rows_kernel(x, fmt, out=out)
    q_ref, scale_ref = quantize_rows_ref(x, fmt)
    assert torch.equal(scale, scale_ref)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rows, text, k", [(4096, 333, 2432), (4096, 512, 3072), (5, 3, 33)], ids=str)
def test_kernel_reads_batches_of_rows_in_place(rows, text, k, dtype):
    """The image and text rows of a joint attention output (B, L + L_txt, K), each quantized where they lie."""
    joint = make_rows((2, rows + text, k), dtype, "cuda")
    for part in (joint[:, :rows], joint[:, rows:]):
        q, scale = quantize_rows_kernel(part, "e4m3fn")
        q_ref, scale_ref = quantize_rows_ref(part.contiguous(), "e4m3fn")
        assert q.is_contiguous() and torch.equal(scale, scale_ref) and same_codes(q, q_ref)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_kernel_encodes_every_fp16_value_as_torch(fmt):
    x = every_fp16_value(fmt).cuda()
    q, scale = quantize_rows_kernel(x, fmt)
    q_ref, scale_ref = quantize_rows_ref(x, fmt)
    assert torch.equal(scale.nan_to_num(-1.0), scale_ref.nan_to_num(-1.0))
    assert same_codes(q, q_ref)


@pytest.mark.gpu
def test_op_dispatches_to_kernel_in_strict_mode_and_in_a_graph():
    x = make_rows((2, 64, 320), torch.float16, "cuda")
    with config.override(strict=True):
        dispatch.reset_stats()
        q, scale = quantize_rows.call(x, "e4m3fn")
        assert dispatch.stats()["quantize_rows"] == {"rocm_sd": 1}
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            q2, scale2 = quantize_rows.call(x, "e4m3fn")
        graph.replay()
        torch.cuda.synchronize()
    assert torch.equal(q.view(torch.uint8), q2.view(torch.uint8)) and torch.equal(scale, scale2)
