"""The ComfyUI node's step cache on ComfyUI's diffusion transformers (cache 'fbcache' / 'teacache':
rocm_sd/modules/comfy_dit_cache.py), against the stand-ins of ComfyUI's MMDiT and Flux (tests/standins). `sample`
makes a sampling run's evaluations as ComfyUI's sampler does (comfy/samplers.py: transformer_options with
cond_or_uncond, sigmas and the run's sample_sigmas; the model_function_wrapper called per evaluation)."""
from __future__ import annotations

import importlib.util
import logging
import os

import pytest
import torch

from rocm_sd import config
from rocm_sd.modules.comfy_sigmas import SamplingRuns
from rocm_sd.modules.step_cache import relative_change
from rocm_sd.patch import comfy as comfy_patch
from rocm_sd.patch.comfy_graph import graph_stats, installed_step_cache
from tests.comfyui_standin import ROOT, standin_model
from tests.test_comfyui_dit import MODELS, dit_model
from tests.test_dit_cache import cpu_graphs  # noqa: F401 - a fixture: GraphedCall captures and replays CPU calls
from tests.test_dit_cache import keep_residuals

HUGE = 1e9   # a threshold no change reaches: every call that can be cached is
EXACT = dict(layer_norm=False, attention=False, cuda_graph=False)   # ComfyUI's own modules: exact comparisons
SCHEDULE = [1.0, 0.8, 0.6, 0.4, 0.0]   # four evaluations


def conds(family, seed=0):
    """Per CFG entry (0: cond, 1: uncond) its text, pooled text and (Flux) guidance, batch 1."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(2):
        entry = {"c_crossattn": torch.randn(1, 5, 24, generator=g), "y": torch.randn(1, 8, generator=g)}
        if family == "flux":
            entry["guidance"] = torch.full((1,), 3.5)
        out.append(entry)
    return out


def evaluation(patcher, x, entries, sigma, schedule, conditioning, wrapper=True, **extra):
    """One model evaluation of the CFG entries `entries` batched, as _calc_cond_batch makes it (schedule None: none in
    transformer_options, as Forge's calc_cond_uncond_batch makes it); `extra`: more of the conditioning."""
    batch = torch.cat([x] * len(entries))
    c = {name: torch.cat([conditioning[e][name] for e in entries]) for name in conditioning[0]}
    t = torch.full((len(entries),), sigma)
    c["transformer_options"] = {**patcher.model_options["transformer_options"], "cond_or_uncond": list(entries),
                                "sigmas": t}
    if schedule is not None:
        c["transformer_options"]["sample_sigmas"] = schedule
    c.update(extra)
    function = patcher.model_options.get("model_function_wrapper") if wrapper else None
    with torch.inference_mode():
        if function is None:
            return patcher.model.apply_model(batch, t, **c)
        return function(patcher.model.apply_model, {"input": batch, "timestep": t, "c": c,
                                                   "cond_or_uncond": list(entries)})


def sample(patcher, family, calls=((0, 1),), sigmas=SCHEDULE, seed=0, schedule=None, wrapper=True):
    """The evaluations of one run (a step per sigma but the last): each of `calls` (CFG entries batched per call) at
    each step, an Euler step on the latent after each (the cond entry's output), so that the input moves."""
    schedule = torch.tensor(sigmas) if schedule is None else schedule
    x = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(seed + 10))
    conditioning, outputs = conds(family, seed), []
    for i, sigma in enumerate(sigmas[:-1]):
        step = [evaluation(patcher, x, entries, sigma, schedule, conditioning, wrapper) for entries in calls]
        outputs += step
        x = x + (sigmas[i + 1] - sigma) * step[0][:1]
    return outputs


def optimized(nodes, patcher, **options):
    with config.override(log_fallbacks=False):
        return nodes.RocmSDOptimizeModel().optimize(patcher, **options)[0]


def run(patcher, family, **kwargs):
    patcher.patch_model()
    try:
        return sample(patcher, family, **kwargs)
    finally:
        patcher.unpatch_model()


def counts(patcher) -> dict:
    return {k: v for k, v in graph_stats(patcher).items() if k.startswith("step cache")}


NAMES = ["sd35", "flux"]
CALLS = {"batched": ((0, 1),), "split": ((0,), (1,))}


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("mode", ["fbcache", "teacache"])
@pytest.mark.parametrize("cfg", ["batched", "split"])
def test_threshold_zero_is_the_uncached_model_exactly(comfy, nodes, name, mode, cfg):
    family = MODELS[name][0]
    patcher = dit_model(comfy, name)
    reference = sample(patcher, family, CALLS[cfg], wrapper=False)   # ComfyUI's own model, no node
    every = optimized(nodes, patcher, cache=mode, dit_cache_threshold=0.0, **EXACT)
    fused, fused_every = optimized(nodes, patcher, cuda_graph=False), \
        optimized(nodes, patcher, cuda_graph=False, cache=mode, dit_cache_threshold=0.0)
    got, fused_reference, fused_got = run(every, family, calls=CALLS[cfg]), run(fused, family, calls=CALLS[cfg]), \
        run(fused_every, family, calls=CALLS[cfg])
    assert all(torch.equal(a, b) for a, b in zip(got, reference, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(fused_got, fused_reference, strict=True))  # with the fused blocks
    assert counts(every) == {"step cache: full calls": len(reference)}


def boundary_and_final_input(diffusion_model, family, mode, kept):
    """Hooks on ComfyUI's own model (or Forge's Flux, whose blocks are called as ComfyUI's Flux's are): the image
    stream at the boundary (fbcache: the first block's output; teacache: its input) is remembered, and the final
    layer gets boundary + `kept` instead of the blocks' output: the kept-residual formula, without the step cache."""
    first = diffusion_model.joint_blocks[0] if family == "mmdit" else diffusion_model.double_blocks[0]
    seen = {}

    def before(module, args, kwargs):
        if mode == "teacache":
            seen["boundary"] = args[1] if family == "mmdit" else kwargs["img"]

    def after(module, args, kwargs, output):
        if mode == "fbcache":
            seen["boundary"] = output[1] if family == "mmdit" else output[0]

    def final(module, args):
        return (seen["boundary"] + kept,) + tuple(args[1:])
    return [first.register_forward_pre_hook(before, with_kwargs=True),
            first.register_forward_hook(after, with_kwargs=True),
            diffusion_model.final_layer.register_forward_pre_hook(final)]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("mode", ["fbcache", "teacache"])
def test_a_large_threshold_skips_and_the_skipped_call_is_the_kept_residual_formula(comfy, nodes, name, mode):
    family = MODELS[name][0]
    patcher = dit_model(comfy, name)
    cached = optimized(nodes, patcher, cache=mode, dit_cache_threshold=HUGE, **EXACT)
    cache = installed_step_cache(cached)
    kept = keep_residuals(cache)
    outputs = run(cached, family)
    reference = sample(patcher, family, wrapper=False)
    # step 0 full, then cached; teacache runs the run's last evaluation in full (sample_sigmas says which it is)
    last = mode == "teacache"
    assert counts(cached) == {"step cache: full calls": 1 + last, "step cache: cached calls": 3 - last}
    assert torch.equal(outputs[0], reference[0]) and not torch.equal(outputs[1], reference[1])
    assert all(torch.isfinite(out).all() for out in outputs)

    # the cached evaluation at step 1, recomputed: ComfyUI's model with boundary + the residual of step 0
    cache.rest = cache.rest_call
    kept_residual = kept[0]   # step 0's, which step 1 added
    x = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(10))
    x = x + (SCHEDULE[1] - SCHEDULE[0]) * outputs[0][:1]
    hooks = boundary_and_final_input(patcher.model.diffusion_model, family, mode, kept_residual)
    try:
        formula = evaluation(patcher, x, (0, 1), SCHEDULE[1], torch.tensor(SCHEDULE), conds(family), wrapper=False)
    finally:
        for hook in hooks:
            hook.remove()
    assert torch.equal(outputs[1], formula)


@pytest.mark.parametrize("name", NAMES)
def test_cfg_entries_are_kept_apart(comfy, nodes, name):
    """Split CFG: cond and uncond are two slots with their own residuals; a batched call decides for the largest
    entry's change; a slot whose entry changed (the sampler called them in another order) starts with a full call."""
    family = MODELS[name][0]
    patcher = dit_model(comfy, name)
    split = optimized(nodes, patcher, cache="fbcache", dit_cache_threshold=HUGE, **EXACT)
    batched = optimized(nodes, patcher, cache="fbcache", dit_cache_threshold=HUGE, **EXACT)
    split_out, batched_out = run(split, family, calls=CALLS["split"]), run(batched, family)
    assert counts(split) == {"step cache: full calls": 2, "step cache: cached calls": 6}
    assert counts(batched) == {"step cache: full calls": 1, "step cache: cached calls": 3}
    cache = installed_step_cache(split)
    slots = cache.steps.slots
    assert len(slots) == 2 and not torch.equal(slots[0].feature, slots[1].feature)
    for step in range(4):  # each entry's rows of the batched call are what its own call computes
        torch.testing.assert_close(batched_out[step], torch.cat(split_out[2 * step:2 * step + 2]), rtol=1e-4,
                                   atol=1e-4)

    seen, spied = [], installed_step_cache(batched)
    head = spied.head
    spied.head = lambda *args, **kwargs: seen.append(kwargs["groups"]) or head(*args, **kwargs)
    swapped = optimized(nodes, patcher, cache="fbcache", dit_cache_threshold=HUGE, **EXACT)
    run(swapped, family, calls=((0,), (1,)), sigmas=[1.0, 0.8, 0.0])
    before = counts(swapped)
    swapped.patch_model()
    try:  # the same run, the entries called the other way round at its second step
        x = torch.randn(1, 4, 8, 8)
        schedule = torch.tensor([1.0, 0.8, 0.6, 0.0])
        for sigma, order in ((1.0, ((0,), (1,))), (0.8, ((1,), (0,))), (0.6, ((1,), (0,)))):
            for entries in order:
                evaluation(swapped, x, entries, sigma, schedule, conds(family))
    finally:
        swapped.unpatch_model()
    after = {k: v - before.get(k, 0) for k, v in counts(swapped).items()}
    assert after == {"step cache: full calls": 4, "step cache: cached calls": 2}
    run(batched, family)
    assert seen and set(seen) == {2}   # the batched call's change: per entry, the largest

    sample_ = torch.ones(2, 3, 4)
    previous = sample_.clone()
    previous[1] *= 2   # the uncond entry changed by 50%, the cond one not at all
    assert relative_change(sample_, previous, 2).item() == pytest.approx(0.5)
    assert relative_change(sample_, previous).item() == pytest.approx(1 / 3)


@pytest.mark.parametrize("mode", ["fbcache", "teacache"])
def test_guidance_distilled_flux_at_cfg_1(comfy, nodes, mode):
    """Flux dev at CFG 1: one evaluation per step (cond only); the guidance goes into the time embedding, which the
    probe and the final layer read: the skipped call computes with this call's guidance, not the kept one's."""
    patcher = dit_model(comfy, "flux")
    every = optimized(nodes, patcher, cache=mode, dit_cache_threshold=0.0, **EXACT)
    assert all(torch.equal(a, b) for a, b in zip(run(every, "flux", calls=((0,),)),
                                                sample(patcher, "flux", calls=((0,),), wrapper=False), strict=True))
    cached = optimized(nodes, patcher, cache=mode, dit_cache_threshold=HUGE, **EXACT)
    stronger = conds("flux")
    stronger[0]["guidance"] = torch.full((1,), 7.0)
    cached.patch_model()
    try:  # two runs of two steps: the second step's guidance 3.5, then 7
        x, outputs = torch.randn(1, 4, 8, 8), []
        for second in (conds("flux"), stronger):
            schedule = torch.tensor([1.0, 0.8, 0.6, 0.0])   # (0.8 not the last: teacache runs the last in full)
            evaluation(cached, x, (0,), 1.0, schedule, conds("flux"))
            outputs.append(evaluation(cached, x, (0,), 0.8, schedule, second))
    finally:
        cached.unpatch_model()
    assert counts(cached) == {"step cache: full calls": 2, "step cache: cached calls": 2}
    assert not torch.equal(*outputs)


@pytest.mark.parametrize("name", NAMES)
def test_a_new_sampling_run_starts_fresh(comfy, nodes, name):
    """A run's first evaluation is full: a sigma that goes up, a new sample_sigmas tensor (an img2img run that starts
    below where an interrupted one stopped), or the schedule's first sigma again."""
    family = MODELS[name][0]
    patcher = dit_model(comfy, name)
    cached = optimized(nodes, patcher, cache="fbcache", dit_cache_threshold=HUGE, **EXACT)
    first = run(cached, family)
    second = run(cached, family)   # the sigma goes up: full, then the same decisions
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    assert counts(cached) == {"step cache: full calls": 2, "step cache: cached calls": 6}
    run(cached, family, sigmas=[1.0, 0.8, 0.0])           # interrupted after two steps
    run(cached, family, sigmas=[0.6, 0.4, 0.0])           # img2img, lower: a new schedule tensor
    schedule = torch.tensor([0.5, 0.3, 0.0])
    run(cached, family, sigmas=[0.5, 0.3, 0.0], schedule=schedule)
    run(cached, family, sigmas=[0.5, 0.3, 0.0], schedule=schedule)   # the same tensor again, from its first sigma
    assert counts(cached) == {"step cache: full calls": 2 + 4, "step cache: cached calls": 6 + 4}


def test_sampling_runs_positions():
    runs, schedule = SamplingRuns(), torch.tensor([1.0, 0.5, 0.25, 0.0])
    positions = [runs.locate(s, schedule) for s in (1.0, 1.0, 0.5, 0.375, 0.25)]  # split CFG at 1.0; a midpoint
    assert positions == [(0, 4), (0, 4), (1, 4), None, (2, 4)] and runs.runs == 1
    assert runs.locate(1.0, schedule) == (0, 4) and runs.runs == 2   # the first sigma again: another run
    assert runs.locate(0.5, torch.tensor([0.5, 0.0])) == (0, 2) and runs.runs == 3   # a new schedule
    assert runs.locate(0.5, None) is None and runs.runs == 3


def load_check(monkeypatch):
    """integrations/comfyui/check_in_comfyui.py as a module (it imports ComfyUI only when run); the
    ROCM_SD_TUNE_DEFAULTS=0 its import sets is undone after the test."""
    monkeypatch.setenv("ROCM_SD_TUNE_DEFAULTS", os.environ.get("ROCM_SD_TUNE_DEFAULTS", "0"))
    path = os.path.join(ROOT, "integrations", "comfyui", "check_in_comfyui.py")
    spec = importlib.util.spec_from_file_location("check_in_comfyui_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("mode", ["fbcache", "teacache"])
def test_the_real_comfyui_checks_random_weights_keep_the_samplers_schedule(comfy, nodes, monkeypatch, mode):
    """check_in_comfyui.py gives the SD3.5-style model it builds with ComfyUI's classes random weights. ComfyUI's
    BaseModel holds model_sampling beside the diffusion model, and KSampler's schedule comes from its `sigmas` buffer:
    the random weights must leave it as it is, and on that schedule (6 steps, CFG batched) a threshold no change
    reaches caches every evaluation after the first (teacache: but the run's last). Randomizing that buffer too made
    the real ComfyUI's schedule rise (-0.99 .. 0.21), each sigma a new run: the cache skipped nothing (issue 50)."""
    from comfy.model_sampling import ModelSamplingDiscreteFlow
    from comfy.samplers import calculate_sigmas

    check = load_check(monkeypatch)
    patcher = dit_model(comfy, "sd35m", model_sampling=ModelSamplingDiscreteFlow(shift=3.0))  # supported_models.SD3's
    own = calculate_sigmas(patcher.model.model_sampling, "normal", 6)
    weight = patcher.model.diffusion_model.final_layer.linear.weight.clone()
    check.random_weights(torch, patcher.model)
    sigmas = calculate_sigmas(patcher.model.model_sampling, "normal", 6)
    assert not torch.equal(patcher.model.diffusion_model.final_layer.linear.weight, weight)
    assert torch.equal(sigmas, own) and sigmas[0] == 1.0
    cached = optimized(nodes, patcher, cache=mode, dit_cache_threshold=HUGE, **EXACT)
    run(cached, "mmdit", sigmas=sigmas.tolist())
    last = mode == "teacache"
    assert counts(cached) == {"step cache: full calls": 1 + last, "step cache: cached calls": 5 - last}


@pytest.mark.parametrize("name", NAMES)
def test_revert_restores_comfyuis_own_model_exactly(comfy, nodes, name):
    family = MODELS[name][0]
    patcher = dit_model(comfy, name)
    diffusion_model = patcher.model.diffusion_model
    lists = {k: v for k, v in diffusion_model._modules.items() if k.endswith("blocks")}
    blocks = {k: list(v) for k, v in lists.items()}
    reference = sample(patcher, family, wrapper=False)
    cached = optimized(nodes, patcher, cache="teacache", dit_cache_threshold=HUGE, cuda_graph=False)
    run(cached, family)
    assert patcher.model_options == {"transformer_options": {}} and patcher.object_patches == {}
    assert all(diffusion_model._modules[k] is v and list(v) == blocks[k] for k, v in lists.items())
    assert "forward" not in vars(diffusion_model)
    assert all(torch.equal(a, b) for a, b in zip(sample(patcher, family, wrapper=False), reference, strict=True))
    cache = installed_step_cache(cached)
    assert cache.buffers and cached.clone().model_options["model_function_wrapper"] is cache
    cached.detach()   # ComfyUI unloads the model (ON_DETACH, unpatch_all): the residuals go
    assert not cache.buffers and cache.steps.slots == []


@pytest.mark.parametrize("name", NAMES)
def test_calls_the_cache_must_not_skip_run_as_they_are(comfy, nodes, name):
    family = MODELS[name][0]
    patcher = dit_model(comfy, name)
    cached = optimized(nodes, patcher, cache="fbcache", dit_cache_threshold=HUGE, **EXACT)
    x, schedule, conditioning = torch.randn(1, 4, 8, 8), torch.tensor(SCHEDULE), conds(family)
    cached.patch_model()
    try:
        evaluation(cached, x, (0, 1), 1.0, schedule, conditioning)   # full: the slot's residual
        reference = evaluation(cached, x, (0, 1), 0.8, schedule, conditioning, wrapper=False)
        extras = {"a 'post_input' transformer patch": {"patches": {"post_input": [lambda a: a]}},
                  "a 'dit' block replace patch": {"patches_replace": {"dit": {("double_block", 0): lambda a, o: a}}},
                  "a 'diffusion_model' wrapper": {"wrappers": {"diffusion_model": {"k": [lambda *a: None]}}}}
        for what, extra in extras.items():
            cached.model_options["transformer_options"].update(extra)
            got = evaluation(cached, x, (0, 1), 0.8, schedule, conditioning, wrapper=True)
            assert torch.equal(got, reference), what
            for key in extra:
                del cached.model_options["transformer_options"][key]
        wrapper = cached.model_options["model_function_wrapper"]
        c = {"c_crossattn": torch.cat([e["c_crossattn"] for e in conditioning]),
             "y": torch.cat([e["y"] for e in conditioning]),
             "transformer_options": {"cond_or_uncond": [0, 1], "sample_sigmas": schedule}}
        if family == "flux":
            c["guidance"] = torch.full((2,), 3.5)
        args = {"input": torch.cat([x, x]), "timestep": torch.full((2,), 0.8), "cond_or_uncond": [0, 1]}
        with torch.inference_mode():  # ControlNet residuals reach the model as the conditioning's `control`
            wrapper(cached.model.apply_model, {**args, "c": {**c, "control": {"output": [None]}}})
        with torch.enable_grad():  # autograd on: ComfyUI's own forward, no gradient history kept
            assert wrapper(cached.model.apply_model, {**args, "c": c}).grad_fn is not None
    finally:
        cached.unpatch_model()
    report = counts(cached)
    assert report["step cache: full calls"] == 1 and "step cache: cached calls" not in report
    for what in ("a 'post_input' transformer patch", "a 'dit' block replace patch", "a 'diffusion_model' wrapper",
                 "ControlNet residuals", "autograd is on"):
        assert report[f"step cache: uncached call: {what}"] == 1, report


def test_declined_combinations_are_named_and_logged(comfy, nodes, caplog):
    caplog.set_level(logging.INFO, logger="rocm_sd.comfyui")
    unet = standin_model(comfy)
    (model,) = nodes.RocmSDOptimizeModel().optimize(unet, cuda_graph=False, cache="fbcache")
    assert "model_function_wrapper" not in model.model_options
    said = [r.getMessage() for r in caplog.records]
    assert "rocm_sd: step cache not applied: cache='fbcache' is for the diffusion transformers (SD3 / SD3.5, Flux); " \
           "UNets take 'deepcache' or 'adaptive'" in said
    assert not any("active" in line for line in said)
    caplog.clear()
    dit = dit_model(comfy, "flux")
    for mode in ("deepcache", "adaptive"):
        (model,) = nodes.RocmSDOptimizeModel().optimize(dit, cuda_graph=False, cache=mode)
        assert "model_function_wrapper" not in model.model_options
        assert f"rocm_sd: step cache not applied: cache='{mode}' is for UNets; the diffusion transformers take " \
               "'fbcache' or 'teacache'" in [r.getMessage() for r in caplog.records]
    # teacache's probe is the first block's own modulation: a Flux 2-style block without one is declined, fbcache kept
    del dit.model.diffusion_model.double_blocks[0].img_mod
    notes = comfy_patch.patch_model_patcher(dit.clone(), cuda_graph=False, layer_norm=False, cache="teacache")
    assert "step cache not applied: its first double block has no img_mod of its own (Flux 2's global modulation) " \
           "for TeaCache's probe" in notes
    assert not any("step cache" in n for n in comfy_patch.patch_model_patcher(dit.clone(), cuda_graph=False,
                                                                               layer_norm=False, cache="fbcache"))


@pytest.mark.parametrize("name,mode,said", [("flux", "fbcache", "threshold 0.08, the published default"),
                                            ("sd35", "fbcache", "threshold 0.12, the published default"),
                                            ("flux", "teacache", "threshold 0.4, the published default"),
                                            ("sd35", "teacache", "threshold 0.3, the published default")])
def test_the_node_says_the_cache_is_active_with_its_threshold_and_that_images_change(comfy, nodes, caplog, name,
                                                                                    mode, said):
    caplog.set_level(logging.INFO, logger="rocm_sd.comfyui")
    patcher = dit_model(comfy, name)
    (model,) = nodes.RocmSDOptimizeModel().optimize(patcher, cuda_graph=False, cache=mode)
    lines = [r.getMessage() for r in caplog.records if f"step cache '{mode}' active" in r.getMessage()]
    assert len(lines) == 1 and said in lines[0] and "images differ" in lines[0]
    assert installed_step_cache(model).threshold == float(said.split()[1].rstrip(","))
    caplog.clear()
    nodes.RocmSDOptimizeModel().optimize(patcher, cuda_graph=False, cache=mode, dit_cache_threshold=0.2)
    assert any(f"step cache '{mode}' active (threshold 0.2)" in r.getMessage() for r in caplog.records)
    caplog.clear()
    nodes.RocmSDOptimizeModel().optimize(patcher, cuda_graph=False)
    assert not any("step cache" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("mode", ["fbcache", "teacache"])
def test_graphed_head_rest_skip_and_plain_calls_equal_the_eager_cache(comfy, nodes, cpu_graphs,  # noqa: F811
                                                                     name, mode):
    """With cuda_graph each of the cache's calls is its own graph (emulated on the CPU: captured, replayed on their
    static inputs, the slot's buffers read and written in place): the same outputs as the eager cache, a graph per
    call and slot."""
    family = MODELS[name][0]
    patcher = dit_model(comfy, name)
    eager = optimized(nodes, patcher, cache=mode, dit_cache_threshold=HUGE, cuda_graph=False)
    graphed = optimized(nodes, patcher, cache=mode, dit_cache_threshold=HUGE, cuda_graph=True)
    want = run(eager, family, calls=CALLS["split"]) + run(eager, family, calls=CALLS["split"])
    got = run(graphed, family, calls=CALLS["split"]) + run(graphed, family, calls=CALLS["split"])
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    stats = graph_stats(graphed)
    assert not any("eager" in key for key in stats), stats
    for call in ("head", "rest", "skip"):  # cond and uncond: their own buffers, so a graph each
        assert stats[f"{call}: graph captures"] == 2, stats
    assert stats["head: graph replays"] == 16 and stats["skip: graph replays"] == 12 - 4 * (mode == "teacache")


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["sd35m", "flux"])
@pytest.mark.parametrize("mode", ["fbcache", "teacache"])
def test_gpu_graphed_calls_replay_and_equal_the_eager_cache(comfy, nodes, name, mode):
    family = MODELS[name][0]
    wider = {"hidden_size": 64, "axes_dim": (8, 12, 12)} if family == "flux" else {}  # heads of 32 (test_comfyui_dit)
    patcher = dit_model(comfy, name, "cuda", torch.float16, **wider)
    runs, stats = {}, {}
    for cuda_graph in (False, True):
        cached = optimized(nodes, patcher, cache=mode, dit_cache_threshold=HUGE, cuda_graph=cuda_graph)
        cached.patch_model()
        try:
            runs[cuda_graph] = [_on_gpu_sample(cached, family) for _ in range(2)]
        finally:
            cached.unpatch_model()
        stats[cuda_graph] = graph_stats(cached)
    assert not any("eager" in key for key in stats[True]), stats[True]
    assert all(stats[True][f"{call}: graph captures"] == 1 for call in ("head", "rest", "skip")), stats[True]
    for eager, graphed in zip(sum(runs[False], []), sum(runs[True], []), strict=True):
        torch.testing.assert_close(graphed, eager, rtol=1e-3, atol=1e-3)


def _on_gpu_sample(patcher, family):
    """`sample`'s run with the latents and the conditioning on the GPU in fp16 (ComfyUI's sampler hands the
    conditioning over on the CPU; apply_model moves it)."""
    x = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(10)).to("cuda", torch.float16)
    schedule, outputs = torch.tensor(SCHEDULE, device="cuda"), []
    conditioning = [{name: v if name == "c_crossattn" else v.to("cuda", torch.float16 if name == "y" else None)
                     for name, v in entry.items()} for entry in conds(family)]   # apply_model casts the text only
    for i, sigma in enumerate(SCHEDULE[:-1]):
        t = torch.full((2,), sigma, device="cuda")
        c = {name: torch.cat([conditioning[e][name] for e in (0, 1)]) for name in conditioning[0]}
        c["transformer_options"] = {**patcher.model_options["transformer_options"], "cond_or_uncond": [0, 1],
                                    "sigmas": t, "sample_sigmas": schedule}
        with torch.inference_mode():
            out = patcher.model_options["model_function_wrapper"](
                patcher.model.apply_model, {"input": torch.cat([x, x]), "timestep": t, "c": c,
                                            "cond_or_uncond": [0, 1]})
        outputs.append(out)
        x = x + (SCHEDULE[i + 1] - sigma) * out[:1]
    return outputs
