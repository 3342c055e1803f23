"""rocm_sd::linear_geglu: diffusers' GEGLU with its projection, the op that hosts the Composable Kernel GEMM
fusions (ck_templates/). Its default path (vendor GEMM, then rocm_sd::geglu) runs everywhere; the CK instances exist
only in ROCm builds with CK headers, so here they are routed to by name and shown to be refused or absent as the
dispatch rules say (no AMD GPU here: no CK instance has run)."""
import pytest
import torch

from rocm_sd import config, dispatch
from rocm_sd.ops import linear_geglu as geglu_op
from rocm_sd.ops._common import within_tolerance


def geglu_args(device="cpu", dtype=torch.float32, rows=(2, 16), k=64, n=32):
    x = torch.randn(*rows, k, device=device, dtype=dtype)
    return x, torch.randn(2 * n, k, device=device, dtype=dtype) / k ** 0.5, torch.randn(2 * n, device=device,
                                                                                         dtype=dtype)


def test_linear_geglu_default_path_is_the_projection_then_geglu():
    x, w, b = geglu_args()
    with config.override(log_fallbacks=False):
        y = torch.ops.rocm_sd.linear_geglu(x, w, b)
    assert torch.equal(y, geglu_op.linear_geglu_ref(x, w, b)) and y.shape == (2, 16, 32)
    assert dispatch.stats()["linear_geglu"] == {dispatch.COMPOSED: 1}
    assert dispatch.stats()["geglu"] == {"torch": 1}  # the epilogue op counts itself (CPU: PyTorch)


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


def test_a_tuned_ck_instance_this_build_lacks_takes_the_default_path(monkeypatch):
    """A database made on a ROCm build with CK, read by a build without it: the choice is not misused."""
    from rocm_sd.tune import active

    monkeypatch.setattr(active, "tuned_choice", lambda device, key: "ck:ck_linear_geglu_f16_missing")
    x, w, b = geglu_args()
    with config.override(log_fallbacks=False):
        assert torch.equal(torch.ops.rocm_sd.linear_geglu(x, w, b), geglu_op.linear_geglu_ref(x, w, b))
    assert dispatch.stats()["linear_geglu"] == {dispatch.COMPOSED: 1}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_default_path_on_the_gpu_matches_truth_and_runs_the_geglu_kernel(dtype):
    with config.override(strict=True):
        x, w, b = geglu_args("cuda", dtype, rows=(2, 1024), k=320, n=1280)
        y = torch.ops.rocm_sd.linear_geglu(x, w, b)
        ok, err, allowed = within_tolerance(y, geglu_op.linear_geglu_ref(x.double(), w.double(), b.double()),
                                            geglu_op.linear_geglu_ref(x, w, b))
        assert ok, (err, allowed)
        assert torch.equal(y, torch.ops.rocm_sd.geglu(torch.nn.functional.linear(x, w, b)))
    stats = dispatch.stats()
    assert stats["geglu"] == {"rocm_sd": 2}  # the op's epilogue, and the check's direct call
    assert stats["linear_geglu"] == {dispatch.COMPOSED: 1}
