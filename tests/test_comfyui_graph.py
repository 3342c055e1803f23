"""The ComfyUI node's graph capture (rocm_sd/patch/comfy_graph.py) against the stand-in of ComfyUI's interfaces
(tests/standins). `sampler_call` makes a model evaluation the way ComfyUI's sampler does (comfy/samplers.py
_calc_cond_batch at a125cd84): transformer_options merged from the model's options plus cond_or_uncond,
uuids and sigmas, then model_function_wrapper(apply_model, {...}) where one is set."""
from __future__ import annotations

import uuid

import pytest
import torch

from rocm_sd.patch import comfy as comfy_patch
from rocm_sd.patch.comfy_graph import GraphedModelFunction, graph_blocker, graph_stats
from tests.comfyui_standin import model_inputs, standin_model


def sampler_call(patcher, x, ctx, sigma=1.0, extra_options=None):
    options = {**patcher.model_options["transformer_options"], **(extra_options or {})}
    timestep = torch.full((x.shape[0] // 2,), sigma, device=x.device)
    options.update(cond_or_uncond=[1, 0], uuids=[uuid.uuid4(), uuid.uuid4()], sigmas=timestep)
    c = {"c_crossattn": ctx, "transformer_options": options}
    timestep = torch.cat([timestep] * 2)
    wrapper = patcher.model_options.get("model_function_wrapper")
    with torch.inference_mode():
        if wrapper is not None:
            args = {"input": x, "timestep": timestep, "c": c, "cond_or_uncond": [1, 0]}
            return wrapper(patcher.model.apply_model, args)
        return patcher.model.apply_model(x, timestep, **c)


def eager_call(patcher, x, ctx):
    """The same evaluation without the wrapper: what a graph replay must reproduce."""
    without = patcher.clone()
    without.model_options.pop("model_function_wrapper")
    return sampler_call(without, x, ctx)


def test_node_installs_the_graph_wrapper_on_the_clone_only(comfy, nodes):
    patcher = standin_model(comfy)
    (optimized,) = nodes.RocmSDOptimizeModel().optimize(patcher)
    wrapper = optimized.model_options["model_function_wrapper"]
    assert isinstance(wrapper, GraphedModelFunction) and "model_function_wrapper" not in patcher.model_options
    assert optimized.clone().model_options["model_function_wrapper"] is wrapper  # clones share the graphs
    assert optimized.get_all_callbacks("on_detach_after") == [wrapper.on_detach]
    (no_graphs,) = nodes.RocmSDOptimizeModel().optimize(patcher, cuda_graph=False)
    assert "model_function_wrapper" not in no_graphs.model_options
    (twice,) = nodes.RocmSDOptimizeModel().optimize(optimized)  # the node on its own output: one wrapper, kept
    assert twice.model_options["model_function_wrapper"] is wrapper


def test_another_nodes_wrapper_is_kept_and_the_reason_given(comfy):
    patcher = standin_model(comfy)

    def theirs(apply_model, args):
        return apply_model(args["input"], args["timestep"], **args["c"])

    patcher.set_model_unet_function_wrapper(theirs)
    (why,) = comfy_patch.patch_model_patcher(patcher, cuda_graph=True)
    assert patcher.model_options["model_function_wrapper"] is theirs
    assert why.startswith("no graph capture: ") and "model_function_wrapper" in why


class _Model:
    model_lowvram = False


@pytest.mark.parametrize("options,blocked", [
    ({}, None),
    ({"patches": {}, "patches_replace": {}, "wrappers": {}}, None),
    ({"patches": {"output_block_patch": []}}, None),  # present but empty: nothing runs
    ({"patches": {"output_block_patch": [lambda h, hsp, o: (h, hsp)]}}, "'output_block_patch' transformer patch"),
    ({"patches_replace": {"attn1": {("input", 1, 0): comfy_patch.attention_replace}}}, None),
    ({"patches_replace": {"attn2": {("input", 1, 0): lambda q, k, v, o: q}}}, "'attn2' replace patch"),
    ({"wrappers": {"outer_sample": {None: [lambda *a: None]}}}, None),  # runs around the model call
    ({"wrappers": {"apply_model": {None: [lambda *a: None]}}}, "'apply_model' wrapper"),
    ({"wrappers": {"diffusion_model": {"k": [lambda *a: None]}}}, "'diffusion_model' wrapper"),
    ({"wrappers": {"some_future_kind": {"k": [lambda *a: None]}}}, "'some_future_kind' wrapper"),
])
def test_graph_blocker(options, blocked):
    why = graph_blocker(_Model(), {"transformer_options": options}, comfy_patch.attention_replace)
    assert why is None if blocked is None else blocked in why


def test_low_vram_and_unbound_calls_are_blocked():
    low_vram = _Model()
    low_vram.model_lowvram = True
    assert "low-VRAM" in graph_blocker(low_vram, {})
    assert "bound method" in graph_blocker(None, {})


def test_graphs_are_dropped_when_comfyui_goes_low_vram(comfy, nodes):
    patcher = standin_model(comfy)
    (optimized,) = nodes.RocmSDOptimizeModel().optimize(patcher)
    wrapper = optimized.model_options["model_function_wrapper"]
    x, ctx = model_inputs()
    sampler_call(optimized, x, ctx)  # creates the GraphedCall (eager here: no GPU)
    wrapper.graphed.graphs["a captured signature"] = object()  # as after a capture on a GPU
    sampler_call(optimized, x, ctx)
    assert wrapper.graphed.graphs  # nothing changed: kept
    optimized.model.model_lowvram = True  # ComfyUI partially unloaded the model to make room
    sampler_call(optimized, x, ctx)
    assert not wrapper.graphed.graphs
    assert graph_stats(optimized)["graphs dropped: ComfyUI moved to low-VRAM mode"] == 1


def test_on_the_cpu_the_wrapper_runs_the_call_and_says_why(comfy, nodes):
    patcher = standin_model(comfy)
    x, ctx = model_inputs()
    (optimized,) = nodes.RocmSDOptimizeModel().optimize(patcher)
    optimized.patch_model()
    try:
        got, reference = sampler_call(optimized, x, ctx), eager_call(optimized, x, ctx)
    finally:
        optimized.unpatch_model()
    assert torch.equal(got, reference)
    assert graph_stats(optimized) == {"eager: no GPU tensor among the inputs": 1}


# ---- on the GPU: captured once, replayed, captured again when the weights' storage changes ----------------

@pytest.fixture
def gpu_patched(comfy, nodes):
    patcher = standin_model(comfy, "cuda", torch.float16, channels=32)
    (optimized,) = nodes.RocmSDOptimizeModel().optimize(patcher)
    optimized.patch_model()
    yield optimized
    optimized.unpatch_model()


def _inputs(seed):
    """A latent batch on the GPU and its conditioning on the CPU in fp32, as ComfyUI's sampler hands them over."""
    x, ctx = model_inputs("cuda", torch.float16, seed)
    return x, ctx.float().cpu()


@pytest.mark.gpu
def test_graph_replays_match_the_eager_model(gpu_patched):
    for seed in range(4):  # new inputs and new uuids every call (a new sampling run): one capture only
        x, ctx = _inputs(seed)
        torch.testing.assert_close(sampler_call(gpu_patched, x, ctx, sigma=seed + 1.0), eager_call(gpu_patched, x, ctx))
    stats = graph_stats(gpu_patched)
    assert stats["graph captures"] == 1 and stats["graph replays"] == 4, stats

    x, ctx = _inputs(9)
    sampler_call(gpu_patched, x, ctx, extra_options={"sample_sigmas": torch.ones(31, device="cuda")})
    assert graph_stats(gpu_patched)["graph captures"] == 1  # another step count: not a new signature


@pytest.mark.gpu
def test_weights_replaced_or_copied_into_and_model_unloaded(gpu_patched):
    x, ctx = _inputs(1)
    sampler_call(gpu_patched, x, ctx)
    conv = gpu_patched.model.diffusion_model.input_blocks[0][0]
    with torch.no_grad():  # as ComfyUI's LoRA patching does (comfy.utils.set_attr_param): a new Parameter
        conv.weight = torch.nn.Parameter(conv.weight * 0.5, requires_grad=False)
    torch.testing.assert_close(sampler_call(gpu_patched, x, ctx), eager_call(gpu_patched, x, ctx))
    assert graph_stats(gpu_patched)["graph captures"] == 2

    with torch.no_grad():  # as hook keyframes do (comfy.utils.copy_to_param): in place, the graph reads it
        conv.weight.mul_(2.0)
    torch.testing.assert_close(sampler_call(gpu_patched, x, ctx), eager_call(gpu_patched, x, ctx))
    assert graph_stats(gpu_patched)["graph captures"] == 2

    wrapper = gpu_patched.model_options["model_function_wrapper"]
    gpu_patched.detach(unpatch_all=False)  # every sampling run: load_models_gpu detaches and reloads the model
    gpu_patched.patch_model()  # and re-applies its object patches: the same modules, set again
    torch.testing.assert_close(sampler_call(gpu_patched, x, ctx), eager_call(gpu_patched, x, ctx))
    assert graph_stats(gpu_patched)["graph captures"] == 2 and wrapper.graphed.graphs

    gpu_patched.detach()  # ComfyUI unloads the model: the graphs' memory is given back
    assert not wrapper.graphed.graphs
    gpu_patched.patch_model()
    for _ in range(2):  # captured again into a new pool (the old one lost its last graph), then replayed
        torch.testing.assert_close(sampler_call(gpu_patched, x, ctx), eager_call(gpu_patched, x, ctx))
    assert graph_stats(gpu_patched)["graph captures"] == 3


@pytest.mark.gpu
def test_calls_with_other_nodes_patches_run_eagerly(gpu_patched):
    x, ctx = _inputs(2)

    def freeu_like(h, hsp, transformer_options):  # Python that may decide per call: never baked into a graph
        return h, hsp

    patch = {"patches": {"output_block_patch": [freeu_like]}}
    sampler_call(gpu_patched, x, ctx, extra_options=patch)
    sampler_call(gpu_patched, x, ctx, extra_options=patch)
    stats = graph_stats(gpu_patched)
    assert stats["graph captures"] == 0
    assert stats["eager: a 'output_block_patch' transformer patch runs Python inside the model"] == 2


def test_each_reason_to_run_eagerly_is_said_once(comfy, nodes, caplog):
    import logging

    patcher = standin_model(comfy)
    (optimized,) = nodes.RocmSDOptimizeModel().optimize(patcher)
    x, ctx = model_inputs()
    patch = {"patches": {"output_block_patch": [lambda h, hsp, options: (h, hsp)]}}
    with caplog.at_level(logging.INFO, logger="rocm_sd.comfyui"):
        for _ in range(3):
            sampler_call(optimized, x, ctx, extra_options=patch)
    said = [r.getMessage() for r in caplog.records if "without graph replay" in r.getMessage()]
    assert said == ["rocm_sd: ComfyUI model evaluations without graph replay while a 'output_block_patch' "
                    "transformer patch runs Python inside the model"]
