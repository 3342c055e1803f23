"""The ComfyUI node's attention_precision option (patch/comfy.py): FP8 attention through rocm_sd::attention_fp8 in
ComfyUI's calling conventions, against the stand-in of ComfyUI's interfaces (tests/standins)."""
from __future__ import annotations

import functools

import pytest
import torch

from rocm_sd import config, dispatch
from rocm_sd.patch import comfy as comfy_patch

from tests.comfyui_standin import model_inputs, run_model, run_patched_with_stats, standin_model


def _override(patcher):
    return patcher.model_options["transformer_options"].get("optimized_attention_override")


def test_on_a_cpu_it_is_not_applied_and_says_why(comfy):
    patcher = standin_model(comfy).clone()
    not_installed = comfy_patch.patch_model_patcher(patcher, override_supported=True, attention_precision="fp8")
    assert any(why.startswith("attention_precision=fp8 not applied") and "needs a GPU" in why
               for why in not_installed), not_installed
    assert _override(patcher) is comfy_patch.attention_override  # the fp16 attention, as without the option


def test_without_the_attention_option_it_says_so(comfy, monkeypatch):
    monkeypatch.setattr(comfy_patch.attention_fp8_patch, "fp8_of", lambda device: ("e4m3fn", None))
    patcher = standin_model(comfy).clone()
    not_installed = comfy_patch.patch_model_patcher(patcher, attention=False, attention_precision="fp8")
    assert "attention_precision=fp8 not applied: the attention option is off" in not_installed
    assert _override(patcher) is None


@pytest.mark.parametrize("override_supported", [True, False])
def test_unmasked_calls_go_to_the_fp8_op(comfy, nodes, monkeypatch, override_supported):
    """With the device check answered (a CPU has no FP8) and the op wanted, every transformer attention goes to
    attention_fp8 (the override, or the replace patches of an older ComfyUI), which on the CPU (untuned) computes
    the fp16 attention: ComfyUI's result."""
    monkeypatch.setattr(comfy_patch.attention_fp8_patch, "fp8_of", lambda device: ("e4m3fnuz", None))
    monkeypatch.setattr(comfy_patch, "fp8_call_uses_op", lambda q: True)
    patcher = standin_model(comfy)
    x, ctx = model_inputs()
    reference = run_model(patcher, x, ctx)
    optimized = patcher.clone()
    not_installed = comfy_patch.patch_model_patcher(optimized, group_norm=False, layer_norm=False,
                                                    override_supported=override_supported, attention_precision="fp8")
    assert not not_installed
    if override_supported:
        patches = [_override(optimized)]
    else:
        replaces = optimized.model_options["transformer_options"]["patches_replace"]
        patches = [patch for kind in ("attn1", "attn2") for patch in replaces[kind].values()]
    assert all(isinstance(p, functools.partial) and p.keywords == {"fp8_format": "e4m3fnuz"} for p in patches)
    with config.override(log_fallbacks=False):
        got, stats = run_patched_with_stats(optimized, x, ctx)
    attentions = 2 * sum(1 for m in patcher.model.modules() if type(m).__name__ == "BasicTransformerBlock")
    assert stats["attention_fp8"] == {"torch": attentions}
    torch.testing.assert_close(got, reference, rtol=1e-5, atol=1e-5)


def test_masked_calls_stay_comfyuis(monkeypatch):
    monkeypatch.setattr(comfy_patch, "fp8_call_uses_op", lambda q: True)
    seen = []

    def original(*args, **kwargs):
        seen.append(kwargs["mask"])
        return "comfy's own"

    q = torch.randn(1, 4, 16)
    mask = torch.ones(4, 4, dtype=torch.bool)
    assert comfy_patch.attention_override(original, q, q, q, 2, mask=mask, fp8_format="e4m3fn") == "comfy's own"
    assert seen == [mask]


@pytest.mark.gpu
def test_the_node_runs_the_fp8_kernel_when_forced(comfy, nodes):
    patcher = standin_model(comfy, "cuda", torch.float16, channels=64)  # head dim 32
    x, ctx = model_inputs("cuda", torch.float16)
    (fp16,) = nodes.RocmSDOptimizeModel().optimize(patcher, cuda_graph=False)
    reference, _ = run_patched_with_stats(fp16, x, ctx)
    (fp8,) = nodes.RocmSDOptimizeModel().optimize(patcher, cuda_graph=False, attention_precision="fp8")
    with config.override(strict=True), dispatch.force_backend("attention_fp8", dispatch.KERNEL):
        got, stats = run_patched_with_stats(fp8, x, ctx)
    attentions = 2 * sum(1 for m in patcher.model.modules() if type(m).__name__ == "BasicTransformerBlock")
    assert stats["attention_fp8"] == {"rocm_sd": attentions}
    assert torch.isfinite(got).all()
    error = ((got - reference).float().abs().max() / reference.float().abs().max()).item()
    assert 0 < error < 0.2, error  # FP8 changes the output, by an FP8-sized amount
