"""The ComfyUI node on ComfyUI's diffusion transformers, SD3 / SD3.5 (MMDiT) and Flux, against the stand-ins of
comfy/ldm/modules/diffusionmodules/mmdit.py and comfy/ldm/flux (tests/standins: their blocks' forwards op for op as
ComfyUI's at a125cd84). On the CPU the ops run their PyTorch references, so besides agreeing with ComfyUI's forward
the tests check that the copies are in place and the ops were called (rocm_sd.stats)."""
from __future__ import annotations

import sys
import types

import pytest
import torch

import rocm_sd
from rocm_sd.modules.comfy_dit import dit_block_copy
from rocm_sd.patch import comfy as comfy_patch
from tests.comfyui_standin import standin_model

MODELS = {  # (stand-in class, its options): SD3 Medium, SD3.5 Medium (dual attention), SD3.5 Large, Flux
    "sd3": ("mmdit", {}),
    "sd35m": ("mmdit", {"qk_norm": "rms", "x_block_self_attn_layers": (0,)}),
    "sd35": ("mmdit", {"qk_norm": "rms"}),
    "flux": ("flux", {}),
}
BLOCKS = {"mmdit": ["joint_blocks.0", "joint_blocks.1", "final_layer"],
          "flux": ["double_blocks.0", "double_blocks.1", "single_blocks.0", "single_blocks.1", "final_layer"]}


def _classes():
    from comfy.ldm.flux.model import Flux
    from comfy.ldm.modules.diffusionmodules.mmdit import OpenAISignatureMMDITWrapper

    return {"mmdit": OpenAISignatureMMDITWrapper, "flux": Flux}


def dit_model(comfy, name, device="cpu", dtype=torch.float32, **kw):
    family, options = MODELS[name]
    return standin_model(comfy, device, dtype, unet_model=_classes()[family], **options, **kw)


def dit_inputs(batch=2, device="cpu", dtype=torch.float32):
    """latents, text, and the extra conditioning (pooled text y, Flux's guidance) as ComfyUI's model_base passes it."""
    g = torch.Generator().manual_seed(1)
    x, ctx, y = torch.randn(batch, 4, 8, 8, generator=g), torch.randn(batch, 5, 24, generator=g), \
        torch.randn(batch, 8, generator=g)
    extra = {"y": y.to(device, dtype), "guidance": torch.full((batch,), 3.5, device=device)}
    return x.to(device, dtype), ctx.to(device, dtype), extra


def run(patcher, x, ctx, extra, family):
    t = torch.linspace(0.3, 0.8, x.shape[0], device=x.device)
    extra = extra if family == "flux" else {"y": extra["y"]}
    with torch.inference_mode():
        return patcher.model.apply_model(x, t, ctx, transformer_options=patcher.model_options["transformer_options"],
                                         **extra)


def assert_same(got, reference, rtol=1e-4):
    """Within fp32 rounding of ComfyUI's result, relative to its largest value (random weights: large logits)."""
    assert (got - reference).abs().max().item() <= rtol * reference.abs().max().item()


def _rocm_blocks(model) -> list[str]:
    return [name for name, m in model.named_modules() if type(m).__name__.startswith("Rocm")]


@pytest.mark.parametrize("name,batch", [("sd3", 2), ("sd35m", 2), ("sd35", 1), ("flux", 1), ("flux", 2)])
def test_blocks_run_rocm_sd_ops_as_comfyuis_forward_and_revert_exactly(comfy, nodes, name, batch, monkeypatch):
    family = MODELS[name][0]
    patcher = dit_model(comfy, name)
    x, ctx, extra = dit_inputs(batch)
    reference = run(patcher, x, ctx, extra, family)
    originals = dict(patcher.model.named_modules())
    (optimized,) = nodes.RocmSDOptimizeModel().optimize(patcher)
    assert sorted(optimized.object_patches) == sorted(f"diffusion_model.{b}" for b in BLOCKS[family])
    override = optimized.model_options["transformer_options"]["optimized_attention_override"]
    calls = []
    optimized.model_options["transformer_options"]["optimized_attention_override"] = \
        lambda *a, **k: calls.append(a[1].shape) or override(*a, **k)
    ropes = []
    if family == "flux":  # which rope reaches ComfyUI's attention: none where rocm_sd::rms_norm applied it
        import comfy.ldm.flux.layers as flux_layers

        attention = flux_layers.attention
        monkeypatch.setattr(flux_layers, "attention", lambda *a, pe=None, **k: ropes.append(pe) or attention(
            *a, pe=pe, **k))
    optimized.patch_model()
    try:
        assert _rocm_blocks(optimized.model) == [f"diffusion_model.{b}" for b in BLOCKS[family]]
        rocm_sd.reset_stats()
        got = run(optimized, x, ctx, extra, family)
        stats = rocm_sd.stats()
    finally:
        optimized.unpatch_model()
    assert_same(got, reference)
    assert stats["ada_layer_norm"] and stats["add_ada_layer_norm"] and (name == "sd3" or stats["rms_norm"])
    assert len(calls) == (4 if family == "flux" else 3 if name == "sd35m" else 2)  # per block; SD3.5 Medium: +1
    if family == "flux":
        assert all((pe is None) == (batch == 1) for pe in ropes) and len(ropes) == 4
    assert dict(patcher.model.named_modules()) == originals and not _rocm_blocks(patcher.model)
    assert torch.equal(run(patcher, x, ctx, extra, family), reference)


@pytest.mark.parametrize("name", ["sd35", "flux"])
def test_lora_weight_patches_reach_the_fused_blocks(comfy, nodes, name):
    """ComfyUI's LoRA patching sets new Parameters through the patched paths when the model loads: the Linears' and
    the Q / K norms' weights the copies read are the patched ones."""
    family = MODELS[name][0]
    patcher = dit_model(comfy, name)
    x, ctx, extra = dit_inputs()
    plain = run(patcher, x, ctx, extra, family)
    keys = ([f"diffusion_model.joint_blocks.0.x_block.{p}" for p in ("attn.qkv.weight", "attn.ln_q.weight",
                                                                     "mlp.fc1.weight")]
            if family == "mmdit" else
            [f"diffusion_model.{p}" for p in ("double_blocks.0.img_attn.norm.query_norm.scale",
                                              "double_blocks.1.txt_mlp.0.weight", "single_blocks.0.linear2.weight")])
    state = patcher.model.state_dict()
    lora = patcher.clone()
    lora.add_patches({k: (torch.randn_like(state[k]) * 0.1,) for k in keys})
    lora.patch_model()
    try:
        reference = run(lora, x, ctx, extra, family)
    finally:
        lora.unpatch_model()
    (optimized,) = nodes.RocmSDOptimizeModel().optimize(lora)
    optimized.patch_model()
    try:
        got = run(optimized, x, ctx, extra, family)
    finally:
        optimized.unpatch_model()
    assert (reference - plain).abs().max() > 1e-2  # the patches change the model
    assert_same(got, reference)


def test_weights_comfyui_casts_per_call_take_the_linears_own_forward(comfy, nodes):
    """Low-VRAM mode: ComfyUI casts or patches a Linear's weight per call (comfy_cast_weights, weight_function). Flux's
    single blocks read linear2's weight themselves (two GEMMs into one output) only where ComfyUI would not."""
    patcher = dit_model(comfy, "flux")
    x, ctx, extra = dit_inputs()
    (optimized,) = nodes.RocmSDOptimizeModel().optimize(patcher)
    halve = [lambda w: w * 0.5]
    linears = [m for m in patcher.model.modules() if isinstance(m, torch.nn.Linear)]
    for m in linears:
        m.comfy_cast_weights, m.weight_function = True, halve
    try:
        reference = run(patcher, x, ctx, extra, "flux")
        optimized.patch_model()
        try:
            got = run(optimized, x, ctx, extra, "flux")
        finally:
            optimized.unpatch_model()
    finally:
        for m in linears:
            del m.comfy_cast_weights, m.weight_function
    assert_same(got, reference)
    assert (reference - run(patcher, x, ctx, extra, "flux")).abs().max() > 1e-2


@pytest.mark.parametrize("options,why", [({"qk_norm": "ln"}, "Q / K norms are not RMSNorms"),
                                         ({"rmsnorm": True}, "not LayerNorms without affine parameters")])
def test_blocks_of_other_structures_stay_comfyuis_and_are_reported(comfy, options, why):
    patcher = standin_model(comfy, unet_model=_classes()["mmdit"], **options)
    notes = comfy_patch.patch_model_patcher(patcher, cuda_graph=False)
    assert list(patcher.object_patches) == ["diffusion_model.final_layer"]
    assert any(note.startswith("2 blocks left as they are (JointBlock: ") and why in note for note in notes), notes


def test_another_nodes_block_is_left_to_it(comfy):
    patcher = dit_model(comfy, "flux")

    class TheirBlock(torch.nn.Module):  # another node's object patch at a block's path
        def forward(self, x, **kw):
            return x

    patcher.add_object_patch("diffusion_model.single_blocks.1", TheirBlock())
    notes = comfy_patch.patch_model_patcher(patcher, cuda_graph=False)
    assert patcher.object_patches["diffusion_model.single_blocks.1"].__class__ is TheirBlock
    assert "diffusion_model.single_blocks.0" in patcher.object_patches
    assert "1 block left as they are (TheirBlock in single_blocks: not a block rocm_sd knows)" in notes


def test_calls_the_fused_forward_does_not_cover_run_comfyuis(comfy):
    """Flux's per-token modulation (modulation_dims, Chroma-style calls), a vec per token, calls with other nodes'
    transformer patches: the block's own forward."""
    patcher = dit_model(comfy, "flux")
    block = patcher.model.diffusion_model.double_blocks[0]
    copy = dit_block_copy(block)
    g = torch.Generator().manual_seed(4)
    img, txt, vec = (torch.randn(*shape, generator=g) for shape in ((1, 16, 32), (1, 5, 32), (1, 32)))
    dims = [(0, 8, 0)]
    with torch.inference_mode():
        want = block(img.clone(), txt.clone(), vec, None, modulation_dims_img=dims)
        got = copy(img.clone(), txt.clone(), vec, None, modulation_dims_img=dims)
        rocm_sd.reset_stats()
        copy(img.clone(), txt.clone(), vec[:, None], None)  # a (B, tokens, C) vec: ComfyUI's forward
        hook = {"patches": {"attn1_patch": [lambda q, k, v, extra: (q, k, v)]}}  # another node's, newer ComfyUI
        copy(img.clone(), txt.clone(), vec, None, transformer_options=hook)
        assert not rocm_sd.stats().get("ada_layer_norm")
        copy(img.clone(), txt.clone(), vec, None)
        assert rocm_sd.stats().get("ada_layer_norm")  # the same call without them: the fused forward
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    with pytest.raises(TypeError):
        dit_block_copy(torch.nn.Linear(2, 2))


def test_node_options_on_a_transformer(comfy, nodes, monkeypatch):
    patcher = dit_model(comfy, "sd35")
    (off,) = nodes.RocmSDOptimizeModel().optimize(patcher, layer_norm=False)
    assert off.object_patches == {} and "optimized_attention_override" in off.model_options["transformer_options"]
    notes = comfy_patch.patch_model_patcher(patcher.clone(), precision="fp8", cache="deepcache", cuda_graph=False)
    assert "precision=fp8 not applied: the model is on cpu; 8-bit GEMMs need a GPU" in notes
    assert "step cache not applied: cache='deepcache' is for UNets; the diffusion transformers take 'fbcache' or " \
           "'teacache'" in notes
    assert not any("comfy-kitchen" in n for n in notes)
    monkeypatch.setitem(sys.modules, "comfy_kitchen", types.ModuleType("comfy_kitchen"))
    notes = comfy_patch.patch_model_patcher(patcher.clone(), cuda_graph=False)
    assert [n for n in notes if n.startswith("comfy-kitchen is loaded: in the 3 blocks rocm_sd runs")]


# ---- on the GPU: the kernels, under ROCM_SD_STRICT=1 no fallback, and graph replay of the transformer's step ------

@pytest.mark.gpu
@pytest.mark.parametrize("name,batch", [("sd35m", 2), ("flux", 1), ("flux", 2)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_blocks_run_the_kernels_and_graph_replays_match(comfy, nodes, name, batch, dtype):
    from rocm_sd.patch.comfy_graph import graph_stats

    family = MODELS[name][0]
    wider = {"hidden_size": 64, "axes_dim": (8, 12, 12)} if family == "flux" else {}  # heads of 32, as MMDiT's 64
    patcher = dit_model(comfy, name, "cuda", dtype, **wider)
    x, ctx, extra = dit_inputs(batch, "cuda", dtype)
    reference = run(patcher, x, ctx, extra, family)
    (optimized,) = nodes.RocmSDOptimizeModel().optimize(patcher)
    optimized.patch_model()
    try:
        rocm_sd.reset_stats()
        got = run(optimized, x, ctx, extra, family)
        stats = rocm_sd.stats()
        wrapper = optimized.model_options["model_function_wrapper"]
        t = torch.linspace(0.3, 0.8, batch, device="cuda")
        conditioning = {"c_crossattn": ctx, "transformer_options": optimized.model_options["transformer_options"],
                        **(extra if family == "flux" else {"y": extra["y"]})}
        with torch.inference_mode():
            replays = [wrapper(optimized.model.apply_model, {"input": x, "timestep": t, "c": conditioning,
                                                             "cond_or_uncond": [0] * batch}) for _ in range(3)]
    finally:
        optimized.unpatch_model()
    for op in ("ada_layer_norm", "add_ada_layer_norm", "rms_norm"):
        assert set(stats[op]) == {"rocm_sd"}, stats
    tolerance = 2e-2 if dtype == torch.float16 else 5e-2
    assert_same(got.float(), reference.float(), tolerance)
    for replay in replays:
        torch.testing.assert_close(replay, got)
    assert graph_stats(optimized)["graph captures"] == 1 and graph_stats(optimized)["graph replays"] == 3
