"""optimize(cache='fbcache' / 'teacache'): step caching of the diffusion transformers (rocm_sd/modules/dit_cache.py),
on tiny-sd3 / tiny-flux (dit_models.py) in fp32 on the CPU; on a GPU, strictly, with graph capture."""
import copy

import pytest
import torch
from torch.utils import _pytree as pytree

import rocm_sd
from rocm_sd import config, dit_models, graphs, models
from rocm_sd.modules.dit_cache import TEACACHE_POLYNOMIAL, DiTStepCache, teacache_rescale
from rocm_sd.modules.step_cache import MAX_SLOTS, HostTimesteps, Slot

ARCHS = ["tiny-sd3", "tiny-flux"]
# The patches that round differently from diffusers' own forward are off where a test compares with the untouched model.
EXACT = dict(channels_last=False, fuse_transformer=False, linear_gelu=False, attention=False, layer_norm=False,
             text_encoder=False)
HUGE = 1e9  # a threshold no change reaches: every call that can be cached is


def generate(pipe, steps=3, seed=0):
    with torch.no_grad():
        return pipe(**models.prompt_kwargs(pipe, "a lighthouse at dawn"), num_inference_steps=steps, height=64,
                    width=64, generator=torch.Generator(pipe._execution_device).manual_seed(seed),
                    output_type="latent").images


@pytest.fixture(scope="module", params=ARCHS)
def tiny(request):
    return request.param, models.build_sd_pipeline(request.param, "cpu", torch.float32)


def tiny_transformer(arch: str):
    """The tiny architecture's transformer alone (no text encoders, no VAE)."""
    from diffusers import FluxTransformer2DModel, SD3Transformer2DModel

    torch.manual_seed(0)
    cls = SD3Transformer2DModel if arch == "tiny-sd3" else FluxTransformer2DModel
    return cls(**dit_models.ARCHITECTURES[arch].transformer).eval()


def cache_counts(pipe) -> dict:
    return {k: v for k, v in rocm_sd.report(pipe)["transformer"].items() if k.startswith("step cache")}


# ---- optimize / revert / pipelines -----------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["fbcache", "teacache"])
def test_threshold_zero_is_the_uncached_model_a_large_one_caches_and_revert_restores(tiny, mode):
    arch, pipe = tiny
    untouched = generate(pipe)
    with config.override(log_fallbacks=False):
        rocm_sd.optimize(pipe, cache=mode, cache_threshold=0.0, **EXACT)
        every_call_full = generate(pipe)
        full_report = cache_counts(pipe)
        rocm_sd.revert(pipe)
        rocm_sd.optimize(pipe, cache=mode, cache_threshold=HUGE, **EXACT)
        cached = [generate(pipe), generate(pipe)]  # two pipeline calls: the second starts with a full step again
        cached_report = cache_counts(pipe)
        rocm_sd.revert(pipe)
    # SD3's CFG is one call of batch 2 per step; Flux dev's guidance is an embedding: one call per step either way
    assert full_report == {f"step cache: {mode} (threshold 0)": 1, "step cache: full calls": 3}
    assert torch.equal(every_call_full, untouched)
    # TeaCache runs the last step in full where it is known: SD3's pipeline hands over views of scheduler.timesteps,
    # Flux's divides them by 1000 first (a new tensor)
    last = mode == "teacache" and arch == "tiny-sd3"
    assert cached_report == {f"step cache: {mode} (threshold 1e+09)": 1, "step cache: full calls": 2 + 2 * last,
                             "step cache: cached calls": 4 - 2 * last}
    assert torch.equal(cached[0], cached[1]) and torch.isfinite(cached[0]).all()
    assert not torch.equal(cached[0], untouched)
    assert "forward" not in vars(pipe.transformer)
    assert torch.equal(generate(pipe), untouched)


def test_with_every_patch_threshold_zero_equals_the_optimized_uncached_pipeline(tiny):
    arch, pipe = tiny
    with config.override(log_fallbacks=False):
        rocm_sd.optimize(pipe)
        optimized = generate(pipe)
        rocm_sd.revert(pipe)
        rocm_sd.optimize(pipe, cache="fbcache", cache_threshold=0.0)
        cached = generate(pipe)
        rocm_sd.revert(pipe)
    assert torch.equal(cached, optimized)


def test_default_thresholds_are_the_published_ones_per_model(tiny):
    arch, pipe = tiny
    expected = {"tiny-sd3": {"fbcache": 0.12, "teacache": 0.3}, "tiny-flux": {"fbcache": 0.08, "teacache": 0.4}}[arch]
    for mode, threshold in expected.items():
        with config.override(log_fallbacks=False):
            rocm_sd.optimize(pipe, cache=mode, cuda_graph=False)
        report = cache_counts(pipe)
        assert pipe.transformer.forward.threshold == threshold
        rocm_sd.revert(pipe)
        assert report == {f"step cache: {mode} (threshold {threshold:g})": 1}


# ---- the deciding ----------------------------------------------------------------------------------------------

def positive(seed: int, shape=(2, 8, 4)) -> torch.Tensor:
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed)) + 0.5  # |x (1+c) - x| = c|x|


def test_fbcache_compares_with_the_probe_of_the_slots_last_full_call():
    cache = DiTStepCache(tiny_transformer("tiny-flux"), "fbcache", 0.1)
    slot, probe = Slot(), torch.empty(1)
    assert not cache._cached(slot, float("nan"), probe)   # nothing cached yet: full, its probe kept (the change unread)
    assert slot.previous is probe
    slot.feature = torch.zeros(1)
    # the change against the probe of the last full call: 0.05 and 0.09 cached; 0.12 full (a new probe); then cached
    assert [cache._cached(slot, torch.tensor(c), probe) for c in (0.05, 0.09, 0.12, 0.05)] == [True, True, False, True]


def test_teacache_sums_the_rescaled_change_of_the_modulated_input_and_runs_the_last_step_in_full():
    assert teacache_rescale(0.0) == TEACACHE_POLYNOMIAL[-1]
    assert teacache_rescale(0.1) == pytest.approx(sum(c * 0.1 ** (4 - i) for i, c in enumerate(TEACACHE_POLYNOMIAL)))
    cache = DiTStepCache(tiny_transformer("tiny-flux"), "teacache", 0.4)
    slot, probe = Slot(feature=torch.zeros(1)), torch.empty(1)
    changes = [0.05, 0.05, 0.05, 0.3, 0.05]
    decisions = [cache._cached(slot, float("nan"), probe)]  # the slot's first probe: nothing to compare with
    decisions += [cache._cached(slot, torch.tensor(c), probe) for c in changes]
    total, expected = 0.0, [False]
    for c in changes:  # rescaled: about 0.18 for a 5% change, 0.52 for 30%
        total += teacache_rescale(c)
        expected.append(total < 0.4)
        total = total if total < 0.4 else 0.0
    assert decisions == expected == [False, True, True, False, False, True]
    # TeaCache's last step is full whatever the sum (ali-vilab/TeaCache: cnt == num_steps - 1), and starts it again
    assert not cache._cached(slot, torch.tensor(0.0), probe, last=True) and slot.change == 0.0


def make_inputs(transformer, batch=1, tokens=16, size=8, seed=0):
    generator = torch.Generator().manual_seed(seed)
    config_ = transformer.config
    if type(transformer).__name__ == "SD3Transformer2DModel":
        return dict(hidden_states=torch.randn(batch, config_.in_channels, size, size, generator=generator),
                    encoder_hidden_states=torch.randn(batch, tokens, config_.joint_attention_dim, generator=generator),
                    pooled_projections=torch.randn(batch, config_.pooled_projection_dim, generator=generator))
    return dict(hidden_states=torch.randn(batch, size * size, config_.in_channels, generator=generator),
                encoder_hidden_states=torch.randn(batch, tokens, config_.joint_attention_dim, generator=generator),
                pooled_projections=torch.randn(batch, config_.pooled_projection_dim, generator=generator),
                img_ids=torch.zeros(size * size, 3), txt_ids=torch.zeros(tokens, 3),
                guidance=torch.full((batch,), 3.5))


@pytest.mark.parametrize("arch", ARCHS)
def test_split_cfg_calls_have_their_own_slots_and_other_shapes_start_a_new_generation(arch):
    transformer = tiny_transformer(arch)
    cond, uncond = make_inputs(transformer, seed=0), make_inputs(transformer, seed=1)
    with config.override(log_fallbacks=False), torch.no_grad():
        rocm_sd.optimize(transformer, cache="fbcache", cache_threshold=HUGE, **EXACT)
        for t in (1.0, 0.9, 0.8):  # true CFG as separate calls (Flux's): two slots per step
            outputs = [transformer(**inputs, timestep=torch.full((1,), t), return_dict=False)[0]
                       for inputs in (cond, uncond)]
        slots = transformer.forward.steps.slots
        assert len(slots) == 2 and not torch.equal(slots[0].feature, slots[1].feature)
        assert not torch.equal(*outputs)
        # a batch of 2 at the next timestep: another shape, a new generation (a full call), its residual of batch 2
        batched = make_inputs(transformer, batch=2)
        transformer(**batched, timestep=torch.full((2,), 0.7))
        assert len(transformer.forward.steps.slots) == 1 and transformer.forward.steps.slots[0].feature.shape[0] == 2
        transformer(**batched, timestep=torch.full((2,), 0.6))
        # another resolution at a lower timestep: a new generation too
        small = make_inputs(transformer, size=4)
        transformer(**small, timestep=torch.full((1,), 0.5))
        rocm_sd.invalidate_graphs(transformer)  # drops the residuals: the next call, which would be cached, is full
        transformer(**small, timestep=torch.full((1,), 0.4))
        report = rocm_sd.report(transformer)[type(transformer).__name__]
    rocm_sd.revert(transformer)
    assert report["step cache: full calls"] == 2 + 1 + 1 + 1 and report["step cache: cached calls"] == 4 + 1


def test_one_step_runs_called_again_do_not_add_a_slot_per_run():
    """Flux's pipeline hands over the same timestep in every run of one step (no scheduler.timesteps view to tell the
    runs apart): each run added a slot, and a residual, for good."""
    transformer = tiny_transformer("tiny-flux")
    inputs = dict(make_inputs(transformer), timestep=torch.full((1,), 1.0), return_dict=False)
    with config.override(log_fallbacks=False), torch.no_grad():
        rocm_sd.optimize(transformer, cache="fbcache", cache_threshold=HUGE, **EXACT)
        for _ in range(2 * MAX_SLOTS + 1):
            transformer(**inputs)
        cache = transformer.forward
        slots, buffers = len(cache.steps.slots), len(getattr(cache, "buffers", ()))
        report = rocm_sd.report(transformer)["FluxTransformer2DModel"]
    rocm_sd.revert(transformer)
    assert slots <= MAX_SLOTS and buffers <= MAX_SLOTS
    assert report["step cache: full calls"] == 2 * MAX_SLOTS + 1


def test_calls_with_skip_layers_or_controlnet_residuals_run_uncached_and_leave_the_cache_alone():
    transformer = tiny_transformer("tiny-sd3")
    inputs = dict(make_inputs(transformer), timestep=torch.full((1,), 1.0), return_dict=False)
    with torch.no_grad():
        reference = transformer(**inputs, skip_layers=[1])[0]
        with config.override(log_fallbacks=False):
            rocm_sd.optimize(transformer, cache="fbcache", cache_threshold=HUGE, **EXACT)
        transformer(**inputs)
        out = transformer(**inputs, skip_layers=[1])[0]
        residuals = [torch.zeros(1, 16, 32)]
        transformer(**inputs, block_controlnet_hidden_states=residuals)
        report = rocm_sd.report(transformer)["SD3Transformer2DModel"]
    rocm_sd.revert(transformer)
    assert torch.equal(out, reference)
    assert report["step cache: full calls"] == 1 and "step cache: cached calls" not in report
    assert report["step cache: uncached call: skip_layers (skip-layer guidance)"] == 1
    assert report["step cache: uncached call: ControlNet residuals"] == 1


def test_calls_under_autograd_run_uncached_and_keep_no_gradient_history():
    """A cached residual taken under autograd held the whole network's gradient history until the next full call, and
    the buffers written in place cannot take part in autograd: such calls are the model's own."""
    transformer = tiny_transformer("tiny-flux")
    inputs = dict(make_inputs(transformer), return_dict=False)
    with config.override(log_fallbacks=False):
        rocm_sd.optimize(transformer, cache="fbcache", cache_threshold=HUGE, **EXACT)
    outputs = [transformer(**inputs, timestep=torch.full((1,), t))[0] for t in (1.0, 0.9)]
    cache = transformer.forward
    report = rocm_sd.report(transformer)["FluxTransformer2DModel"]
    rocm_sd.revert(transformer)
    reference = [transformer(**inputs, timestep=torch.full((1,), t))[0] for t in (1.0, 0.9)]
    assert all(torch.equal(o, r) and o.grad_fn is not None for o, r in zip(outputs, reference))
    assert report["step cache: uncached call: autograd is on"] == 2 and "step cache: full calls" not in report
    assert cache.steps.slots == []


def test_the_expanded_timestep_of_sd3s_pipeline_is_read_from_the_host_copy():
    timesteps = torch.tensor([1000.0, 750.0, 500.0])
    host = HostTimesteps()
    assert [host.view_value(t.expand(2)) for t in timesteps] == [1000.0, 750.0, 500.0]
    assert host.copies == 1 and host.view_value(torch.tensor([3.0, 4.0])) is None


def test_a_copy_of_a_cached_transformer_is_cached_on_its_own():
    transformer = tiny_transformer("tiny-flux")
    inputs = dict(make_inputs(transformer), timestep=torch.full((1,), 1.0), return_dict=False)
    with torch.no_grad():
        reference = transformer(**inputs)[0]
        with config.override(log_fallbacks=False):
            rocm_sd.optimize(transformer, cache="fbcache", cache_threshold=HUGE, **EXACT)
        transformer(**inputs)
        twin = copy.deepcopy(transformer)
        cache = twin.forward
        assert cache.model is twin and cache.steps.slots == [] and cache.head.fn.__self__ is cache
        assert torch.equal(twin(**inputs)[0], reference)  # its first call is full: nothing cached came along
        rocm_sd.revert(twin)
        assert "forward" not in vars(twin) and isinstance(transformer.forward, DiTStepCache)
    rocm_sd.revert(transformer)


# ---- bad values ------------------------------------------------------------------------------------------------

def test_bad_values_and_modes_of_the_other_kind_of_model_are_refused_with_the_reason():
    from rocm_sd.patch.pipeline import skipped_options

    pipe = models.build_sd_pipeline("tiny-flux", "cpu", torch.float32)
    with pytest.raises(ValueError, match=r"cache_threshold=-0.1 is below its minimum 0.0"):
        rocm_sd.optimize(pipe, cache="fbcache", cache_threshold=-0.1)
    with pytest.raises(ValueError, match=r"cache='firstblock' is not one of None, 'deepcache', 'adaptive', "
                                         r"'fbcache', 'teacache'"):
        rocm_sd.optimize(pipe, cache="firstblock")
    with pytest.raises(ValueError, match="threshold -1 is not a number >= 0"):
        DiTStepCache(pipe.transformer, "fbcache", -1)
    with config.override(log_fallbacks=False):
        rocm_sd.optimize(pipe, cache="deepcache", text_encoder=False)
    why = skipped_options(pipe, {"cache": "deepcache"})
    rocm_sd.revert(pipe)
    assert why == ["transformer: step cache not applied: cache='deepcache' is for UNets; the diffusion transformers "
                   "take 'fbcache' or 'teacache'"]
    unet = models.build_sd_pipeline("tiny", "cpu", torch.float32).unet
    with config.override(log_fallbacks=False):
        rocm_sd.optimize(unet, cache="teacache")
    report = rocm_sd.report(unet)["UNet2DConditionModel"]
    rocm_sd.revert(unet)
    assert [k for k in report if k.startswith("step cache")] == [
        "step cache not applied: cache='teacache' is for the diffusion transformers (SD3 / SD3.5, Flux); UNets take "
        "'deepcache' or 'adaptive'"]


# ---- graphs ----------------------------------------------------------------------------------------------------

class _Replayed:
    """A captured call on the CPU: replay runs it again on the graph's inputs and writes the graph's outputs, as a GPU
    graph reads and writes fixed addresses."""

    def __init__(self, fn, args, kwargs, outputs):
        self.fn, self.args, self.kwargs, self.outputs = fn, args, kwargs, outputs

    def replay(self):
        for static, value in zip(self.outputs, pytree.tree_leaves(self.fn(*self.args, **self.kwargs))):
            if isinstance(static, torch.Tensor):
                static.copy_(value)


@pytest.fixture
def cpu_graphs(monkeypatch):
    """GraphedCall captures and replays CPU calls (_Replayed): its warm-up calls, the graph's own inputs (copies,
    or the buffers passed in place) and outputs, as on a GPU."""
    def capture(call, args, kwargs, leaves, spec):
        for _ in range(graphs.WARMUP_CALLS):  # on the caller's tensors, as the GPU's warm-up calls
            warm_args, warm_kwargs = pytree.tree_unflatten(leaves, spec)
            call.fn(*warm_args, **warm_kwargs)
        static_inputs, static_args, static_kwargs = call._static_arguments(kwargs, leaves, spec)
        outputs, output_spec = pytree.tree_flatten(call.fn(*static_args, **static_kwargs))
        return graphs._Graph(_Replayed(call.fn, static_args, static_kwargs, outputs), static_inputs, outputs,
                             output_spec, not call.static_outputs)

    monkeypatch.setattr(graphs, "DEVICE_TYPE", "cpu")
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(graphs.GraphedCall, "_capture", capture)


def keep_residuals(cache) -> list:
    """The residual each full call of a ComfyUI / Forge step cache keeps, cloned as it leaves the cache's `rest` call,
    into the list returned (`cache.rest = cache.rest_call` ends it)."""
    kept, rest = [], cache.rest

    def keeping(*args, **kwargs):
        out = rest(*args, **kwargs)
        kept.append(kwargs["residual"].clone())
        return out
    cache.rest = keeping
    return kept


def held_residuals(transformer) -> int:
    """The tensors of the residual's shape that the step cache and its graphed calls hold between calls (one per
    storage)."""
    cache = transformer.forward
    shape = cache.steps.slots[0].feature.shape
    held = [t for buffers in getattr(cache, "buffers", {}).values() for t in buffers]
    held += [t for slot in cache.steps.slots for t in (slot.feature, slot.previous)]
    for call in (cache.head, cache.rest, cache.skip):
        for graph in call.graphs.values():
            held += graph.static_inputs + graph.static_output_leaves
    return len({t.untyped_storage().data_ptr() for t in held if isinstance(t, torch.Tensor) and t.shape == shape})


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("mode", ["fbcache", "teacache"])
def test_graphed_calls_keep_no_copy_of_a_slots_residual_or_probe(cpu_graphs, arch, mode):
    """Per slot between calls: its residual and its probe, which the graphs read and write in place, and for fbcache
    the stream after the first block (head's graph output, read in place by rest and skip). No graph holds a copy."""
    transformer = tiny_transformer(arch)
    # true CFG: two slots; 5 text tokens, so that no text tensor has the residual's shape
    calls = [make_inputs(transformer, tokens=5, seed=0), make_inputs(transformer, tokens=5, seed=1)]
    with config.override(log_fallbacks=False), torch.no_grad():
        rocm_sd.optimize(transformer, cache=mode, cache_threshold=HUGE, **EXACT)
        for t in (1.0, 0.9):  # a full call, then a cached one, per slot
            for inputs in calls:
                transformer(**inputs, timestep=torch.full((1,), t), return_dict=False)
        report = rocm_sd.report(transformer)[type(transformer).__name__]
        held = held_residuals(transformer)
    rocm_sd.revert(transformer)
    assert report["step cache: full calls"] == 2 and report["step cache: cached calls"] == 2, report
    assert held == 2 * (3 if mode == "fbcache" else 2)
    # each slot's calls read and write its own buffers: a graph per call and slot
    assert all(report[f"forward ({call}): graph captures"] == 2 for call in ("head", "rest", "skip")), report


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("mode", ["fbcache", "teacache"])
def test_graphed_calls_equal_the_eager_step_cache_across_generations_shapes_and_invalidation(cpu_graphs, arch, mode):
    threshold = {"teacache": 0.3, "fbcache": 0.1 if arch == "tiny-sd3" else 0.5}[mode]  # some calls cached, some full

    def run(graphed: bool):
        transformer = tiny_transformer(arch)
        large, small = make_inputs(transformer, batch=2), make_inputs(transformer, batch=2, size=4, seed=2)
        outputs = []
        with config.override(log_fallbacks=False), torch.no_grad():
            rocm_sd.optimize(transformer, cache=mode, cache_threshold=threshold, cuda_graph=graphed, **EXACT)
            for inputs, timesteps in ((large, (1.0, 0.9, 0.8, 0.7)), (large, (1.0, 0.95, 0.9)),  # a new generation
                                      (small, (0.9, 0.8)), (large, (0.6, 0.5))):                # shapes change
                for t in timesteps:
                    outputs.append(transformer(**inputs, timestep=torch.full((2,), t), return_dict=False)[0])
            rocm_sd.invalidate_graphs(transformer)
            outputs.append(transformer(**large, timestep=torch.full((2,), 0.4), return_dict=False)[0])
            report = rocm_sd.report(transformer)[type(transformer).__name__]
            rocm_sd.revert(transformer)
            outputs.append(transformer(**large, timestep=torch.full((2,), 0.4), return_dict=False)[0])
        return outputs, report

    (eager, eager_report), (graphed, graphed_report) = run(False), run(True)
    # a graph per call and input shape, the large shape's replayed after the small one's (the same slot buffers in a new
    # generation), and captured again after invalidate_graphs (whose next call is full)
    assert [graphed_report[f"forward ({call}): graph captures"] for call in ("head", "rest", "skip")] == [3, 3, 2]
    assert graphed_report["forward (head): graph replays"] == 12
    assert {k: v for k, v in graphed_report.items() if k.startswith("step cache")} == \
        {k: v for k, v in eager_report.items() if k.startswith("step cache")}
    assert eager_report["step cache: cached calls"] > 0 and eager_report["step cache: full calls"] > 0
    for e, g in zip(eager, graphed):
        assert torch.equal(e, g)



@pytest.mark.gpu
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("mode", ["fbcache", "teacache"])
def test_graphed_head_rest_and_skip_replay_and_equal_the_eager_step_cache(arch, mode):
    pipe = models.build_sd_pipeline(arch, "cuda", torch.bfloat16)
    rocm_sd.optimize(pipe, cache=mode, cache_threshold=HUGE, cuda_graph=False, text_encoder=False)
    eager = [generate(pipe, steps=4, seed=s) for s in (0, 1)]
    rocm_sd.revert(pipe)
    rocm_sd.optimize(pipe, cache=mode, cache_threshold=HUGE, text_encoder=False)
    with config.override(strict=True):
        graphed = [generate(pipe, steps=4, seed=s) for s in (0, 1)]
    report = rocm_sd.report(pipe)["transformer"]
    rocm_sd.revert(pipe)
    full = 2 * (2 if mode == "teacache" and arch == "tiny-sd3" else 1)  # TeaCache's last step, where it is known
    assert report["step cache: full calls"] == full and report["step cache: cached calls"] == 8 - full, report
    # one graph per call: the second generation's calls read and write the first one's buffers
    for call, replays in (("head", 8), ("rest", full), ("skip", 8 - full)):
        assert report[f"forward ({call}): graph captures"] == 1, (call, report)
        assert report[f"forward ({call}): graph replays"] == replays, (call, report)
    for e, g in zip(eager, graphed):
        assert torch.isfinite(g).all()
        assert torch.equal(e, g)
    rocm_sd.optimize(pipe, text_encoder=False)
    uncached = generate(pipe, steps=4)
    rocm_sd.revert(pipe)
    rocm_sd.optimize(pipe, cache=mode, cache_threshold=0.0, text_encoder=False)
    with config.override(strict=True):
        every_call_full = generate(pipe, steps=4)
    rocm_sd.revert(pipe)
    assert torch.equal(every_call_full, uncached)
