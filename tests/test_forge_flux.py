"""The A1111 extension's Forge path on Forge's own Flux (backend/nn/flux.py), against the stand-in of Forge's backend
(tests/standins/forge: its Flux classes built under Forge's operations, its ModelPatcher / UnetPatcher, LoRA loader
and KModel, as at dfdcbab6). The blocks' copies are modules/comfy_dit.py's (the ComfyUI node's Flux forwards, Forge's
port adapted); on the CPU the ops run their PyTorch references, so besides agreeing with Forge's forward the tests
check that the copies are in place and the ops were called (rocm_sd.stats). integrations/a1111/check_in_forge.py
runs the same checks on a real Forge checkout's backend."""
from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import pytest
import torch

import rocm_sd
from rocm_sd.modules.comfy_dit import dit_block_copy
from rocm_sd.patch import comfy as comfy_patch
from tests.test_a1111 import script, webui  # noqa: F401 (fixtures)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STANDIN = os.path.join(ROOT, "tests", "standins", "forge")
BLOCKS = ["double_blocks.0", "double_blocks.1", "single_blocks.0", "single_blocks.1", "final_layer"]
CONFIG = dict(in_channels=4, vec_in_dim=8, context_in_dim=24, hidden_size=32, mlp_ratio=4.0, num_heads=2, depth=2,
              depth_single_blocks=2, axes_dim=(4, 6, 6), theta=10000, qkv_bias=True, guidance_embed=True)


@pytest.fixture()
def forge():
    sys.path.insert(0, STANDIN)
    import backend.nn.flux
    import backend.patcher.unet

    yield SimpleNamespace(flux=backend.nn.flux, unet=backend.patcher.unet)
    sys.path.remove(STANDIN)
    for name in [m for m in sys.modules if m == "backend" or m.startswith("backend.")]:
        del sys.modules[name]


def forge_flux(forge, dtype=torch.float32, **config):
    """A small random Flux as Forge's loader makes it (inside using_forge_operations), behind its UnetPatcher."""
    from backend.operations import using_forge_operations

    torch.manual_seed(0)
    with using_forge_operations(device=torch.device("cpu"), dtype=dtype):
        model = forge.flux.IntegratedFluxTransformer2DModel(**{**CONFIG, **config})
    for p in model.parameters():  # Forge loads the weights from files: random here, never zeros
        p.data.normal_(0, 0.2)
    model.storage_dtype = model.computation_dtype = dtype
    model.load_device = model.offload_device = model.initial_device = torch.device("cpu")
    return forge.unet.UnetPatcher.from_model(model)


def inputs(batch=1):
    g = torch.Generator().manual_seed(1)
    x, ctx = torch.randn(batch, 4, 8, 8, generator=g), torch.randn(batch, 5, 24, generator=g)
    return x, torch.linspace(0.3, 0.8, batch), ctx, {"y": torch.randn(batch, 8, generator=g),
                                                     "guidance": torch.full((batch,), 3.5)}


def run(forge, patcher, batch=1):
    """One evaluation as Forge's sampler runs it: the patcher loaded (object patches on, LoRA merged), then
    KModel.apply_model."""
    x, t, ctx, extra = inputs(batch)
    forge.unet.load_model(patcher)
    try:
        with torch.inference_mode():
            return patcher.model.apply_model(x, t, c_crossattn=ctx,
                                             transformer_options=patcher.model_options["transformer_options"], **extra)
    finally:
        patcher.forge_unpatch_model()


def optimized(patcher, **options):
    clone = patcher.clone()
    notes = comfy_patch.patch_model_patcher(clone, override_supported=False, cuda_graph=False, **options)
    return clone, notes


def assert_same(got, reference, rtol=1e-4):
    """Within fp32 rounding of Forge's result, relative to its largest value (random weights: large logits)."""
    assert (got - reference).abs().max().item() <= rtol * reference.abs().max().item()


def _rocm_blocks(model) -> list[str]:
    return [name for name, m in model.named_modules() if type(m).__name__.startswith("Rocm")]


def _counting(monkeypatch, module, name):
    calls = []
    original = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **k: calls.append(a) or original(*a, **k))
    return calls


@pytest.mark.parametrize("batch", [1, 2])
def test_forges_flux_blocks_run_rocm_sd_ops_as_forges_forward_and_revert_exactly(forge, batch, monkeypatch):
    """Batch 1: rope applied by rocm_sd::rms_norm, Forge's attention_function called on the rotated q / k. Batch 2
    (one rope table per sample, which the op does not take): Forge's apply_rope, then attention_function."""
    patcher = forge_flux(forge)
    reference = run(forge, patcher, batch)
    originals = dict(patcher.model.named_modules())
    patched, notes = optimized(patcher)
    assert notes == [] and sorted(patched.object_patches) == sorted(f"diffusion_model.{b}" for b in BLOCKS)
    attention_calls = _counting(monkeypatch, forge.flux, "attention_function")
    rope_calls = _counting(monkeypatch, forge.flux, "apply_rope")
    model = forge.unet.load_model(patched)
    try:
        assert _rocm_blocks(model) == [f"diffusion_model.{b}" for b in BLOCKS]
    finally:
        patched.forge_unpatch_model()
    rocm_sd.reset_stats()
    got = run(forge, patched, batch)
    stats = rocm_sd.stats()
    assert_same(got, reference)
    assert stats["ada_layer_norm"] and stats["add_ada_layer_norm"] and stats["rms_norm"]
    assert len(attention_calls) == 4 and len(rope_calls) == (0 if batch == 1 else 4)
    assert dict(patcher.model.named_modules()) == originals and not _rocm_blocks(patcher.model)
    monkeypatch.undo()
    assert torch.equal(run(forge, patcher, batch), reference)


@pytest.mark.parametrize("online", [False, True])
def test_lora_added_after_patching_reaches_the_fused_blocks(forge, online):
    """Forge's LoRA loader sets merged Parameters through the patched paths when it loads the model (or hangs them on
    the layers as online LoRA, which its Linears merge per call): the copies read the LoRA'd weights, the Q / K norm
    scale too, and the single blocks' linear2 runs Forge's own forward when it merges online."""
    patcher = forge_flux(forge)
    plain = run(forge, patcher)
    keys = [f"diffusion_model.{p}" for p in ("double_blocks.0.img_attn.norm.query_norm.scale",
                                             "double_blocks.1.txt_mlp.0.weight", "single_blocks.0.linear2.weight")]
    keys = keys[1:] if online else keys  # Forge merges online LoRA in its Linears only
    state = patcher.model.state_dict()
    torch.manual_seed(3)
    lora = {k: (torch.randn_like(state[k]) * 0.1,) for k in keys}
    with_lora = patcher.clone()
    with_lora.add_patches(filename="lora", patches=lora, online_mode=online)
    reference = run(forge, with_lora)
    patched, _ = optimized(patcher)
    assert_same(run(forge, patched), plain)
    patched.add_patches(filename="lora", patches=lora, online_mode=online)  # after rocm_sd patched the clone
    got = run(forge, patched)
    assert (reference - plain).abs().max() > 1e-2  # the LoRA changes the model
    assert_same(got, reference)


def test_weights_forge_computes_per_call_take_the_linears_own_forward(forge):
    """Forge's Linears cast (parameters_manual_cast: another storage dtype, its low-VRAM offloading) or scale
    (scale_weight: fp8 scaled checkpoints) their weights per call: the single blocks' split linear2 reads a weight
    itself only where Forge would not."""
    patcher = forge_flux(forge)
    linear2 = [patcher.model.diffusion_model.single_blocks[i].linear2 for i in (0, 1)]
    linear2[0].scale_weight = torch.nn.Parameter(torch.tensor(0.5))
    linear2[1].parameters_manual_cast = True
    linear2[1].weight = torch.nn.Parameter(linear2[1].weight.to(torch.bfloat16), requires_grad=False)
    reference = run(forge, patcher)
    patched, _ = optimized(patcher)
    assert_same(run(forge, patched), reference)
    linear2[0].scale_weight = None
    assert (run(forge, patcher) - reference).abs().max() > 1e-2


def test_blocks_of_other_structures_stay_forges_and_are_reported(forge, monkeypatch):
    patcher = forge_flux(forge)
    flux = patcher.model.diffusion_model
    flux.double_blocks[1].img_norm1 = torch.nn.LayerNorm(32, eps=1e-6)  # affine: another configuration

    class TheirBlock(torch.nn.Module):  # another extension's object patch at a block's path
        def forward(self, x, vec, pe):
            return x

    patcher.add_object_patch("diffusion_model.single_blocks.1", TheirBlock())
    patched, notes = optimized(patcher)
    assert sorted(patched.object_patches) == sorted(f"diffusion_model.{b}" for b in (
        "double_blocks.0", "single_blocks.0", "single_blocks.1", "final_layer"))
    assert type(patched.object_patches["diffusion_model.single_blocks.1"]) is TheirBlock
    assert notes == ["1 block left as they are (DoubleStreamBlock: its norms are not LayerNorms without affine "
                     "parameters)", "1 block left as they are (TheirBlock in single_blocks: not a block rocm_sd knows)"]

    double = type(flux.double_blocks[0])
    forward = double.forward

    def newer_forward(self, img, txt, vec, pe, transformer_options=None):  # a Forge whose blocks take more
        return forward(self, img, txt, vec, pe)

    monkeypatch.setattr(double, "forward", newer_forward)
    _, notes = optimized(patcher)
    assert "1 block left as they are (DoubleStreamBlock: its forward takes other arguments than the Forge version " \
           "rocm_sd follows)" in notes  # the other one: its norms, checked first


def test_another_extensions_attention_gets_rope_and_attention(forge, monkeypatch):
    """Where another extension replaced backend.nn.flux.attention, the copies leave rope and attention to it (q / k
    normed, not rotated), and still fuse the rest."""
    patcher = forge_flux(forge)
    reference = run(forge, patcher)
    seen = []
    original = forge.flux.attention

    def their_attention(q, k, v, pe):
        seen.append(pe)
        return original(q, k, v, pe)

    monkeypatch.setattr(forge.flux, "attention", their_attention)
    patched, _ = optimized(patcher)
    rocm_sd.reset_stats()
    got = run(forge, patched)
    assert_same(got, reference)
    assert len(seen) == 4 and all(pe is not None for pe in seen) and rocm_sd.stats()["rms_norm"]


def test_attention_option_sends_forges_flux_attention_to_rocm_sd(forge, monkeypatch):
    """With the extension's attention option the copies call rocm_sd's attention where host_call_uses_op says so
    (forced here: on the CPU rocm_sd would run SDPA as Forge does, so Forge's own function runs), else Forge's."""
    patcher = forge_flux(forge)
    reference = run(forge, patcher)
    patched, _ = optimized(patcher, attention=False)
    copy = patched.object_patches["diffusion_model.double_blocks.0"]
    assert copy.rocm_sd_attention is None
    patched, _ = optimized(patcher)
    assert patched.object_patches["diffusion_model.double_blocks.0"].rocm_sd_attention is not None
    attention_calls = _counting(monkeypatch, forge.flux, "attention_function")
    monkeypatch.setattr(comfy_patch, "host_call_uses_op", lambda q, head_dim, mask: True)
    rocm_sd.reset_stats()
    got = run(forge, patched)
    assert_same(got, reference)
    assert sum(rocm_sd.stats()["attention"].values()) == 4 and attention_calls == []


def test_calls_the_fused_forward_does_not_cover_run_forges(forge):
    """A vec per token, or arguments Forge's blocks do not take: the block's own forward (here: its error)."""
    patcher = forge_flux(forge)
    block = patcher.model.diffusion_model.double_blocks[0]
    copy = dit_block_copy(block)
    g = torch.Generator().manual_seed(4)
    img, txt, vec = (torch.randn(*shape, generator=g) for shape in ((1, 16, 32), (1, 5, 32), (1, 32)))
    pe = forge.flux.EmbedND(16, 10000, (4, 6, 6))(torch.zeros(1, 21, 3))
    with torch.inference_mode():
        want = block(img=img, txt=txt, vec=vec, pe=pe)
        rocm_sd.reset_stats()
        got = copy(img=img, txt=txt, vec=vec, pe=pe)
        assert rocm_sd.stats().get("ada_layer_norm")
        rocm_sd.reset_stats()
        for call in (lambda m: m(img, txt, vec, pe, None),  # Forge's forward takes no mask
                     lambda m: m(img, txt, vec[:, None], pe)):  # nor a vec per token
            with pytest.raises(Exception) as theirs:
                call(block)
            with pytest.raises(type(theirs.value)):
                call(copy)
        assert not rocm_sd.stats().get("ada_layer_norm")
    assert all((a - b).abs().max() <= 1e-4 * b.abs().max() for a, b in zip(got, want))


def test_the_extensions_forge_path_patches_forges_flux(webui, script, forge):  # noqa: F811
    """process_before_every_sampling (--rocm-sd): a clone of Forge's UnetPatcher with the Flux blocks' copies as
    object patches, the graph wrapper installed (cuda_graph on by default), and the sampled result Forge's."""
    unet = forge_flux(forge)
    reference = run(forge, unet)
    p = SimpleNamespace(sd_model=SimpleNamespace(forge_objects=SimpleNamespace(unet=unet)))
    webui["shared"].cmd_opts.rocm_sd = True
    try:
        script.RocmSdScript().process_before_every_sampling(p)
    finally:
        webui["shared"].cmd_opts.rocm_sd = False
    patched = p.sd_model.forge_objects.unet
    assert patched is not unet and unet.object_patches == {}
    assert sorted(patched.object_patches) == sorted(f"diffusion_model.{b}" for b in BLOCKS)
    assert "model_function_wrapper" in patched.model_options
    rocm_sd.reset_stats()
    got = run(forge, patched)
    assert_same(got, reference)
    assert rocm_sd.stats()["rms_norm"]
