"""rocm_sd::linear_geglu and rocm_sd::conv_bias_residual: the ops that host the Composable Kernel GEMM and
convolution fusions (ck_templates/). Their default path (vendor GEMM / convolution, then rocm_sd's epilogue op)
runs everywhere; the CK instances exist only in ROCm builds with CK headers, so here they are routed to by
name and shown to be refused or absent as the dispatch rules say (no AMD GPU here: no CK instance has run)."""
import importlib

import pytest
import torch

from rocm_sd import config, dispatch, ops
from rocm_sd.ops._common import within_tolerance

# The op modules (rocm_sd.ops.linear_geglu the attribute is the op itself, which shadows its module).
geglu_op = importlib.import_module("rocm_sd.ops.linear_geglu")
conv_op = importlib.import_module("rocm_sd.ops.conv_bias_residual")


def geglu_args(device="cpu", dtype=torch.float32, rows=(2, 16), k=64, n=32):
    x = torch.randn(*rows, k, device=device, dtype=dtype)
    return x, torch.randn(2 * n, k, device=device, dtype=dtype) / k ** 0.5, torch.randn(2 * n, device=device,
                                                                                         dtype=dtype)


def conv_args(device="cpu", dtype=torch.float32, n=2, c=16, k=24, hw=8, pad=1, channels_last=True):
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(n, c, hw, hw, device=device, dtype=dtype).contiguous(memory_format=fmt)
    w = (torch.randn(k, c, 3, 3, device=device, dtype=dtype) / (9 * c) ** 0.5).contiguous(memory_format=fmt)
    out_hw = hw + 2 * pad - 2
    residual = torch.randn(n, k, out_hw, out_hw, device=device, dtype=dtype).contiguous(memory_format=fmt)
    return x, w, torch.randn(k, device=device, dtype=dtype), residual, 0.5, pad, pad


def test_linear_geglu_default_path_is_the_projection_then_geglu():
    x, w, b = geglu_args()
    with config.override(log_fallbacks=False):
        y = torch.ops.rocm_sd.linear_geglu(x, w, b)
    assert torch.equal(y, geglu_op.linear_geglu_ref(x, w, b)) and y.shape == (2, 16, 32)
    assert dispatch.stats()["linear_geglu"] == {dispatch.COMPOSED: 1}
    assert dispatch.stats()["geglu"] == {"torch": 1}  # the epilogue op counts itself (CPU: PyTorch)


def test_conv_bias_residual_default_path_is_the_convolution_then_bias_residual():
    for channels_last in (True, False):
        args = conv_args(channels_last=channels_last)
        with config.override(log_fallbacks=False):
            y = torch.ops.rocm_sd.conv_bias_residual(*args)
        assert torch.equal(y, conv_op.conv_bias_residual_ref(*args))
        assert y.stride() == args[3].stride()  # the residual's layout, as the fake kernel says
    assert dispatch.stats()["conv_bias_residual"] == {dispatch.COMPOSED: 2}


def test_forced_torch_runs_the_reference():
    x, w, b = geglu_args()
    with dispatch.force_backend("linear_geglu", "torch"):
        assert torch.equal(torch.ops.rocm_sd.linear_geglu(x, w, b), geglu_op.linear_geglu_ref(x, w, b))
    assert dispatch.stats()["linear_geglu"] == {"torch": 1} and "geglu" not in dispatch.stats()


def test_ck_reasons_name_what_the_instances_cannot_take():
    x, w, b = geglu_args(dtype=torch.float16)
    assert geglu_op.ck_reasons(x, w, b) == []
    assert any("fp16" in r for r in geglu_op.ck_reasons(x.float(), w, b))
    assert any("multiples of 8" in r for r in geglu_op.ck_reasons(x[..., :60].contiguous(), w[:, :60].contiguous(), b))
    assert any("not contiguous" in r for r in geglu_op.ck_reasons(x.transpose(0, 1), w, b))
    assert any("(2N, K)" in r for r in geglu_op.ck_reasons(x, w[:, :32], b))
    assert any("weight's" in r for r in geglu_op.ck_reasons(x, w, b[:8]))

    x, w, bias, residual, _, pad, _ = conv_args(dtype=torch.float16)
    assert conv_op.ck_reasons(x, w, bias, residual, pad, pad) == []
    assert any("channels_last" in r for r in conv_op.ck_reasons(x.contiguous(), w, bias, residual, pad, pad))
    assert any("residual" in r for r in conv_op.ck_reasons(x, w, bias, residual, 0, 0))
    x12, w12 = (t[:, :12].contiguous(memory_format=torch.channels_last) for t in (x, w))
    assert any("multiples of 8" in r for r in conv_op.ck_reasons(x12, w12, bias, residual, pad, pad))
    assert any("fp16" in r for r in conv_op.ck_reasons(x, w, bias.float(), residual, pad, pad))


def test_a_tuned_ck_instance_this_build_lacks_takes_the_default_path(monkeypatch):
    """A database made on a ROCm build with CK, read by a build without it: the choice is not misused."""
    from rocm_sd.tune import active

    monkeypatch.setattr(active, "tuned_choice", lambda device, key: "ck:ck_linear_geglu_f16_missing")
    x, w, b = geglu_args()
    with config.override(log_fallbacks=False):
        assert torch.equal(torch.ops.rocm_sd.linear_geglu(x, w, b), geglu_op.linear_geglu_ref(x, w, b))
    assert dispatch.stats()["linear_geglu"] == {dispatch.COMPOSED: 1}


def test_patched_models_route_through_the_ops_only_in_builds_with_ck_instances(monkeypatch):
    """GEGLUFused and the fused ResnetBlock2D call the hosting ops only where CK instances exist (elsewhere the
    GEMM stays visible to torch.compile and no dispatch layer is added); the picture is the same either way."""
    import rocm_sd
    from rocm_sd import models

    pipe = models.build_sd_pipeline("tiny", "cpu", torch.float32)
    conditioning = models.prompt_kwargs(pipe, "a photo of a cat")

    def run():
        with torch.no_grad():
            return pipe(**conditioning, num_inference_steps=2, generator=torch.Generator().manual_seed(0), height=64,
                        width=64, output_type="latent").images

    with config.override(log_fallbacks=False):
        rocm_sd.optimize(pipe, cuda_graph=False)
        without_ck = run()
        assert "linear_geglu" not in dispatch.stats() and "conv_bias_residual" not in dispatch.stats()
        monkeypatch.setattr(geglu_op, "ck_instances", lambda device=None: ("ck_linear_geglu_f16_stand_in",))
        monkeypatch.setattr(conv_op, "ck_instances", lambda device=None: ("ck_conv_bias_residual_f16_stand_in",))
        with_ck = run()
    rocm_sd.revert(pipe)
    assert torch.equal(with_ck, without_ck)
    stats = dispatch.stats()
    assert stats["linear_geglu"][dispatch.COMPOSED] > 0 and stats["conv_bias_residual"][dispatch.COMPOSED] > 0


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_default_paths_on_the_gpu_match_truth_and_run_rocm_sd_epilogues(dtype):
    with config.override(strict=True):
        x, w, b = geglu_args("cuda", dtype, rows=(2, 1024), k=320, n=1280)
        y = torch.ops.rocm_sd.linear_geglu(x, w, b)
        ok, err, allowed = within_tolerance(y, geglu_op.linear_geglu_ref(x.double(), w.double(), b.double()),
                                            geglu_op.linear_geglu_ref(x, w, b))
        assert ok, (err, allowed)
        assert torch.equal(y, torch.ops.rocm_sd.geglu(torch.nn.functional.linear(x, w, b)))
        args = conv_args("cuda", dtype, c=320, k=320, hw=32)
        y = torch.ops.rocm_sd.conv_bias_residual(*args)
        double = tuple(a.double() if isinstance(a, torch.Tensor) else a for a in args)
        ok, err, allowed = within_tolerance(y, conv_op.conv_bias_residual_ref(*double),
                                            conv_op.conv_bias_residual_ref(*args))
        assert ok, (err, allowed)
        assert y.is_contiguous(memory_format=torch.channels_last)
    stats = dispatch.stats()
    assert stats["geglu"] == {"rocm_sd": 2} and stats["bias_residual"] == {"rocm_sd": 1}  # geglu: also the check
    assert stats["linear_geglu"] == stats["conv_bias_residual"] == {dispatch.COMPOSED: 1}
