import contextlib
import importlib
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from rocm_sd.modules.attention import heads_last
from rocm_sd.ops.attention import scaled_dot_product_attention
from rocm_sd import config, dispatch
from rocm_sd.ops import attention_self_check
from rocm_sd.ops._common import within_tolerance
from rocm_sd.ops.attention import (attention_kernel, attention_ref, describe, host_call_uses_op, input_reasons,
                                   instance_fits, instances, sdpa_fused_backends, supports, untuned_path)
from rocm_sd.ops.spec import PlanCache
from tests.sdpa_switches import sdpa_switched
from tests.shapes import ATTENTION_AWKWARD, ATTENTION_SD



def make_qkv(batch, q_len, kv_len, heads, dim, dtype, device, packed=False):
    """q, k, v as [B, L, H, D] views; packed: q, k, v are slices of one (B, L, 3 * H * D) projection (self-attn)."""
    def rand(*shape):
        return torch.randn(*shape, device=device, dtype=torch.float32).to(dtype)

    if packed:
        assert q_len == kv_len
        qkv = rand(batch, q_len, 3, heads, dim)
        return qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    return rand(batch, q_len, heads, dim), rand(batch, kv_len, heads, dim), rand(batch, kv_len, heads, dim)


def sdpa_bhld(q, k, v, scale):
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=scale)


# ------------------------------------------------------------------------------------------- CPU

def test_reference_is_sdpa_in_bshd_layout():
    q, k, v = make_qkv(2, 7, 5, 3, 16, torch.float32, "cpu")
    out = attention_ref(q, k, v, 0.3)
    assert out.shape == q.shape and out.is_contiguous()
    assert torch.equal(out, sdpa_bhld(q, k, v, 0.3).transpose(1, 2))
    scores = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double()) * 0.3
    truth = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v.double())
    assert torch.allclose(attention_ref(q.double(), k.double(), v.double(), 0.3), truth, atol=1e-12)


def test_query_chunks_bound_the_scores_and_give_the_same_result():
    from rocm_sd.ops.attention import SCORE_BUDGET_BYTES, default_score_budget, query_chunk

    q, k, v = make_qkv(2, 37, 23, 3, 16, torch.float64, "cpu")
    per_query = 2 * 3 * 23 * (8 + 4)
    assert query_chunk(q, 23, 5 * per_query) == 5 and query_chunk(q, 23, 1) == 1
    whole = attention_ref(q, k, v, 0.3)
    for budget in (1, 5 * per_query, 36 * per_query):  # one query a chunk, 5 (a partial last chunk), 36
        chunked = attention_ref(q, k, v, 0.3, budget_bytes=budget)
        assert chunked.is_contiguous() and torch.allclose(chunked, whole, rtol=0, atol=1e-12), budget
    # The default: chunks only where SDPA has no fused kernel (ROCm GPUs above head dim 256).
    assert default_score_budget(512, "cuda", hip=True) == SCORE_BUDGET_BYTES
    assert default_score_budget(256, "cuda", hip=True) is None and default_score_budget(512, "cuda", hip=False) is None
    assert default_score_budget(512, "cpu", hip=True) is None
    # The VAE mid-block of a 1024x1024 decode: 16384 queries in chunks of at most 256 MB of scores.
    vae = torch.empty(1, 16384, 1, 512, dtype=torch.float16, device="meta")
    assert query_chunk(vae, 16384, SCORE_BUDGET_BYTES) * 16384 * 6 <= SCORE_BUDGET_BYTES


def test_cpu_call_takes_sdpa_untuned_without_notice():
    q, k, v = make_qkv(1, 9, 9, 2, 8, torch.float32, "cpu", packed=True)
    with config.override(strict=True):  # an untuned shape's SDPA is a policy, not a fallback: no error
        out = torch.ops.rocm_sd.attention(q, k, v, 0.5)
    assert torch.equal(out, attention_ref(q, k, v, 0.5))
    assert dispatch.stats()["attention"] == {"torch": 1}


def test_host_entry_point_matches_sdpa_with_and_without_mask():
    q, k, v = (t.transpose(1, 2) for t in make_qkv(2, 12, 6, 4, 16, torch.float32, "cpu"))  # [B, H, L, D] views
    out = scaled_dot_product_attention(q, k, v)
    assert torch.allclose(out, F.scaled_dot_product_attention(q, k, v), atol=1e-6)
    assert dispatch.stats()["attention"] == {"torch": 1}
    mask = torch.rand(2, 1, 12, 6) > 0.3
    mask[..., 0] = True
    masked = scaled_dot_product_attention(q, k, v, mask, scale=0.2)
    assert torch.equal(masked, F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.2))
    assert dispatch.stats()["attention"] == {"torch": 1}  # masks go to SDPA directly


@pytest.mark.parametrize("case, expected", [
    ("float32", "dtypes torch.float32"), ("mixed", "dtypes torch.float16, torch.bfloat16"),
    ("dim", "head dim 520"), ("odd_dim", "head dim 36"), ("heads", "batch, heads, head dim"),
    ("v_dim", "v head dim 32"), ("empty", "empty tensor"), ("strided_dim", "head dim is not contiguous"),
    ("scale", "scale nan"), ("rank", "must be 4-D"),
])
def test_unsupported_arguments_are_named(case, expected):
    q, k, v = make_qkv(2, 8, 8, 2, 64, torch.float16, "cpu")
    scale = 0.125
    if case == "float32":
        q, k, v = q.float(), k.float(), v.float()
    elif case == "mixed":
        k = k.bfloat16()
    elif case == "dim":
        q, k, v = make_qkv(1, 4, 4, 1, 520, torch.float16, "cpu")
    elif case == "odd_dim":
        q, k, v = (t[..., :36] for t in (q, k, v))
    elif case == "heads":
        k, v = k[:, :, :1], v[:, :, :1]
    elif case == "v_dim":
        v = v[..., :32]
    elif case == "empty":
        q = q[:, :0]
    elif case == "strided_dim":
        q = torch.randn(2, 8, 2, 128, dtype=torch.float16)[..., ::2]
    elif case == "scale":
        scale = float("nan")
    elif case == "rank":
        q = q[0]
    reasons = input_reasons(q, k, v, scale)
    assert any(expected in r for r in reasons), reasons
    assert any(expected in r for r in supports(q, k, v, scale))


def test_forced_kernel_on_cpu_raises_with_the_reason():
    q, k, v = make_qkv(1, 4, 4, 1, 64, torch.float16, "cpu")
    with dispatch.force_backend("attention", "rocm_sd"), pytest.raises(dispatch.FallbackError, match="rocm_sd::attention"):
        torch.ops.rocm_sd.attention(q, k, v, 0.125)


def test_tuning_problem_key_and_candidates():
    from rocm_sd.tune import problems

    q, k, v = make_qkv(2, 16, 77, 8, 40, torch.float16, "cpu")
    key = problems.OPS["attention"].key(q, k, v, 0.1)
    assert key.startswith("attention|float16|bshd|") and "Lq=16" in key and "Lk=77" in key and "D=40" in key
    assert instance_fits("f16_d48_w4_r1_n64", torch.float16, 40) and instance_fits("bf16_d160_w4_r1_n32", torch.bfloat16, 160)
    assert instance_fits("f16_d512_w4_r1_n16_wide", torch.float16, 512) and instance_fits("f16_d512_w8_r1_n16_wide", torch.float16, 168)
    assert not instance_fits("f16_d32_w4_r2_n64", torch.float16, 40) and not instance_fits("bf16_d48_w4_r1_n64", torch.float16, 40)
    assert not instance_fits("f16_d64_w4_r1_n64", torch.float32, 64)
    candidates = problems.OPS["attention"].candidates(q, k, v, 0.1)
    assert problems.TORCH in candidates and {"torch:flash", "torch:efficient"} <= set(candidates)
    # Instances listed only where _C exists; each named one must hold the head dim and dtype.
    for name in candidates:
        if not name.startswith(problems.TORCH):
            assert instance_fits(name.removeprefix("rocm_sd:"), torch.float16, 40), name


def test_op_runs_a_tuned_sdpa_backend_and_gives_up_one_that_cannot_run(monkeypatch):
    """A "torch:<backend>" choice runs SDPA restricted to that backend; one that cannot take the call (a choice
    from a nearby tuned shape) falls back to SDPA's own pick, once, then for good for that shape."""
    import importlib

    from rocm_sd.ops.attention import attention_sdpa

    module = importlib.import_module("rocm_sd.ops.attention")
    q, k, v = make_qkv(2, 16, 9, 2, 40, torch.float32, "cpu")
    monkeypatch.setattr(dispatch, "tuned_choice", lambda device, key_fn: "torch:flash")
    with config.override(strict=True):
        assert torch.equal(torch.ops.rocm_sd.attention(q, k, v, 0.125), attention_sdpa(q, k, v, 0.125, "flash"))
    module.SPEC.plans.clear()
    monkeypatch.setattr(dispatch, "tuned_choice", lambda device, key_fn: "torch:efficient")  # none on a CPU
    calls = []
    real = module.attention_sdpa
    monkeypatch.setattr(module, "attention_sdpa", lambda *a: calls.append(a[-1]) or real(*a))
    with config.override(strict=True):
        for _ in range(2):
            assert torch.equal(torch.ops.rocm_sd.attention(q, k, v, 0.125), attention_ref(q, k, v, 0.125))
    assert calls == ["efficient"]  # tried once; the plan then says plain SDPA
    assert dispatch.stats()["attention"] == {"torch": 3}
    module.SPEC.plans.clear()


# ---- untuned calls where SDPA has no fused kernel (CPU: a stand-in GPU) -----------------------------------------

@pytest.fixture
def fake_gpu(monkeypatch, tmp_path):
    """CPU tensors stand in for a GPU's: _C is "available" and the kernel takes every call (supports() gives no
    reason), its launch is a fake kernel (SDPA in the call's dtype: within tolerance, so the self-check passes), and
    SDPA has the fused backends in `fused` (none unless a test adds one: it would take its math path). Plans,
    PyTorch's answers and the self-check's results start empty; the self-check's file is the test's own."""
    module = importlib.import_module("rocm_sd.ops.attention")
    launches, fused = [], set()

    def kernel(q, k, v, scale, out=None, instance=""):
        launches.append(tuple(q.shape))
        y = attention_ref(q, k, v, scale)
        return y if out is None else out.copy_(y)

    monkeypatch.setattr(module, "supports", lambda *args, **kwargs: [])
    monkeypatch.setattr(module, "attention_kernel", kernel)
    monkeypatch.setattr(module._ext, "unavailable_reason", lambda device: None)
    for name, check in module.FUSED_SDPA_CHECKS.items():
        monkeypatch.setattr(torch.backends.cuda, check, lambda params, debug=False, _name=name: _name in fused)
    monkeypatch.setattr(attention_self_check, "cache_path", lambda: tmp_path / "attention_self_check.json")
    PlanCache.clear_all()
    attention_self_check.forget()
    yield SimpleNamespace(module=module, launches=launches, fused=fused)
    PlanCache.clear_all()
    attention_self_check.forget()


def test_sdpa_is_asked_once_per_shape_about_the_calls_views(fake_gpu, monkeypatch):
    asked = []
    monkeypatch.setattr(torch.backends.cuda, "can_use_flash_attention",
                        lambda params, debug=False: asked.append((tuple(params.query.shape), params.is_causal)) or True)
    q, k, v = make_qkv(2, 16, 9, 3, 40, torch.float16, "cpu")
    assert sdpa_fused_backends(q, k, v) == ("flash",) and sdpa_fused_backends(q, k, v) == ("flash",)
    assert asked == [((2, 3, 16, 40), False)]  # [B, H, L, D] as SDPA sees them, asked once
    assert sdpa_fused_backends(*make_qkv(2, 32, 9, 3, 40, torch.float16, "cpu")) == ("flash",) and len(asked) == 2
    with sdpa_switched(False, ["flash"]):  # the switches change PyTorch's answer: part of the key
        sdpa_fused_backends(q, k, v)
    assert len(asked) == 3
    fake_gpu.fused.clear()
    monkeypatch.setattr(torch.backends.cuda, "can_use_flash_attention", lambda params, debug=False: False)
    PlanCache.clear_all()
    assert sdpa_fused_backends(q, k, v) == ()  # no fused backend: the math path


def test_sdpa_params_of_this_torch_and_of_others(monkeypatch):
    """torch 2.13's SDPAParams (query, key, value, mask, dropout, causal, enable_gqa) is built, and asked: CPU
    tensors have no fused GPU kernel. An older torch's six arguments are built too; a torch whose SDPAParams
    takes neither cannot be asked (None: the op keeps SDPA's own pick)."""
    q, k, v = make_qkv(1, 8, 8, 2, 64, torch.float16, "cpu")
    PlanCache.clear_all()
    assert sdpa_fused_backends(q, k, v) == ()

    class Torch24Params:
        def __init__(self, query, key, value, attn_mask, dropout, is_causal):
            self.query = query

    seen = []
    monkeypatch.setattr(torch.backends.cuda, "SDPAParams", Torch24Params)
    for check in ("can_use_flash_attention", "can_use_efficient_attention"):
        monkeypatch.setattr(torch.backends.cuda, check, lambda params, debug=False: seen.append(type(params)) or False)
    monkeypatch.delattr(torch.backends.cuda, "can_use_cudnn_attention")  # older torch: no cuDNN attention to ask
    PlanCache.clear_all()
    assert sdpa_fused_backends(q, k, v) == () and seen == [Torch24Params, Torch24Params]
    monkeypatch.setattr(torch.backends.cuda, "SDPAParams", lambda query, key, value: None)
    PlanCache.clear_all()
    assert sdpa_fused_backends(q, k, v) is None
    PlanCache.clear_all()


@pytest.mark.parametrize("fused, replace, forced, tuned, expected", [
    ((), True, None, None, "rocm_sd"),        # SDPA would take its math path: the kernel, untuned, after its check
    (("efficient",), True, None, None, "torch"),  # a fused SDPA kernel: SDPA's own pick, as before
    ((), False, None, None, "torch"),         # ROCM_SD_REPLACE_SDPA_MATH=0
    ((), True, "torch", None, "torch"),       # a backend forced by name decides
    ((), True, None, "torch", "torch"),       # a measured choice decides
    ((), True, None, "torch:cudnn", "rocm_sd"),  # a tuned SDPA backend switched off since: as if untuned
    (("cudnn",), True, None, "torch:cudnn", "torch"),  # the tuned backend can take it: it runs
], ids=["math-path", "fused", "switched-off", "forced", "tuned", "tuned-backend-gone", "tuned-backend-there"])
def test_untuned_plan_runs_the_kernel_only_where_sdpa_has_no_fused_kernel(fake_gpu, monkeypatch, fused, replace,
                                                                         forced, tuned, expected):
    fake_gpu.fused.update(fused)
    if tuned:
        monkeypatch.setattr(dispatch, "tuned_choice", lambda device, key_fn: tuned)
    q, k, v = make_qkv(2, 16, 9, 2, 40, torch.float16, "cpu")
    forcing = dispatch.force_backend("attention", forced) if forced else contextlib.nullcontext()
    with config.override(strict=True, replace_sdpa_math=replace), forcing:  # a policy, not a fallback: no error
        out = torch.ops.rocm_sd.attention(q, k, v, 0.125)
        assert torch.equal(torch.ops.rocm_sd.attention(q, k, v, 0.125), out)
    assert dispatch.stats()["attention"] == {expected: 2}
    assert torch.equal(out, attention_ref(q, k, v, 0.125))
    checked = len(attention_self_check.CASES)
    assert len(fake_gpu.launches) == (checked + 2 if expected == "rocm_sd" else 0)  # no check where it cannot decide


def test_the_plan_follows_the_sdpa_switches(fake_gpu, monkeypatch):
    """Switching SDPA's backends changes the plan of a shape already planned (the switches are in its key)."""
    monkeypatch.setattr(torch.backends.cuda, "can_use_flash_attention",
                        lambda params, debug=False: torch.backends.cuda.flash_sdp_enabled())
    q, k, v = make_qkv(1, 16, 16, 2, 64, torch.float16, "cpu")
    torch.ops.rocm_sd.attention(q, k, v, 0.125)
    with sdpa_switched(False, ["flash"]):
        torch.ops.rocm_sd.attention(q, k, v, 0.125)
    torch.ops.rocm_sd.attention(q, k, v, 0.125)
    assert dispatch.stats()["attention"] == {"torch": 2, "rocm_sd": 1}


def test_a_failed_self_check_keeps_sdpa_with_one_warning(fake_gpu, monkeypatch, caplog):
    def wrong(q, k, v, scale, out=None, instance=""):
        fake_gpu.launches.append(tuple(q.shape))
        return attention_ref(q, k, v, scale * 1.5)

    monkeypatch.setattr(fake_gpu.module, "attention_kernel", wrong)
    q, k, v = make_qkv(2, 16, 9, 2, 40, torch.float16, "cpu")
    assert host_call_uses_op(q.transpose(1, 2), 40, None)  # not checked yet: the op's plan will check
    with config.override(strict=True):
        for lengths in ((16, 9), (16, 9), (33, 77)):  # a second shape of the same head dim is not checked again
            q, k, v = make_qkv(2, *lengths, 2, 40, torch.float16, "cpu")
            assert torch.equal(torch.ops.rocm_sd.attention(q, k, v, 0.125), attention_ref(q, k, v, 0.125))
    assert dispatch.stats()["attention"] == {"torch": 3}
    assert len(fake_gpu.launches) == 1  # the check's first case failed
    warnings = [r.getMessage() for r in caplog.records if "self-check" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "GPU 0" in warnings[0] and "head dim 40 (float16)" in warnings[0] and "max error" in warnings[0]
    assert not host_call_uses_op(q.transpose(1, 2), 40, None)  # known to have failed: straight to SDPA
    assert host_call_uses_op(q[..., :32].transpose(1, 2), 32, None)  # another head dim has its own check


def test_host_calls_go_to_the_op_where_sdpa_has_no_fused_kernel(fake_gpu):
    q, k, v = (t.transpose(1, 2) for t in make_qkv(2, 64, 77, 8, 40, torch.float16, "cpu"))  # [B, H, L, D] views
    assert host_call_uses_op(q, 40, None)
    assert not host_call_uses_op(q, 40, torch.ones(2, 1, 64, 77, dtype=torch.bool))  # masked: SDPA
    assert not host_call_uses_op(q.float(), 40, None)  # a dtype the kernel does not take
    assert not host_call_uses_op(q[..., :36], 36, None) and not host_call_uses_op(q, 520, None)
    out = scaled_dot_product_attention(q, k, v)
    assert dispatch.stats()["attention"] == {"rocm_sd": 1}
    assert torch.equal(out, F.scaled_dot_product_attention(q, k, v))
    with config.override(replace_sdpa_math=False):
        assert not host_call_uses_op(q, 40, None)
    fake_gpu.fused.add("cudnn")
    PlanCache.clear_all()
    assert not host_call_uses_op(q, 40, None)  # SDPA has a fused kernel: straight to it, as before
    scaled_dot_product_attention(q, k, v)
    assert dispatch.stats()["attention"] == {"rocm_sd": 1, "torch": 1}


def test_info_says_which_path_and_why(fake_gpu, monkeypatch):
    device = torch.device("cpu")  # the stand-in GPU
    fake_gpu.fused.update({"flash", "efficient"})
    assert untuned_path(device, 64) == "PyTorch SDPA, fused (flash, efficient)"
    fake_gpu.fused.clear()
    PlanCache.clear_all()
    assert untuned_path(device, 64) == ("rocm_sd kernel: SDPA has no fused kernel for it (it would take its math "
                                        "path); self-check passed")
    with config.override(replace_sdpa_math=False):
        assert untuned_path(device, 64).endswith("math path: no fused SDPA kernel, and ROCM_SD_REPLACE_SDPA_MATH=0")
    with dispatch.force_backend("attention", "torch"):
        assert untuned_path(device, 64) == "PyTorch SDPA, forced by name (ROCM_SD_BACKEND)"
    monkeypatch.setattr(fake_gpu.module, "supports", lambda *args, **kwargs: ["head dim 520 (the kernel takes ...)"])
    assert untuned_path(device, 520).endswith("the kernel cannot take it: head dim 520 (the kernel takes ...)")
    monkeypatch.setattr(fake_gpu.module, "supports", lambda *args, **kwargs: [])
    monkeypatch.setattr(fake_gpu.module, "attention_kernel", lambda *args, **kwargs: (_ for _ in ()).throw(
        RuntimeError("invalid device function")))
    assert "the kernel failed its self-check: (batch, q_len, kv_len, heads, head_dim) (1, 2048, 197, 1, 80): " \
           "RuntimeError: invalid device function" in untuned_path(device, 80)


def test_info_lists_the_untuned_path_per_head_dim(monkeypatch):
    from rocm_sd import info

    assert info._untuned_attention(torch.device("cpu")) == [
        ("untuned attention", "not applicable on a CPU (SDPA's CPU kernels run every call)")]
    monkeypatch.setattr(importlib.import_module("rocm_sd.ops.attention"), "untuned_path",
                        lambda device, dim: f"path of {dim} on {device}")
    rows = info._untuned_attention(torch.device("cuda", 0))
    assert list(info.ATTENTION_HEAD_DIMS) == [40, 64, 80, 128, 160, 256, 512]
    assert rows == [(f"attention d={dim} fp16", f"path of {dim} on cuda:0") for dim in info.ATTENTION_HEAD_DIMS]


# ------------------------------------------------------------------------------------------- GPU

def check_kernel(shape, dtype, packed=False, instance=""):
    batch, q_len, kv_len, heads, dim = shape
    q, k, v = make_qkv(batch, q_len, kv_len, heads, dim, dtype, "cuda", packed=packed)
    scale = 1.0 / math.sqrt(dim)
    assert not supports(q, k, v, scale, instance), supports(q, k, v, scale, instance)
    out = torch.full(q.shape, float("nan"), device="cuda", dtype=dtype)  # poisoned: every element must be written
    y = attention_kernel(q, k, v, scale, out=out, instance=instance)
    truth = attention_ref(q.double(), k.double(), v.double(), scale)
    ok, err, allowed = within_tolerance(y, truth, attention_ref(q, k, v, scale))
    assert ok, f"{shape} {dtype} {instance or describe(q, k, v, scale)}: max err {err:.3g} > {allowed:.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", ATTENTION_SD + ATTENTION_AWKWARD, ids=str)
def test_kernel_matches_truth(shape, dtype):
    check_kernel(shape, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(2, 1024, 1024, 8, 40), (1, 77, 77, 3, 64), (2, 256, 256, 4, 160),
                                   (1, 300, 300, 2, 512)], ids=str)
def test_kernel_takes_packed_qkv_views(shape):
    check_kernel(shape, torch.float16, packed=True)


@pytest.mark.gpu
def test_every_instance_is_correct():
    for name in instances():
        dtype = torch.float16 if name.startswith("f16_") else torch.bfloat16
        fitting = [dim for dim in range(8, 513, 8) if instance_fits(name, dtype, dim)]
        for dim in {fitting[-1], fitting[-2]}:  # the padded head dim itself, and one padded by 8
            check_kernel((1, 130, 97, 2, dim), dtype, instance=name)


@pytest.mark.gpu
def test_instance_refusals_are_named():
    q, k, v = make_qkv(1, 16, 16, 1, 64, torch.float16, "cuda")
    assert any("another dtype" in r for r in supports(q, k, v, 0.1, "bf16_d64_w4_r2_n64"))
    assert any("smaller head dim" in r for r in supports(q, k, v, 0.1, "f16_d48_w4_r1_n64"))
    assert any("no attention instance named" in r for r in supports(q, k, v, 0.1, "f16_d64_w9_n1"))
    misaligned = torch.randn(1 + 16 * 64, device="cuda", dtype=torch.float16)[1:].view(1, 16, 1, 64)
    assert any("16-byte" in r for r in supports(misaligned, k, v, 0.1))
    assert describe(q, k, v, 0.1).startswith("f16_d64_w4_r1_n32 grid=1x1x1")
    wide = make_qkv(1, 4096, 4096, 1, 512, torch.float16, "cuda")  # the VAE's mid-block at 512x512
    assert describe(*wide, 0.1).startswith("f16_d512_w4_r2_n16_wide grid=128x1x1")
    assert any("smaller head dim" in r for r in supports(*wide, 0.1, "f16_d160_w4_r1_n32"))


@pytest.mark.gpu
def test_nan_in_a_key_poisons_every_query_and_only_that_batch():
    q, k, v = make_qkv(2, 64, 64, 2, 64, torch.float16, "cuda")
    k[1, 5, 0, 3] = float("nan")  # batch 1, head 0: every score row of that head sees it
    y = attention_kernel(q, k, v, 0.125)
    assert torch.isnan(y[1, :, 0]).all() and not torch.isnan(y[0]).any() and not torch.isnan(y[1, :, 1]).any()


@pytest.mark.gpu
def test_op_runs_the_kernel_when_forced_or_tuned_and_in_a_graph():
    q, k, v = make_qkv(2, 256, 77, 8, 80, torch.float16, "cuda")
    with config.override(strict=True), dispatch.force_backend("attention", "rocm_sd"):
        y = torch.ops.rocm_sd.attention(q, k, v, 0.1)
        graph = torch.cuda.CUDAGraph()
        static_q = q.clone()
        with torch.cuda.graph(graph):
            static_y = torch.ops.rocm_sd.attention(static_q, k, v, 0.1)
    assert dispatch.stats()["attention"] == {"rocm_sd": 2}
    static_q.copy_(q * 0.5)
    graph.replay()
    assert torch.equal(static_y, attention_kernel(q * 0.5, k, v, 0.1)) and not torch.equal(static_y, y)
    assert torch.equal(y, attention_kernel(q, k, v, 0.1))


@pytest.mark.gpu
def test_host_entry_point_runs_the_kernel_on_head_views_without_copies():
    q, k, v = make_qkv(2, 1024, 1024, 8, 40, torch.float16, "cuda", packed=True)
    heads_first = [t.transpose(1, 2) for t in (q, k, v)]  # what host apps hand over: [B, H, L, D] views
    with config.override(strict=True), dispatch.force_backend("attention", "rocm_sd"):
        out = scaled_dot_product_attention(*heads_first)
    assert dispatch.stats()["attention"] == {"rocm_sd": 1}
    merged = heads_last(out)
    assert merged.data_ptr() == out.data_ptr()  # the output projection's input is a view, not a copy
    ok, err, allowed = within_tolerance(out, F.scaled_dot_product_attention(*(t.double() for t in heads_first)),
                                        F.scaled_dot_product_attention(*heads_first))
    assert ok, (err, allowed)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(2, 1024, 77, 8, 40), (2, 1024, 1024, 10, 64), (1, 1024, 1024, 1, 512)], ids=str)
def test_untuned_call_runs_the_kernel_where_sdpa_has_no_fused_kernel(shape):
    """NVIDIA stands in for the ROCm GPUs without AOTriton: with SDPA's fused backends on, an untuned call stays
    SDPA's; with them off (SDPA would take its math path), the same call runs the kernel, after its self-check on
    this GPU, and matches the float64 truth; the host entry point goes to the op for it."""
    batch, q_len, kv_len, heads, dim = shape
    q, k, v = make_qkv(batch, q_len, kv_len, heads, dim, torch.float16, "cuda")
    scale = 1.0 / math.sqrt(dim)
    attention_self_check.forget()
    PlanCache.clear_all()
    with config.override(strict=True):
        with sdpa_switched(True):
            assert sdpa_fused_backends(q, k, v), "this GPU's SDPA has no fused kernel for the shape"
            torch.ops.rocm_sd.attention(q, k, v, scale)
            assert dispatch.stats()["attention"] == {"torch": 1}
            assert attention_self_check.known(q.device, q.dtype, dim) is None  # no reason to check
        with sdpa_switched(False):
            assert sdpa_fused_backends(q, k, v) == ()
            y = torch.ops.rocm_sd.attention(q, k, v, scale)
            host = scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), scale=scale)
    assert dispatch.stats()["attention"] == {"torch": 1, "rocm_sd": 2}
    check = attention_self_check.known(q.device, q.dtype, dim)
    assert check is not None and check["ok"], check
    assert torch.equal(y, attention_kernel(q, k, v, scale)) and torch.equal(heads_last(host), y.flatten(2))
    ok, err, allowed = within_tolerance(y, attention_ref(q.double(), k.double(), v.double(), scale),
                                        attention_ref(q, k, v, scale))
    assert ok, f"{shape}: max err {err:.3g} > {allowed:.3g}"
    PlanCache.clear_all()


@pytest.mark.gpu
def test_info_names_the_untuned_path_on_this_gpu():
    device = torch.device("cuda")
    PlanCache.clear_all()
    assert untuned_path(device, 80).startswith("PyTorch SDPA, fused (")
    with sdpa_switched(False):
        assert untuned_path(device, 80) == ("rocm_sd kernel: SDPA has no fused kernel for it (it would take its math "
                                            "path); self-check passed")
    PlanCache.clear_all()
