import math

import pytest
import torch
import torch.nn.functional as F

from rocm_sd.modules.attention import heads_last
from rocm_sd.ops.attention import scaled_dot_product_attention
from rocm_sd import config, dispatch
from rocm_sd.ops._common import within_tolerance
from rocm_sd.ops.attention import (attention_kernel, attention_ref, describe, input_reasons, instance_fits, instances,
                                   supports)
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
