import pytest
import torch
from torch import nn

from rocm_sd import config, dispatch
from rocm_sd.modules import RocmGroupNorm
from rocm_sd.ops._common import within_tolerance
from rocm_sd.ops.group_norm import describe, group_norm_kernel, group_norm_ref, input_reasons, supports
from tests.shapes import GROUP_NORM_AWKWARD, GROUP_NORM_SD


def make_inputs(shape, groups, dtype, device, channels_last=False, param_dtype=None, affine=True):
    x = (torch.randn(shape, device=device, dtype=torch.float32) * 1.7 + 0.4).to(dtype)
    if channels_last and x.dim() == 4:
        x = x.to(memory_format=torch.channels_last)
    elif channels_last:  # (N, C, L) with channels innermost, as .view() of a channels_last activation gives
        x = x.transpose(1, 2).contiguous().transpose(1, 2)
    c = shape[1]
    pd = param_dtype or dtype
    w = (torch.rand(c, device=device) + 0.5).to(pd) if affine else None
    b = (torch.randn(c, device=device) * 0.3).to(pd) if affine else None
    return x, groups, w, b


def truth(x, groups, w, b, eps, silu):
    return group_norm_ref(x.double(), groups, None if w is None else w.double(), None if b is None else b.double(),
                          eps, silu)


# ------------------------------------------------------------------------------------------- CPU

def test_reference_is_torch_groupnorm_then_silu():
    x, g, w, b = make_inputs((2, 64, 8, 8), 32, torch.float32, "cpu")
    gn = nn.GroupNorm(32, 64, eps=1e-6)
    gn.weight.data.copy_(w)
    gn.bias.data.copy_(b)
    assert torch.equal(group_norm_ref(x, 32, w, b, 1e-6, True), nn.SiLU()(gn(x)))
    assert torch.equal(group_norm_ref(x, 32, w, b, 1e-6, False), gn(x))


@pytest.mark.parametrize("channels_last", [False, True])
def test_cpu_call_falls_back_to_torch_exactly(channels_last):
    x, g, w, b = make_inputs((2, 64, 8, 8), 32, torch.float32, "cpu", channels_last)
    y = torch.ops.rocm_sd.group_norm(x, g, w, b, 1e-5, True)
    assert torch.equal(y, group_norm_ref(x, g, w, b, 1e-5, True))
    assert y.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    assert dispatch.stats()["group_norm"] == {"torch": 1}


def test_three_dim_channels_innermost_is_accepted_and_kept():
    # What Attention's group_norm sees in the VAE once activations are channels_last.
    x, g, w, b = make_inputs((2, 64, 20), 32, torch.float32, "cpu", channels_last=True)
    assert x.stride() == (64 * 20, 1, 64)
    assert input_reasons(x, g, w, b) == []
    y = torch.ops.rocm_sd.group_norm(x, g, w, b, 1e-5, True)
    assert y.stride() == x.stride()
    assert torch.equal(y, group_norm_ref(x, g, w, b, 1e-5, True))
    single = torch.randn(1, 20, 64).transpose(1, 2)[:, :, :]  # batch 1: the batch stride is arbitrary
    single = single.as_strided(single.shape, (64, 1, 64))
    assert input_reasons(single, 32, None, None) == []


def test_strict_mode_turns_fallback_into_error_with_reasons():
    x, g, w, b = make_inputs((2, 64, 8, 8), 32, torch.float32, "cpu")
    with config.override(strict=True), pytest.raises(dispatch.FallbackError, match="ROCM_SD_STRICT.*cpu|not built"):
        torch.ops.rocm_sd.group_norm(x, g, w, b, 1e-5, True)


def test_forced_kernel_backend_raises_when_it_cannot_run():
    x, g, w, b = make_inputs((2, 64, 8, 8), 32, torch.float32, "cpu")
    with dispatch.force_backend("group_norm", "rocm_sd"), pytest.raises(dispatch.FallbackError, match="requested"):
        torch.ops.rocm_sd.group_norm(x, g, w, b, 1e-5, False)


def test_forced_torch_backend_is_used():
    x, g, w, b = make_inputs((2, 64, 8, 8), 32, torch.float32, "cpu")
    with config.override(forced_backends={"group_norm": "torch"}, strict=True):
        torch.ops.rocm_sd.group_norm(x, g, w, b, 1e-5, False)
    assert dispatch.stats()["group_norm"] == {"torch": 1}


@pytest.mark.parametrize("case, expected", [
    ("dtype", "dtype torch.float64"),
    ("groups", "not divisible"),
    ("strides", "neither contiguous nor channels_last"),
    ("empty", "empty tensor"),
    ("param_dtype", "neither the input's"),
    ("param_shape", "contiguous (64,) vector"),
    ("dims", "needs (N, C, ...)"),
])
def test_unsupported_arguments_are_named(case, expected):
    x, g, w, b = make_inputs((2, 64, 8, 8), 32, torch.float16, "cpu")
    if case == "dtype":
        x = x.double()
        w, b = w.double(), b.double()
    elif case == "groups":
        g = 5
    elif case == "strides":
        x = x.transpose(2, 3)
    elif case == "empty":
        x = x[:0]
    elif case == "param_dtype":
        w = w.bfloat16()
    elif case == "param_shape":
        w = w[:32]
    elif case == "dims":
        x = x[0, 0, 0]
    reasons = input_reasons(x, g, w, b)
    assert any(expected in r for r in reasons), reasons
    assert any(expected in r for r in supports(x, g, w, b, 1e-5, True))


def test_fallback_with_fp32_params_and_half_input():
    x, g, w, b = make_inputs((2, 64, 8, 8), 32, torch.bfloat16, "cpu", param_dtype=torch.float32)
    with config.override(log_fallbacks=False):
        y = torch.ops.rocm_sd.group_norm(x, g, w, b, 1e-5, True)
    assert y.dtype == torch.bfloat16
    assert torch.equal(y, group_norm_ref(x.float(), g, w, b, 1e-5, True).bfloat16())


def test_fallback_handles_what_the_kernel_refuses():
    # Non-dense strides and float64 still compute, through PyTorch, and match it.
    x = torch.randn(2, 64, 8, 8, dtype=torch.float64).transpose(2, 3)
    y = torch.ops.rocm_sd.group_norm(x, 32, None, None, 1e-5, True)
    assert torch.equal(y, group_norm_ref(x, 32, None, None, 1e-5, True))


def test_module_shares_parameters_and_state_dict_keys():
    gn = nn.GroupNorm(32, 64, eps=1e-6)
    fused = RocmGroupNorm.from_group_norm(gn, act="silu")
    assert fused.weight is gn.weight and fused.bias is gn.bias
    assert fused.state_dict().keys() == gn.state_dict().keys()
    assert "RocmGroupNormSiLU" in repr(fused)
    x = torch.randn(2, 64, 4, 4)
    with torch.no_grad():
        assert torch.equal(fused(x), nn.functional.silu(gn(x)))


def test_module_is_differentiable():
    gn = nn.GroupNorm(8, 16)
    fused = RocmGroupNorm.from_group_norm(gn, act="silu")
    x = torch.randn(2, 16, 4, 4, requires_grad=True)
    fused(x).sum().backward()
    assert x.grad is not None and gn.weight.grad is not None


# ------------------------------------------------------------------------------------------- GPU

def check_kernel(shape, groups, dtype, channels_last, silu, param_dtype=None, affine=True, eps=1e-6, path="auto"):
    x, g, w, b = make_inputs(shape, groups, dtype, "cuda", channels_last, param_dtype, affine)
    assert not supports(x, g, w, b, eps, silu), supports(x, g, w, b, eps, silu)
    out = torch.full_like(x, float("nan"))  # poisoned: every element must be written
    y = group_norm_kernel(x, g, w, b, eps, silu, out=out, path=path)
    ref = truth(x, g, w, b, eps, silu)
    torch_same = group_norm_ref(x, g, None if w is None else w.to(dtype), None if b is None else b.to(dtype), eps, silu)
    ok, err, allowed = within_tolerance(y, ref, torch_same)
    assert ok, f"{shape} {dtype} cl={channels_last} silu={silu}: max err {err:.3g} > allowed {allowed:.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("shape", GROUP_NORM_SD, ids=str)
def test_kernel_matches_truth_at_sd_shapes(shape, dtype, channels_last):
    check_kernel(shape, 32, dtype, channels_last, silu=True)


def resident_fits(x, groups):
    """Whether the resident path can hold x's exchange (a group in NCHW, an image in NHWC) on this device."""
    return not describe(x, groups, "resident").startswith("error")


@pytest.mark.gpu
@pytest.mark.parametrize("path", ["resident", "split"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("shape", GROUP_NORM_SD, ids=str)
def test_each_path_matches_truth_at_sd_shapes(shape, channels_last, dtype, path):
    x = torch.empty(shape, device="cuda", dtype=dtype)
    x = x.to(memory_format=torch.channels_last) if channels_last else x
    if path == "resident" and not resident_fits(x, 32):
        # e.g. the VAE's channels_last images, far larger than what fits on a GPU at once: a clear error.
        with pytest.raises(RuntimeError, match="resident GroupNorm path cannot hold"):
            group_norm_kernel(x, 32, None, None, 1e-5, True, path="resident")
        return
    check_kernel(shape, 32, dtype, channels_last, silu=True, path=path)


@pytest.mark.gpu
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("shape, groups", GROUP_NORM_AWKWARD, ids=str)
def test_resident_path_at_awkward_shapes(shape, groups, channels_last):
    for dtype, silu in ((torch.float16, True), (torch.float32, False)):
        x = make_inputs(shape, groups, dtype, "cuda", channels_last)[0]
        if resident_fits(x, groups):
            check_kernel(shape, groups, dtype, channels_last, silu=silu, path="resident")
        else:  # e.g. fp32 channels_last rows of 4096 channels: 1024 threads a row, more than a resident block has
            assert channels_last and dtype == torch.float32, describe(x, groups, "resident")
            with pytest.raises(RuntimeError, match="resident GroupNorm path cannot hold"):
                group_norm_kernel(x, groups, None, None, 1e-5, silu, path="resident")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", GROUP_NORM_SD, ids=str)
def test_path_choice_at_sd_shapes(shape):
    # NCHW: one launch when a group fits one block (8 K fp16 elements), else the three-launch path.
    x = torch.empty(shape, device="cuda", dtype=torch.float16)
    one_block = shape[1] // 32 * shape[2] * shape[3] <= 8192
    assert describe(x, 32).startswith("resident" if one_block else "split"), describe(x, 32)
    # NHWC: every SD image spans several blocks, so the three-launch path unless tuned otherwise; the resident
    # path can hold the UNet's 8x8 .. 32x32 images (a few hundred KB to 2.6 MB), never the VAE's 128x128+.
    x = x.to(memory_format=torch.channels_last)
    assert describe(x, 32).startswith("split"), describe(x, 32)
    if shape[0] == 2 and shape[2] <= 32:
        assert resident_fits(x, 32), describe(x, 32, "resident")
    if shape[2] >= 128:
        assert not resident_fits(x, 32), describe(x, 32, "resident")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(2, 64, 4, 4), (3, 96, 7, 9)], ids=str)  # not 1x1: that is NCHW too
def test_nhwc_image_of_one_block_takes_the_resident_path(shape):
    x = make_inputs(shape, 32, torch.float16, "cuda", channels_last=True)[0]
    assert describe(x, 32).startswith("resident") and "blocks_per_image=1" in describe(x, 32), describe(x, 32)


@pytest.mark.gpu
def test_group_too_large_to_be_resident_takes_another_path():
    # One group of 16 M fp32 elements needs thousands of blocks at once: more than the device holds.
    x, g, w, b = make_inputs((1, 64, 512, 512), 1, torch.float32, "cuda")
    assert not describe(x, g).startswith("resident"), describe(x, g)
    with pytest.raises(RuntimeError, match="resident GroupNorm path cannot hold"):
        group_norm_kernel(x, g, w, b, 1e-5, True, path="resident")
    ok, err, allowed = within_tolerance(group_norm_kernel(x, g, w, b, 1e-5, True), truth(x, g, w, b, 1e-5, True),
                                        group_norm_ref(x, g, w, b, 1e-5, True))
    assert ok, (err, allowed)


@pytest.mark.gpu
@pytest.mark.parametrize("path", ["resident", "split"])
@pytest.mark.parametrize("shape, channels_last", [((1, 256, 128, 128), False), ((2, 320, 64, 64), True)], ids=str)
def test_kernel_is_deterministic(shape, channels_last, path):
    # Partials are merged in a fixed order whichever block arrives last: repeated runs agree bit for bit.
    x, g, w, b = make_inputs(shape, 32, torch.float16, "cuda", channels_last)
    if not resident_fits(x, g) and path == "resident":
        pytest.skip(f"resident path cannot hold {shape} on this device: {describe(x, g, 'resident')}")
    first = group_norm_kernel(x, g, w, b, 1e-6, True, path=path)
    for _ in range(3):
        assert torch.equal(group_norm_kernel(x, g, w, b, 1e-6, True, path=path), first)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("shape, groups", GROUP_NORM_AWKWARD, ids=str)
def test_kernel_matches_truth_at_awkward_shapes(shape, groups, dtype, channels_last):
    check_kernel(shape, groups, dtype, channels_last, silu=True)
    check_kernel(shape, groups, dtype, channels_last, silu=False)


@pytest.mark.gpu
@pytest.mark.parametrize("channels_last", [False, True])
def test_kernel_fp32_params_and_no_affine(channels_last):
    check_kernel((2, 320, 16, 16), 32, torch.float16, channels_last, True, param_dtype=torch.float32)
    check_kernel((2, 320, 16, 16), 32, torch.bfloat16, channels_last, True, affine=False)


@pytest.mark.gpu
@pytest.mark.parametrize("path", ["auto", "resident", "split"])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_kernel_large_mean_small_spread(dtype, channels_last, path):
    # Shifted sums + Chan merges: a mean 1000x the spread must not cancel catastrophically, nor may a first
    # element far from the rest (the shift of the sums) cost the others their precision.
    x = (torch.randn(2, 64, 32, 32, device="cuda") * 0.01 + 10.0)
    x[:, :, 0, 0] = -50.0
    x = x.to(dtype)
    x = x.to(memory_format=torch.channels_last) if channels_last else x
    y = group_norm_kernel(x, 32, None, None, 1e-6, False, path=path)
    ok, err, allowed = within_tolerance(y, truth(x, 32, None, None, 1e-6, False), group_norm_ref(x, 32, None, None, 1e-6, False))
    assert ok, (err, allowed)


@pytest.mark.gpu
@pytest.mark.parametrize("channels_last", [False, True])
def test_kernel_nan_stays_in_its_group(channels_last):
    x, g, w, b = make_inputs((2, 64, 8, 8), 32, torch.float16, "cuda", channels_last)
    x[1, 5, 3, 3] = float("nan")  # group 2 of image 1
    y = group_norm_kernel(x, g, w, b, 1e-5, True)
    assert torch.isnan(y[1, 4:6]).all()
    assert not torch.isnan(y[0]).any() and not torch.isnan(y[1, :4]).any() and not torch.isnan(y[1, 6:]).any()


@pytest.mark.gpu
@pytest.mark.parametrize("channels_last", [False, True])
def test_kernel_misaligned_storage_offset(channels_last):
    base = torch.randn(1 + 2 * 64 * 8 * 8, device="cuda", dtype=torch.float16)
    x = base[1:].view(2, 64, 8, 8)  # 2-byte offset: no 16-byte vectors possible
    if channels_last:
        x = base[1:].view(2, 8, 8, 64).permute(0, 3, 1, 2)
    ok, err, allowed = within_tolerance(group_norm_kernel(x, 32, None, None, 1e-5, True),
                                        truth(x, 32, None, None, 1e-5, True), group_norm_ref(x, 32, None, None, 1e-5, True))
    assert ok, (err, allowed)


@pytest.mark.gpu
def test_op_dispatches_to_kernel_and_counts():
    x, g, w, b = make_inputs((2, 320, 16, 16), 32, torch.float16, "cuda", True)
    with config.override(strict=True):
        y = torch.ops.rocm_sd.group_norm(x, g, w, b, 1e-5, True)
    assert dispatch.stats()["group_norm"] == {"rocm_sd": 1}
    assert y.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.gpu
@pytest.mark.parametrize("channels_last", [False, True])
def test_kernel_on_side_stream_and_in_cuda_graph(channels_last):
    x, g, w, b = make_inputs((2, 640, 32, 32), 32, torch.float16, "cuda", channels_last)
    expected = group_norm_kernel(x, g, w, b, 1e-5, True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        on_side = group_norm_kernel(x, g, w, b, 1e-5, True)
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(on_side, expected)
    graph = torch.cuda.CUDAGraph()
    static_x = x.clone()
    with torch.cuda.graph(graph):
        static_y = torch.ops.rocm_sd.group_norm(static_x, g, w, b, 1e-5, True)
    for scale in (2, 3):  # replays must re-arm the single-pass kernel's counters
        static_x.copy_(x * scale)
        graph.replay()
        assert torch.equal(static_y, group_norm_kernel(x * scale, g, w, b, 1e-5, True))


@pytest.mark.gpu
def test_non_dense_input_falls_back_or_raises_in_strict_mode():
    x = torch.randn(2, 64, 8, 8, device="cuda", dtype=torch.float16).transpose(2, 3)
    with config.override(strict=True), pytest.raises(dispatch.FallbackError, match="strides"):
        torch.ops.rocm_sd.group_norm(x, 32, None, None, 1e-5, True)
    with config.override(strict=False, log_fallbacks=False):
        y = torch.ops.rocm_sd.group_norm(x, 32, None, None, 1e-5, True)
    assert torch.equal(y, group_norm_ref(x, 32, None, None, 1e-5, True).contiguous())


# ------------------------------------------------------------------------------- input bias

def test_input_bias_reference_and_reasons():
    x, g, w, b = make_inputs((2, 64, 4, 4), 32, torch.float32, "cpu")
    ib = torch.randn(2, 64)
    assert torch.equal(group_norm_ref(x, g, w, b, 1e-5, True, ib),
                       group_norm_ref(x + ib[:, :, None, None], g, w, b, 1e-5, True))
    assert any("input_bias of shape (64,)" in r for r in supports(x, g, w, b, 1e-5, True, ib[0]))
    with config.override(log_fallbacks=False):
        y = torch.ops.rocm_sd.group_norm(x, g, w, b, 1e-5, True, ib)
    assert torch.equal(y, group_norm_ref(x, g, w, b, 1e-5, True, ib))


@pytest.mark.gpu
@pytest.mark.parametrize("path", ["auto", "resident", "split"])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("shape", [(2, 320, 64, 64), (2, 1280, 8, 8), (3, 96, 7, 9), (1, 128, 64, 64)], ids=str)
def test_kernel_with_input_bias_matches_truth(shape, channels_last, path):
    x, g, w, b = make_inputs(shape, 32, torch.float16, "cuda", channels_last)
    if path == "resident" and not resident_fits(x, g):
        pytest.skip(f"the resident path cannot hold {shape} cl={channels_last} on this device")
    ib = (torch.randn(shape[0], shape[1], device="cuda") * 3).half()  # conv bias + time embedding scale
    assert not supports(x, g, w, b, 1e-5, True, ib)
    out = torch.full_like(x, float("nan"))
    y = group_norm_kernel(x, g, w, b, 1e-5, True, out=out, path=path, input_bias=ib)
    ok, err, allowed = within_tolerance(y, truth_with_bias(x, g, w, b, ib), group_norm_ref(x, g, w, b, 1e-5, True, ib))
    assert ok, f"{shape} cl={channels_last} {path}: max err {err:.3g} > allowed {allowed:.3g}"


def truth_with_bias(x, g, w, b, ib):
    return group_norm_ref(x.double(), g, w.double(), b.double(), 1e-5, True, ib.double())
