"""optimize(cache='deepcache' / 'adaptive'): step caching of the UNet (rocm_sd/modules/step_cache.py), on tiny
random-weight UNets and pipelines built from configs, fp32 on the CPU; one GPU test with graph capture."""
import copy
import gc

import pytest
import torch

import rocm_sd
from rocm_sd import config, models
from rocm_sd.modules.step_cache import Schedule, UNetStepCache
from tests.test_optimize import run_pipe

# The patches that add in another order (fuse_resnet, fold_upsample) or pick other convolution algorithms
# (channels_last) are off where a test compares bit for bit with the untouched model.
EXACT = dict(channels_last=False, fuse_resnet=False, fold_upsample=False)


def tiny_unet(arch: str, layers: int):
    """The tiny SD-like (CrossAttn blocks outermost) or SDXL-like (plain blocks outermost, text_time) UNet, with
    `layers` layers per down block: 2 as in every SD1.x/2.x/SDXL UNet (the mirror layer is up_blocks[-1]'s
    second), 1 as in the tiny pipelines (the mirror layer is its first)."""
    from diffusers import UNet2DConditionModel

    torch.manual_seed(0)
    return UNet2DConditionModel(**{**models.ARCHITECTURES[arch].unet, "layers_per_block": layers}).eval()


def unet_inputs(unet, batch=2, seed=0, timestep=500.0):
    generator = torch.Generator().manual_seed(seed)
    kwargs = dict(sample=torch.randn(batch, unet.config.in_channels, 16, 16, generator=generator),
                  timestep=torch.tensor(timestep),
                  encoder_hidden_states=torch.randn(batch, 7, unet.config.cross_attention_dim, generator=generator))
    if unet.config.addition_embed_type == "text_time":
        kwargs["added_cond_kwargs"] = {
            "text_embeds": torch.randn(batch, 32, generator=generator),
            "time_ids": torch.tensor([[64.0, 64.0, 0.0, 0.0, 64.0, 64.0]] * batch)}
    return kwargs


class Calls(list):
    """One entry per call of `module` from now on (a forward hook; remove it with .handle.remove())."""

    def __init__(self, module):
        super().__init__()
        self.handle = module.register_forward_hook(lambda *args: self.append(1))


ARCHS = [("tiny", 2), ("tiny-xl", 2), ("tiny", 1), ("tiny-xl", 1)]
BRANCHES = [(arch, layers, branch) for arch, layers in ARCHS for branch in range(layers + 1)]


# ---- the partial call ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch,layers,branch", BRANCHES)
def test_partial_call_equals_full_call_when_its_feature_comes_from_the_same_inputs(arch, layers, branch):
    # The partial path recomputes conv_in, the embeddings, the branch's layers of down_blocks[0], up_blocks[-1] from
    # the mirror layer and the output layers; fed the hidden state the full call kept for the same sample and
    # timestep, it must compute the full call's output bit for bit, without running anything else.
    unet = tiny_unet(arch, layers)
    cache = UNetStepCache(unet, "deepcache", branch=branch)
    kwargs = unet_inputs(unet)
    first, last = unet.down_blocks[0], unet.up_blocks[-1]
    mirror = len(last.resnets) - 1 - branch
    with torch.no_grad():
        reference = unet(**kwargs).sample
        full, feature = cache.full_call(**kwargs)
        skipped = [unet.mid_block, unet.down_blocks[1], unet.up_blocks[0], *first.resnets[branch:],
                   *last.resnets[:mirror]]
        ran = [*first.resnets[:branch], *last.resnets[mirror:]]
        skipped_calls, ran_calls = [Calls(m) for m in skipped], [Calls(m) for m in ran]
        partial = cache.partial_call(feature, **kwargs)
        other = cache.partial_call(torch.randn_like(feature), **kwargs)
    assert [len(c) for c in skipped_calls] == [0] * len(skipped)
    assert [len(c) for c in ran_calls] == [2] * len(ran)
    for c in skipped_calls + ran_calls:
        c.handle.remove()
    assert torch.equal(full.sample, reference)
    # the hidden state entering up_blocks[-1]'s mirror layer: the previous layer's output, or up_blocks[-2]'s
    # upsampled output for the first
    before = last.resnets[mirror - 1] if mirror else unet.up_blocks[-2].resnets[-1]
    assert feature.shape == (2, before.out_channels, 16, 16)
    assert torch.equal(partial.sample, reference)
    assert not torch.allclose(other.sample, reference)  # the feature is used
    with torch.no_grad():  # return_dict=False as the pipelines call it
        assert torch.equal(cache.partial_call(feature, **kwargs, return_dict=False)[0], reference)


@pytest.mark.parametrize("arch,layers", [("tiny", 2), ("tiny-xl", 1)])
def test_partial_call_with_every_rocm_sd_patch_equals_the_patched_full_call(arch, layers):
    # The partial call runs the modules the other patches replaced (fused resnets and transformer blocks,
    # channels_last, rocm_sd's attention processor...): against the patched full call, still bit for bit.
    unet = tiny_unet(arch, layers)
    kwargs = unet_inputs(unet)
    with config.override(log_fallbacks=False), torch.no_grad():
        rocm_sd.optimize(unet, cache="deepcache")
        cache = unet.forward.inner  # inside text_kv's controller (modules/text_kv.py)
        assert isinstance(cache, UNetStepCache) and unet.__dict__["forward"].inner is cache
        full, feature = cache.full(**kwargs)   # graphed calls; on the CPU they run eagerly
        partial = cache.partial(feature, **kwargs)
    rocm_sd.revert(unet)
    assert torch.equal(partial.sample, full.sample)


@pytest.mark.parametrize("branch", [0, 1])
def test_controlnet_residuals_are_added_to_the_partial_calls_skips(branch):
    from diffusers import ControlNetModel

    unet = tiny_unet("tiny", 2)
    controlnet = ControlNetModel.from_unet(unet, conditioning_channels=3, conditioning_embedding_out_channels=(16, 32))
    kwargs = unet_inputs(unet)
    with torch.no_grad():
        down, mid = controlnet(**kwargs, controlnet_cond=torch.rand(2, 3, 32, 32), return_dict=False)
        down = tuple(d + 0.5 * torch.randn_like(d) for d in down)  # make the skips' residuals count
        cache = UNetStepCache(unet, "deepcache", branch=branch)
        controlled = dict(kwargs, down_block_additional_residuals=down, mid_block_additional_residual=mid)
        full, feature = cache.full_call(**controlled)
        partial = cache.partial_call(feature, **controlled)
        without = cache.partial_call(feature, **kwargs)
    assert torch.equal(partial.sample, full.sample)
    assert not torch.allclose(without.sample, full.sample)


@pytest.mark.parametrize("arch,layers,branch", [("tiny", 2, 0), ("tiny", 2, 1), ("tiny", 1, 0)])
def test_freeu_is_applied_in_the_partial_call_and_leaves_the_cache_as_it_was(arch, layers, branch):
    # FreeU scales the hidden state in place in the two coarsest up blocks: with two up blocks, up_blocks[-1] is one.
    unet = tiny_unet(arch, layers)
    unet.enable_freeu(s1=0.9, s2=0.2, b1=1.2, b2=1.4)
    cache = UNetStepCache(unet, "deepcache", branch=branch)
    kwargs = unet_inputs(unet)
    with torch.no_grad():
        full, feature = cache.full_call(**kwargs)
        kept = feature.clone()
        partial = cache.partial_call(feature, **kwargs)
        again = cache.partial_call(feature, **kwargs)
    assert torch.equal(feature, kept)
    assert torch.equal(partial.sample, full.sample) and torch.equal(again.sample, full.sample)


def test_lora_scale_applies_in_the_partial_call():
    # cross_attention_kwargs={'scale': s} scales PEFT's LoRA layers for the duration of diffusers' forward only:
    # the partial call runs inside that forward, so its layers see the scale too.
    pytest.importorskip("peft")
    from peft import LoraConfig

    unet = tiny_unet("tiny", 2)
    torch.manual_seed(1)
    unet.add_adapter(LoraConfig(r=4, target_modules=["conv1", "to_q", "to_v"], init_lora_weights=False))
    cache = UNetStepCache(unet, "deepcache")
    kwargs = unet_inputs(unet)
    with torch.no_grad():
        full, feature = cache.full_call(**kwargs, cross_attention_kwargs={"scale": 0.3})
        partial = cache.partial_call(feature, **kwargs, cross_attention_kwargs={"scale": 0.3})
        unscaled = cache.partial_call(feature, **kwargs)
    assert torch.equal(partial.sample, full.sample)
    assert not torch.allclose(unscaled.sample, full.sample)


# ---- which calls are full --------------------------------------------------------------------------------------

def plan(schedule, timesteps, key=(1,), samples=None):
    samples = samples or [None] * len(timesteps)
    return [schedule.plan(t, key, s)[1] for t, s in zip(timesteps, samples)]


def test_deepcache_schedule_with_batched_and_split_cfg():
    steps = [999.0, 850.0, 700.0, 550.0, 400.0, 250.0, 100.0]
    expected = [True, False, False, True, False, False, True]  # step i full when i % 3 == 0
    schedule = Schedule("deepcache", interval=3)
    assert plan(schedule, steps) == expected                     # CFG batched: one call per step
    assert plan(schedule, steps) == expected                     # the next generation starts again at step 0
    split = [t for t in steps for _ in range(2)]                 # CFG split: cond and uncond calls per step
    assert plan(schedule, split) == [full for full in expected for _ in range(2)]
    assert schedule.step == 6 and len(schedule.slots) == 2
    assert plan(schedule, [550.0, 400.0]) == [True, False]       # a higher timestep: a new generation
    assert plan(schedule, [250.0], key=(2,)) == [True]           # other input shapes: a new generation
    assert plan(Schedule("deepcache", interval=1), steps) == [True] * len(steps)


def test_adaptive_schedule_sums_the_relative_change_per_slot():
    def sequence(changes, seed):
        x = torch.rand(1, 4, 8, 8, generator=torch.Generator().manual_seed(seed)) + 0.5   # positive: |x (1+c) - x| = c|x|
        out = [x]
        for change in changes:
            out.append(out[-1] * (1 + change))
        return out

    # threshold 0.15: step 0 full; then 0.1 (sum 0.1) partial, +0.04 (0.14) partial, +0.03 (0.17) full and reset,
    # 0.2 full, 0.01 partial, 0.05 (0.06) partial
    changes = [0.1, 0.04, 0.03, 0.2, 0.01, 0.05]
    expected = [True, False, False, True, True, False, False]
    steps = [1000.0 - 100 * i for i in range(len(changes) + 1)]
    assert plan(Schedule("adaptive", threshold=0.15), steps, samples=sequence(changes, 0)) == expected
    # Split CFG: each slot sums its own input's change (slot 1 changes twice as fast)
    schedule = Schedule("adaptive", threshold=0.15)
    cond, uncond = sequence(changes, 0), sequence([2 * c for c in changes], 1)
    decisions = plan(schedule, [t for t in steps for _ in range(2)],
                     samples=[s for pair in zip(cond, uncond) for s in pair])
    assert decisions[0::2] == expected
    # slot 1: 0.2 full, 0.08 partial, +0.06 (0.14) partial, 0.4 full, 0.02 partial, +0.1 (0.12) partial
    assert decisions[1::2] == [True, True, False, False, True, False, False]
    assert plan(Schedule("adaptive", threshold=0.0), steps, samples=sequence(changes, 0)) == [True] * len(steps)


def test_the_controller_counts_full_and_partial_calls_and_why():
    unet = tiny_unet("tiny", 1)
    with config.override(log_fallbacks=False), torch.no_grad():
        rocm_sd.optimize(unet, cache="deepcache", cache_interval=3)
        kwargs = unet_inputs(unet, batch=1)
        for t in (900.0, 900.0, 800.0, 800.0, 700.0, 700.0, 600.0, 600.0):  # split CFG, 4 steps
            unet(**dict(kwargs, timestep=torch.tensor(t)))
        unet(**dict(kwargs, timestep=torch.tensor(900.0)))   # a new generation
        unet(**dict(kwargs, timestep=torch.tensor(800.0)))
        unet(**dict(kwargs, timestep=torch.tensor(800.0)))   # slot 1 of step 1: nothing cached there yet
        unet(**dict(kwargs, timestep=torch.tensor(700.0)), down_intrablock_additional_residuals=[])
        report = rocm_sd.report(unet)["UNet2DConditionModel"]
    rocm_sd.revert(unet)
    assert report["step cache: deepcache (interval 3, branch 0)"] == 1
    assert report["step cache: full calls"] == 2 + 2 + 1 + 1 + 1
    assert report["step cache: partial calls"] == 4 + 1
    assert report["step cache: full call instead of partial: no cached feature in this call's slot yet"] == 1
    assert report["step cache: full call instead of partial: T2I-Adapter residuals"] == 1


# ---- optimize / revert / pipelines -----------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["tiny", "tiny-xl"])
def test_interval_one_equals_the_uncached_model_and_revert_is_exact(arch):
    pipe = models.build_sd_pipeline(arch, "cpu", torch.float32)
    reference = run_pipe(pipe, steps=4)
    with config.override(log_fallbacks=False):
        rocm_sd.optimize(pipe, cache="deepcache", cache_interval=1, **EXACT)
        every_step_full = run_pipe(pipe, steps=4)
        report = rocm_sd.report(pipe)["unet"]
        rocm_sd.revert(pipe)
        rocm_sd.optimize(pipe, cache="adaptive", cache_threshold=0.0, **EXACT)
        adaptive_all_full = run_pipe(pipe, steps=4)
        rocm_sd.revert(pipe)
        rocm_sd.optimize(pipe, cache="deepcache", cache_interval=2, **EXACT)
        cached = run_pipe(pipe, steps=4)
        rocm_sd.revert(pipe)
    assert report["step cache: full calls"] == 4 and "step cache: partial calls" not in report
    assert torch.equal(every_step_full, reference) and torch.equal(adaptive_all_full, reference)
    assert not torch.equal(cached, reference)
    assert "forward" not in pipe.unet.__dict__
    assert torch.equal(run_pipe(pipe, steps=4), reference)


def test_pipeline_end_to_end_with_deepcache():
    pipe = models.build_sd_pipeline("tiny", "cpu", torch.float32)
    with config.override(log_fallbacks=False):
        rocm_sd.optimize(pipe, cache="deepcache")
        images = [run_pipe(pipe, steps=7, seed=seed, output_type="pt") for seed in (0, 1)]  # two generations
        report = rocm_sd.report(pipe)["unet"]
    rocm_sd.revert(pipe)
    assert all(torch.isfinite(image).all() for image in images)
    # interval 3 over 7 steps: steps 0, 3, 6 full, per generation (CFG batched: one call per step)
    assert report["step cache: full calls"] == 2 * 3 and report["step cache: partial calls"] == 2 * 4
    assert report["graphed: forward (full)"] == 1 and report["graphed: forward (partial)"] == 1
    assert report["forward (partial): eager: no GPU tensor among the inputs"] == 2 * 4


def test_adaptive_pipeline_skips_some_calls():
    pipe = models.build_sd_pipeline("tiny", "cpu", torch.float32)
    with config.override(log_fallbacks=False):
        rocm_sd.optimize(pipe, cache="adaptive", cache_threshold=0.5)
        image = run_pipe(pipe, steps=8, output_type="pt")
        report = rocm_sd.report(pipe)["unet"]
    rocm_sd.revert(pipe)
    assert torch.isfinite(image).all()
    assert report["step cache: full calls"] >= 1 and report["step cache: partial calls"] >= 1
    assert report["step cache: full calls"] + report["step cache: partial calls"] == 8


def test_a_copy_of_a_cached_model_is_cached_on_its_own():
    unet = tiny_unet("tiny", 1)
    kwargs = unet_inputs(unet)
    with torch.no_grad():
        reference = unet(**kwargs).sample
    with config.override(log_fallbacks=False), torch.no_grad():
        rocm_sd.optimize(unet, cache="deepcache", **EXACT)
        unet(**kwargs)
        twin = copy.deepcopy(unet)
        cache = twin.forward.inner  # inside text_kv's controller (modules/text_kv.py)
        assert cache.model is twin and cache.schedule.slots == []   # no cached features copied
        assert cache.full.fn.__self__ is cache
        from rocm_sd.patch.core import RECORD_ATTR

        owners = [getattr(fn, "__self__", None) for fn, _, _ in getattr(twin, RECORD_ATTR).undo]
        schedules = [o for o in owners if isinstance(o, Schedule)]  # undo entries reach no other schedule either
        assert cache in owners and not schedules
        assert torch.equal(twin(**kwargs).sample, reference)
        rocm_sd.revert(twin)
        assert isinstance(unet.forward.inner, UNetStepCache) and "forward" not in twin.__dict__
    rocm_sd.revert(unet)


def test_a_unet_the_partial_call_cannot_serve_is_left_uncached():
    from diffusers import UNet2DConditionModel

    unet = UNet2DConditionModel(sample_size=8, block_out_channels=(32,), layers_per_block=1, norm_num_groups=8,
                                down_block_types=("DownBlock2D",), up_block_types=("UpBlock2D",),
                                cross_attention_dim=32)
    with config.override(log_fallbacks=False):
        rocm_sd.optimize(unet, cache="deepcache")
    report = rocm_sd.report(unet)["UNet2DConditionModel"]
    rocm_sd.revert(unet)
    assert [key for key in report if key.startswith("step cache")] == [
        "step cache not applied: fewer than two down blocks, or not as many up blocks as down blocks"]


def test_a_branch_deeper_than_the_outermost_block_is_refused_with_the_reason():
    unet = tiny_unet("tiny", 2)
    with config.override(log_fallbacks=False):
        rocm_sd.optimize(unet, cache="deepcache", cache_branch=3)
    report = rocm_sd.report(unet)["UNet2DConditionModel"]
    rocm_sd.revert(unet)
    assert [key for key in report if key.startswith("step cache")] == [
        "step cache not applied: branch 3 is deeper than down_blocks[0]'s 2 layers"]
    with pytest.raises(ValueError, match="cache_branch=-1 is below its minimum 0"):
        rocm_sd.optimize(unet, cache="deepcache", cache_branch=-1)


# ---- graphs ----------------------------------------------------------------------------------------------------

@pytest.mark.gpu
def test_graphed_full_and_partial_calls_replay_and_equal_the_eager_step_cache():
    pipe = models.build_sd_pipeline("tiny", "cuda", torch.float16)
    rocm_sd.optimize(pipe, cache="deepcache", cache_interval=3, cuda_graph=False, text_encoder=False)
    eager = [run_pipe(pipe, steps=7, seed=s, output_type="pt") for s in (0, 1)]
    rocm_sd.revert(pipe)
    rocm_sd.optimize(pipe, cache="deepcache", cache_interval=3, text_encoder=False)
    with config.override(strict=True):
        graphed = [run_pipe(pipe, steps=7, seed=s, output_type="pt") for s in (0, 1)]
    report = rocm_sd.report(pipe)["unet"]
    syncs = pipe.unet.forward.inner.timesteps.syncs  # the step cache inside text_kv's controller
    rocm_sd.revert(pipe)
    assert report["step cache: full calls"] == 6 and report["step cache: partial calls"] == 8, report
    assert report["forward (full): graph captures"] == 1 and report["forward (full): graph replays"] == 6, report
    assert report["forward (partial): graph captures"] == 1 and report["forward (partial): graph replays"] == 8
    assert syncs == 0  # the pipeline's timesteps were read from one host copy of scheduler.timesteps
    for e, g in zip(eager, graphed):
        assert torch.isfinite(g).all()
        assert torch.equal(e, g)


@pytest.mark.gpu
def test_revert_frees_the_graphs_and_the_cached_features_at_once():
    # The controller and its graphed calls reference each other: their memory must not wait for the cycle collector.
    pipe = models.build_sd_pipeline("tiny", "cuda", torch.float16)
    for _ in range(2):  # what a process pays once (the BLAS workspaces of the warm-up and capture streams)
        rocm_sd.optimize(pipe, cache="deepcache", text_encoder=False)
        run_pipe(pipe, steps=4)
        rocm_sd.revert(pipe)
    gc.collect()
    before = torch.cuda.memory_allocated()
    gc.disable()
    try:
        rocm_sd.optimize(pipe, cache="deepcache", text_encoder=False)
        run_pipe(pipe, steps=4)
        held = torch.cuda.memory_allocated() - before
        rocm_sd.revert(pipe)
        left = torch.cuda.memory_allocated() - before
    finally:
        gc.enable()
    assert held > 0 and left == 0, f"{held} bytes held while cached, {left} still held after revert()"


def test_timesteps_that_view_one_tensor_are_read_from_one_host_copy():
    from rocm_sd.modules.step_cache import HostTimesteps

    timesteps = torch.tensor([999.0, 666.0, 333.0, 1.0])
    host = HostTimesteps()
    assert [host.view_value(t) for t in timesteps] == [999.0, 666.0, 333.0, 1.0]   # iterating gives views
    assert [host.view_value(t) for t in timesteps[1:]] == [666.0, 333.0, 1.0]      # a view of a view: the same base
    assert host.view_value(timesteps[2]) == 333.0
    timesteps.mul_(2)                                                               # written in place: copied again
    assert host.view_value(timesteps[2]) == 666.0
    assert host.view_value(torch.tensor([5.0, 4.0])[1]) == 4.0                      # another tensor
    assert host.view_value(torch.tensor(7.0)) is None and host.view_value(torch.ones(2, 2)[0, 0]) is None
    assert host.value(torch.tensor(7.0)) == 7.0 and host.value(3) == 3.0 and host.syncs == 0
    assert host.copies == 3


def test_a_new_timesteps_tensor_starts_a_new_generation():
    # An interrupted run, then one that starts below the timestep where it stopped (img2img): the timesteps are
    # views of another scheduler.timesteps tensor, so the features of the first run are not reused.
    unet = tiny_unet("tiny", 1)
    kwargs = unet_inputs(unet, batch=1)
    first, second = torch.tensor([900.0, 800.0, 700.0]), torch.tensor([500.0, 400.0])
    with config.override(log_fallbacks=False), torch.no_grad():
        rocm_sd.optimize(unet, cache="deepcache", cache_interval=3)
        for t in [*first[:2], *second]:
            unet(**dict(kwargs, timestep=t))
        report = rocm_sd.report(unet)["UNet2DConditionModel"]
    rocm_sd.revert(unet)
    assert report["step cache: full calls"] == 2 and report["step cache: partial calls"] == 2


# ---- ComfyUI (the stand-in of its UNetModel and ModelPatcher: tests/standins) ---------------------------------

COMFY_MODELS = {  # SD1.x-like: attention at the outermost level; SDXL-like: none there, a label embedding (adm)
    "sd": dict(attention_levels=(0, 1)), "sdxl": dict(attention_levels=(1,), adm_in_channels=12)}


def comfy_patcher(comfy, kind="sd", num_res_blocks=2, device="cpu", dtype=torch.float32):
    from comfy.ldm.modules.diffusionmodules.openaimodel import LeveledUNetModel
    from tests.comfyui_standin import standin_model

    patcher = standin_model(comfy, device, dtype, unet_model=LeveledUNetModel, num_res_blocks=num_res_blocks,
                            **COMFY_MODELS[kind])
    patcher.model.diffusion_model.dtype = dtype  # ComfyUI's UNetModel computes in the dtype it was built with
    return patcher


def comfy_inputs(patcher, batch=2, sigma=5.0, seed=0, control=False, patches=None, device="cpu", dtype=torch.float32):
    """(x, t, c) as ComfyUI's sampler hands them to apply_model; `control`: ControlNet residuals for every skip
    (fresh lists: the forward pops them)."""
    generator = torch.Generator().manual_seed(seed)
    model = patcher.model.diffusion_model
    x = torch.randn(batch, 4, 16, 16, generator=generator).to(device, dtype)
    c = {"c_crossattn": torch.randn(batch, 5, 24, generator=generator).to(device, dtype),
         "transformer_options": {**patcher.model_options["transformer_options"], **({"patches": patches} if patches
                                                                                     else {})}}
    if model.num_classes is not None:
        c["y"] = torch.randn(batch, 12, generator=generator).to(device, dtype)
    if control:
        skips = []
        with torch.no_grad():  # the skips' shapes, from one plain evaluation
            hooks = [block[-1].register_forward_hook(lambda m, i, out: skips.append(out.shape))
                     for block in model.input_blocks]
            patcher.model.apply_model(x, torch.full((batch,), sigma), **c)
            for hook in hooks:
                hook.remove()
        c["control"] = {"output": [torch.randn(s, generator=generator).to(device, dtype) for s in skips],
                        "middle": [torch.randn(skips[-1], generator=generator).to(device, dtype)], "input": []}
    return x, torch.full((batch,), sigma, device=device), c


def fresh(c):
    return {**c, "control": {k: list(v) for k, v in c["control"].items()}} if "control" in c else c


COMFY_BRANCHES = [(kind, blocks, branch) for kind, blocks in [("sd", 2), ("sdxl", 2), ("sd", 1)]
                  for branch in range(blocks + 1)]


@pytest.mark.parametrize("kind,num_res_blocks,branch", COMFY_BRANCHES)
@pytest.mark.parametrize("extra", ["none", "control", "patches"])
def test_comfy_partial_call_equals_full_call_when_its_feature_comes_from_the_same_inputs(comfy, kind,
                                                                                         num_res_blocks, branch,
                                                                                         extra):
    from rocm_sd.modules.step_cache import ComfyStepCache

    def freeu_like(h, hsp, transformer_options):  # ComfyUI's FreeU scales h in place
        h[:, : h.shape[1] // 2] *= 1.1
        return h, hsp * 0.9

    def input_patch(h, transformer_options):
        return h * 1.01

    seen = []

    def bookkeeping(h, hsp, transformer_options):  # what the forward told the patches where they ran
        seen.append((transformer_options["block"], transformer_options["transformer_index"]))
        return h, hsp

    patcher = comfy_patcher(comfy, kind, num_res_blocks)
    patches = {"output_block_patch": [freeu_like, bookkeeping], "input_block_patch": [input_patch]} \
        if extra == "patches" else None
    x, t, c = comfy_inputs(patcher, control=extra == "control", patches=patches)
    model, cache = patcher.model, ComfyStepCache("deepcache", branch=branch)
    ran = branch + 1  # output blocks a partial call runs
    diffusion_model = model.diffusion_model
    with torch.no_grad():
        reference = model.apply_model(x, t, **fresh(c))
        full, feature = cache.full_call(model, x, t, fresh(c))
        kept = feature.clone()
        del seen[:-ran]  # the outermost output blocks' in the full call
        inner = [Calls(layer) for layer in diffusion_model.middle_block] + \
            [Calls(layer) for block in diffusion_model.input_blocks[branch + 1:] for layer in block] + \
            [Calls(layer) for block in diffusion_model.output_blocks[:-ran] for layer in block]
        partial = cache.partial_call(model, x, t, fresh(c), feature)
        other = cache.partial_call(model, x, t, fresh(c), torch.randn_like(feature))
    assert sum(len(calls) for calls in inner) == 0
    assert "forward" not in diffusion_model.__dict__
    if extra == "patches":
        assert seen[ran:2 * ran] == seen[:ran] and seen[2 * ran:3 * ran] == seen[:ran], seen
    assert torch.equal(full, reference) and torch.equal(partial, reference) and torch.equal(feature, kept)
    assert not torch.allclose(other, reference)


def comfy_sample(patcher, steps, split, x, c, sigmas=None):
    """The model evaluations of one sampling run, through the patcher's model_function_wrapper as ComfyUI's
    sampler makes them: CFG batched ([1, 0] in one call) or split (one call each)."""
    wrapper = patcher.model_options["model_function_wrapper"]
    sigmas = sigmas or [14.0 * 0.6 ** i for i in range(steps)]
    outputs = []
    for sigma in sigmas:
        for cond_or_uncond in ([[1], [0]] if split else [[1, 0]]):
            batch = x.shape[0] // (2 if split else 1)
            options = {**c["transformer_options"], "cond_or_uncond": cond_or_uncond,
                       "sigmas": torch.tensor([sigma], device=x.device)}  # ComfyUI's sampler: the timestep itself
            sliced = {k: v[:batch] if isinstance(v, torch.Tensor) else v for k, v in c.items()}
            args = {"input": x[:batch], "timestep": torch.full((batch,), sigma, device=x.device), "cond_or_uncond": cond_or_uncond,
                    "c": {**sliced, "transformer_options": options}}
            with torch.inference_mode():
                outputs.append(wrapper(patcher.model.apply_model, args))
    return outputs


@pytest.mark.parametrize("cuda_graph", [False, True])
@pytest.mark.parametrize("split", [False, True])
def test_comfy_node_caches_steps(comfy, nodes, cuda_graph, split):
    from rocm_sd.patch.comfy_graph import graph_stats

    patcher = comfy_patcher(comfy, "sdxl")
    x, _, c = comfy_inputs(patcher)
    with config.override(log_fallbacks=False):
        (plain,) = nodes.RocmSDOptimizeModel().optimize(patcher, cuda_graph=False, channels_last=False)
        (every,) = nodes.RocmSDOptimizeModel().optimize(patcher, cuda_graph=cuda_graph, channels_last=False,
                                                        cache="deepcache", cache_interval=1)
        (cached,) = nodes.RocmSDOptimizeModel().optimize(patcher, cuda_graph=cuda_graph, channels_last=False,
                                                         cache="deepcache", cache_interval=3)
        plain.model_options["model_function_wrapper"] = lambda apply_model, args: apply_model(
            args["input"], args["timestep"], **args["c"])
        runs = {}
        for name, optimized in (("plain", plain), ("every", every), ("cached", cached)):
            optimized.patch_model()
            try:
                runs[name] = comfy_sample(optimized, 7, split, x, c) + comfy_sample(optimized, 7, split, x, c)
            finally:
                optimized.unpatch_model()
    assert all(torch.equal(a, b) for a, b in zip(runs["every"], runs["plain"]))
    assert all(torch.isfinite(out).all() for out in runs["cached"])
    assert any(not torch.equal(a, b) for a, b in zip(runs["cached"], runs["plain"]))
    stats, calls = graph_stats(cached), 2 if split else 1
    # two runs of 7 steps, interval 3: steps 0, 3, 6 full, per slot
    assert stats["step cache: full calls"] == 2 * 3 * calls and stats["step cache: partial calls"] == 2 * 4 * calls
    if cuda_graph:  # the two calls of the step cache, each a graphed call (on the CPU: run eagerly, and said why)
        assert stats["full: eager: no GPU tensor among the inputs"] == 2 * 3 * calls
        assert stats["partial: eager: no GPU tensor among the inputs"] == 2 * 4 * calls
    assert patcher.model_options == {"transformer_options": {}}
    assert "forward" not in patcher.model.diffusion_model.__dict__


@pytest.mark.parametrize("cuda_graph", [False, True])
def test_comfy_branch_deeper_than_the_outermost_level_is_refused_with_the_reason(comfy, cuda_graph):
    from rocm_sd.patch.comfy import patch_model_patcher

    patcher = comfy_patcher(comfy, "sd", num_res_blocks=2).clone()
    not_installed = patch_model_patcher(patcher, cuda_graph=cuda_graph, cache="deepcache", cache_branch=3)
    assert not_installed == ["step cache not applied: branch 3 is deeper than the outermost level (it would cross a "
                             "Downsample)"]
    assert ("model_function_wrapper" in patcher.model_options) == cuda_graph  # the graphs, without a step cache


@pytest.mark.parametrize("cuda_graph", [False, True])
def test_comfy_calls_that_cannot_be_partial_run_in_full(comfy, nodes, cuda_graph):
    from rocm_sd.patch.comfy_graph import graph_stats

    patcher = comfy_patcher(comfy)
    x, _, c = comfy_inputs(patcher, patches={"input_block_patch_after_skip": [lambda h, o: h]})
    (cached,) = nodes.RocmSDOptimizeModel().optimize(patcher, cuda_graph=cuda_graph, cache="deepcache",
                                                     cache_interval=3)
    with config.override(log_fallbacks=False):
        cached.patch_model()
        try:
            comfy_sample(cached, 3, False, x, c)
        finally:
            cached.unpatch_model()
    stats = graph_stats(cached)
    assert stats["step cache: full calls"] == 3 and "step cache: partial calls" not in stats
    assert stats["step cache: full call instead of partial: an input_block_patch_after_skip transformer patch"] == 2
    if cuda_graph:  # a transformer patch also keeps the calls off the graphs: the step cache decides all the same
        assert stats["eager: a 'input_block_patch_after_skip' transformer patch runs Python inside the model"] == 3


@pytest.mark.gpu
def test_comfy_graphed_full_and_partial_calls_replay_and_equal_the_eager_step_cache(comfy, nodes):
    from rocm_sd.patch.comfy_graph import graph_stats

    patcher = comfy_patcher(comfy, "sd", device="cuda", dtype=torch.float16)
    x, _, c = comfy_inputs(patcher, device="cuda", dtype=torch.float16)
    runs, stats = {}, {}
    for cuda_graph in (False, True):
        (cached,) = nodes.RocmSDOptimizeModel().optimize(patcher, cuda_graph=cuda_graph, cache="deepcache")
        cached.patch_model()
        try:
            runs[cuda_graph] = comfy_sample(cached, 7, True, x, c)
        finally:
            cached.unpatch_model()
        stats[cuda_graph] = graph_stats(cached)
    # Split CFG: cond and uncond are two signatures (cond_or_uncond is an argument value), so one graph each.
    assert stats[True]["full: graph captures"] == 2 and stats[True]["full: graph replays"] == 3 * 2, stats[True]
    assert stats[True]["partial: graph captures"] == 2 and stats[True]["partial: graph replays"] == 4 * 2, stats[True]
    assert not any("eager" in key for key in stats[True]), stats[True]
    for eager, graphed in zip(runs[False], runs[True]):
        assert torch.equal(eager, graphed)
