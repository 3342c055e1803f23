"""The step cache (fbcache / teacache: rocm_sd/modules/comfy_dit_cache.py, the ComfyUI node's, with dit_cache.decide's
rule) on Forge's own Flux (backend/nn/flux.py), against the stand-in of Forge's backend (tests/standins/forge). `sample`
makes a sampling run's evaluations as Forge's sampler makes them (backend/sampling/sampling_function.py,
calc_cond_uncond_batch: transformer_options with cond_or_uncond and sigmas, no schedule; the patcher's
model_function_wrapper called per evaluation with apply_model, the CFG entries batched or one per call).
integrations/a1111/check_in_forge.py runs the cache on a real Forge checkout's backend."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rocm_sd.modules import dit_cache
from rocm_sd.modules.comfy_dit_cache import ComfyDiTStepCache, family_of
from rocm_sd.patch import comfy as comfy_patch
from rocm_sd.patch.comfy_graph import graph_stats, installed_step_cache
from tests.test_a1111 import script, webui  # noqa: F401 (fixtures)
from tests.test_comfyui_dit_cache import boundary_and_final_input
from tests.test_comfyui_dit_cache import evaluation as comfy_evaluation
from tests.test_dit_cache import cpu_graphs  # noqa: F401 (a fixture: GraphedCall captures and replays CPU calls)
from tests.test_dit_cache import keep_residuals
from tests.test_forge_flux import forge, forge_flux, optimized  # noqa: F401 (forge: a fixture)

HUGE = 1e9   # a threshold no change reaches: every call that can be cached is
EXACT = dict(layer_norm=False, attention=False)   # Forge's own blocks: bitwise comparisons with Forge's forward
SIGMAS = (1.0, 0.8, 0.6, 0.4, 0.0)   # four evaluations per CFG call
CALLS = {"batched": ((0, 1),), "split": ((0,), (1,)), "cfg 1": ((0,),)}   # cfg 1: guidance-distilled Flux dev


def conditioning(seed=0):
    """Per CFG entry (0: cond, 1: uncond) the conditioning Forge's Flux takes: T5 text, CLIP's pooled text, guidance."""
    g = torch.Generator().manual_seed(seed)
    return [{"c_crossattn": torch.randn(1, 5, 24, generator=g), "y": torch.randn(1, 8, generator=g),
             "guidance": torch.full((1,), 3.5)} for _ in range(2)]


def evaluation(patcher, x, entries, sigma, conds, wrapper=True, **extra):
    """One evaluation of the CFG entries `entries` batched, as calc_cond_uncond_batch makes it: no schedule."""
    return comfy_evaluation(patcher, x, entries, sigma, None, conds, wrapper, **extra)


def sample(forge, patcher, calls=CALLS["batched"], sigmas=SIGMAS, seed=0, wrapper=True):
    """One sampling run, the patcher loaded for it (object patches on) as Forge's sampling_prepare does: each of
    `calls` at each sigma but the last, an Euler step on the latent (the cond entry's output) after each step."""
    forge.unet.load_model(patcher)
    try:
        x = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(seed + 10))
        conds, outputs = conditioning(seed), []
        for i, sigma in enumerate(sigmas[:-1]):
            step = [evaluation(patcher, x, entries, sigma, conds, wrapper) for entries in calls]
            outputs += step
            x = x + (sigmas[i + 1] - sigma) * step[0][:1]
        return outputs
    finally:
        patcher.forge_unpatch_model()


def cached(patcher, mode, threshold, cuda_graph=False, **options):
    """A clone with rocm_sd installed as the extension's Forge path installs it, the step cache `mode` on."""
    clone = patcher.clone()
    notes = comfy_patch.patch_model_patcher(clone, override_supported=False, cuda_graph=cuda_graph, cache=mode,
                                            dit_cache_threshold=threshold, **options)
    assert notes == [] and isinstance(installed_step_cache(clone), ComfyDiTStepCache)
    return clone


def counts(patcher) -> dict:
    return {k: v for k, v in graph_stats(patcher).items() if k.startswith("step cache")}


def identical(got, want) -> bool:
    return all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def test_forges_flux_is_a_family_of_the_cache_with_fluxs_published_thresholds(forge):
    model = forge_flux(forge).model.diffusion_model
    assert family_of(model).lists == ("double_blocks", "single_blocks")
    for mode in dit_cache.MODES:
        cache = installed_step_cache(optimized(forge_flux(forge), cache=mode)[0])
        assert (cache.mode, cache.threshold, cache.published) == (
            mode, dit_cache.THRESHOLDS[(mode, "FluxTransformer2DModel")], True)


@pytest.mark.parametrize("mode", dit_cache.MODES)
@pytest.mark.parametrize("cfg", list(CALLS))
def test_threshold_zero_is_the_uncached_model_exactly(forge, mode, cfg):
    """Every evaluation in full, each bitwise what the model computes without the cache: Forge's own blocks against
    Forge's forward, and the fused blocks against the fused blocks without the cache."""
    patcher = forge_flux(forge)
    reference = sample(forge, patcher, CALLS[cfg], wrapper=False)
    every = cached(patcher, mode, 0.0, **EXACT)
    assert identical(sample(forge, every, CALLS[cfg]), reference)
    assert counts(every) == {"step cache: full calls": len(reference)}
    fused, _ = optimized(patcher)
    fused_every = cached(patcher, mode, 0.0)
    assert identical(sample(forge, fused_every, CALLS[cfg]), sample(forge, fused, CALLS[cfg]))


@pytest.mark.parametrize("mode", dit_cache.MODES)
def test_a_large_threshold_skips_and_the_skipped_call_is_the_kept_residual_formula(forge, mode):
    """Forge's sampler gives no schedule: teacache cannot know the run's last evaluation, and decides it like the
    others (as for diffusers' Flux)."""
    patcher = forge_flux(forge)
    skipping = cached(patcher, mode, HUGE, **EXACT)
    kept = keep_residuals(installed_step_cache(skipping))
    outputs, reference = sample(forge, skipping), sample(forge, patcher, wrapper=False)
    assert counts(skipping) == {"step cache: full calls": 1, "step cache: cached calls": 3}
    assert torch.equal(outputs[0], reference[0]) and not torch.equal(outputs[1], reference[1])
    assert all(torch.isfinite(out).all() for out in outputs)

    x = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(10))
    x = x + (SIGMAS[1] - SIGMAS[0]) * outputs[0][:1]   # the latent the cached step 1 saw
    hooks = boundary_and_final_input(patcher.model.diffusion_model, "flux", mode, kept[0])
    try:
        formula = evaluation(patcher, x, (0, 1), SIGMAS[1], conditioning(), wrapper=False)
    finally:
        for hook in hooks:
            hook.remove()
    assert torch.equal(outputs[1], formula)


def test_teacaches_probe_is_the_first_blocks_modulated_input_as_forge_computes_it(forge):
    """The probe is what Forge's DoubleStreamBlock feeds its img_attn.qkv: (1 + scale) * img_norm1(img) + shift."""
    patcher = forge_flux(forge)
    first = patcher.model.diffusion_model.double_blocks[0]
    seen = []
    hook = first.img_attn.qkv.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    g = torch.Generator().manual_seed(2)
    img, txt, vec = torch.randn(2, 16, 32, generator=g), torch.randn(2, 5, 32, generator=g), torch.randn(2, 32)
    pe = forge.flux.EmbedND(16, 10000, (4, 6, 6))(torch.zeros(2, 21, 3))
    try:
        with torch.inference_mode():
            first(img=img, txt=txt, vec=vec, pe=pe)
            probe = family_of(patcher.model.diffusion_model).probe(first, img, {"vec": vec, "pe": pe})
    finally:
        hook.remove()
    torch.testing.assert_close(probe, seen[0], rtol=1e-6, atol=1e-6)


def test_cfg_entries_are_kept_apart(forge):
    """Split CFG: cond and uncond are slots with residuals of their own; batched: one decision, each entry's rows."""
    patcher = forge_flux(forge)
    split = cached(patcher, "fbcache", HUGE, **EXACT)
    batched = cached(patcher, "fbcache", HUGE, **EXACT)
    split_out, batched_out = sample(forge, split, CALLS["split"]), sample(forge, batched)
    assert counts(split) == {"step cache: full calls": 2, "step cache: cached calls": 6}
    assert counts(batched) == {"step cache: full calls": 1, "step cache: cached calls": 3}
    slots = installed_step_cache(split).steps.slots
    assert len(slots) == 2 and not torch.equal(slots[0].feature, slots[1].feature)
    for step in range(4):
        torch.testing.assert_close(batched_out[step], torch.cat(split_out[2 * step:2 * step + 2]), rtol=1e-4,
                                   atol=1e-4)


def test_a_new_generation_starts_fresh(forge):
    """Within one cache: a new run (the sigma goes up: a new seed, a new prompt, the next image of a batch count) and
    a batch of another size start with a full evaluation, whatever the threshold."""
    patcher = forge_flux(forge)
    skipping = cached(patcher, "fbcache", HUGE, **EXACT)
    first = sample(forge, skipping)
    assert identical(sample(forge, skipping), first)   # the same run again: the same decisions, the same outputs
    again = sample(forge, skipping, seed=1)             # another seed and prompt: its first step is Forge's own
    assert torch.equal(again[0], sample(forge, patcher, seed=1, wrapper=False)[0])
    assert counts(skipping) == {"step cache: full calls": 3, "step cache: cached calls": 9}
    split = sample(forge, skipping, CALLS["split"], sigmas=(0.5, 0.3, 0.0))   # lower (img2img), split: new slots
    assert torch.equal(split[0], sample(forge, patcher, CALLS["split"], sigmas=(0.5, 0.3, 0.0), wrapper=False)[0])
    assert counts(skipping) == {"step cache: full calls": 5, "step cache: cached calls": 11}


def test_calls_the_cache_does_not_cover_are_computed_in_full(forge):
    """ControlNet residuals (Forge's sampler puts them in the conditioning's `control`), autograd on, and a batch
    that changes within a run: those evaluations run the model as it is, the cache never adds a residual to them."""
    patcher = forge_flux(forge)
    skipping = cached(patcher, "fbcache", HUGE, **EXACT)
    x, conds = torch.randn(1, 4, 8, 8), conditioning()
    forge.unet.load_model(skipping)
    try:
        evaluation(skipping, x, (0, 1), 1.0, conds)   # full: the slot's residual
        for extra in ({"control": {"output": [None]}, "control_model": object()},):
            got = evaluation(skipping, x, (0, 1), 0.8, conds, **extra)
            assert torch.equal(got, evaluation(skipping, x, (0, 1), 0.8, conds, wrapper=False, **extra))
        got = evaluation(skipping, x, (0,), 0.8, conds)   # the batch changed (cond only now): a new slot, full
        assert torch.equal(got, evaluation(skipping, x, (0,), 0.8, conds, wrapper=False))
        wrapper = skipping.model_options["model_function_wrapper"]
        c = {name: torch.cat([conds[e][name] for e in (0, 1)]) for name in conds[0]}
        c["transformer_options"] = {"cond_or_uncond": [0, 1]}
        with torch.enable_grad():
            out = wrapper(skipping.model.apply_model, {"input": torch.cat([x, x]), "timestep": torch.full((2,), 0.6),
                                                       "c": c, "cond_or_uncond": [0, 1]})
        assert out.grad_fn is not None
    finally:
        skipping.forge_unpatch_model()
    assert counts(skipping) == {"step cache: full calls": 2, "step cache: uncached call: ControlNet residuals": 1,
                                "step cache: uncached call: autograd is on": 1}


def test_revert_restores_forges_own_model_exactly(forge):
    patcher = forge_flux(forge)
    model = patcher.model.diffusion_model
    lists = {name: model._modules[name] for name in ("double_blocks", "single_blocks")}
    blocks = {name: list(blocks) for name, blocks in lists.items()}
    modules = dict(patcher.model.named_modules())
    reference = sample(forge, patcher, CALLS["split"], wrapper=False)
    for mode in dit_cache.MODES:
        sample(forge, cached(patcher, mode, HUGE), CALLS["split"])   # fused blocks, cached calls
    assert patcher.model_options == {"transformer_options": {}} and patcher.object_patches == {}
    assert all(model._modules[name] is blocks_ and list(blocks_) == blocks[name] for name, blocks_ in lists.items())
    assert dict(patcher.model.named_modules()) == modules and "forward" not in vars(model)
    assert identical(sample(forge, patcher, CALLS["split"], wrapper=False), reference)


@pytest.mark.parametrize("mode", dit_cache.MODES)
def test_graphed_calls_equal_the_eager_cache(forge, cpu_graphs, mode):  # noqa: F811
    """With the graph checkbox each of the cache's calls is its own graph (emulated on the CPU: captured, replayed on
    their static inputs, the slot's buffers read and written in place): the eager cache's outputs."""
    patcher = forge_flux(forge)
    eager = cached(patcher, mode, HUGE)
    graphed = cached(patcher, mode, HUGE, cuda_graph=True)
    assert identical(sample(forge, graphed, CALLS["split"]), sample(forge, eager, CALLS["split"]))
    stats = graph_stats(graphed)
    assert not any("eager" in key for key in stats), stats
    assert stats["head: graph captures"] == 2 and stats["skip: graph replays"] == 6, stats


def test_the_extensions_settings_reach_forges_flux(webui, script, forge, capsys):  # noqa: F811
    """The Settings section's step cache options, by the ComfyUI node's names and defaults: off by default; a mode
    with -1 takes the published threshold, 0 every evaluation in full; each sampling gets a cache of its own; a value
    the settings should not hold is said and read as off / the default."""
    shared = webui["shared"]
    webui["callbacks"].ui_settings_callback()
    assert (shared.opts.rocm_sd_cache, shared.opts.rocm_sd_dit_cache_threshold) == ("off", -1.0)
    assert shared.opts.data_labels["rocm_sd_cache"].default == "off"
    unet = forge_flux(forge)
    reference = sample(forge, unet, wrapper=False)
    p = SimpleNamespace(sd_model=SimpleNamespace(forge_objects=SimpleNamespace(unet=unet)))

    def sampling(mode, threshold):
        shared.opts.rocm_sd_cache, shared.opts.rocm_sd_dit_cache_threshold = mode, threshold
        p.sd_model.forge_objects.unet = unet   # as Forge's processing: forge_objects afresh before each sampling
        script.RocmSdScript().process_before_every_sampling(p)
        return p.sd_model.forge_objects.unet

    shared.cmd_opts.rocm_sd = True
    try:
        assert installed_step_cache(sampling("off", -1.0)) is None
        published, again = sampling("fbcache", -1.0), sampling("fbcache", -1.0)
        cache = installed_step_cache(published)
        assert (cache.mode, cache.threshold, cache.published) == ("fbcache", 0.08, True)
        assert installed_step_cache(again) is not cache and unet.model_options == {"transformer_options": {}}
        said = capsys.readouterr().out
        assert "rocm_sd: on Forge, step cache 'fbcache' active (threshold 0.08, the published default" in said
        every = sampling("teacache", 0)
        assert (installed_step_cache(every).mode, installed_step_cache(every).threshold) == ("teacache", 0.0)
        got = sample(forge, every)
        assert all((a - b).abs().max() <= 1e-4 * b.abs().max() for a, b in zip(got, reference, strict=True))
        assert counts(every) == {"step cache: full calls": 4}
        assert installed_step_cache(sampling("deepercache", 0.1)) is None
        assert installed_step_cache(sampling("teacache", "a lot")).threshold == 0.4
        said = capsys.readouterr().out
        assert "step cache setting 'deepercache' is not one of off, fbcache, teacache: the step cache is off" in said
        assert "step cache threshold 'a lot' is not a number: the published default applies" in said
    finally:
        shared.cmd_opts.rocm_sd = False
