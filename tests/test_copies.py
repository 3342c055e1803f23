"""Copies of optimized models (copy.deepcopy, pickle): independent of the original, which they never change."""
import copy
import pickle

import pytest
import torch

import rocm_sd
from rocm_sd import config, models
from rocm_sd.graphs import GraphedCall
from rocm_sd.patch.core import RECORD_ATTR


def unet_output(unet):
    torch.manual_seed(0)
    config_ = unet.config
    sample = torch.randn(2, config_.in_channels, 8, 8)
    context = torch.randn(2, 77, config_.cross_attention_dim)
    with torch.no_grad():
        return unet(sample, 10, encoder_hidden_states=context).sample


@pytest.fixture
def unet():
    return models.build_sd_pipeline("tiny", "cpu", torch.float32).unet


def _copies():
    return {"deepcopy": copy.deepcopy, "pickle": lambda m: pickle.loads(pickle.dumps(m))}


@pytest.mark.parametrize("make_copy", _copies().values(), ids=_copies().keys())
def test_a_copy_of_an_optimized_unet_is_independent(unet, make_copy):
    reference = unet_output(unet)
    with config.override(log_fallbacks=False):
        rocm_sd.optimize(unet)
        optimized = unet_output(unet)
        twin = make_copy(unet)
        assert torch.equal(unet_output(twin), optimized)
        rocm_sd.revert(twin)  # once reverted the original's forward attributes and modules: 1.47 off
        assert torch.equal(unet_output(unet), optimized)
        assert torch.equal(unet_output(twin), reference)
        rocm_sd.revert(unet)  # once raised "'UNet2DConditionModel' object has no attribute 'forward'"
    assert torch.equal(unet_output(unet), reference)
    assert getattr(unet, RECORD_ATTR, None) is None and getattr(twin, RECORD_ATTR, None) is None


def test_a_copied_pipeline_has_its_own_graphed_calls_and_pool():
    pipe = models.build_sd_pipeline("tiny", "cpu", torch.float32)
    rocm_sd.optimize(pipe)
    twin = copy.deepcopy(pipe)
    # the graphed call stands inside text_kv's controller (modules/text_kv.py), which a copy copies too
    original_call, copied_call = pipe.unet.__dict__["forward"].inner, twin.unet.__dict__["forward"].inner
    assert twin.unet.__dict__["forward"].model is twin.unet
    assert isinstance(copied_call, GraphedCall) and copied_call is not original_call
    assert copied_call.module is twin.unet and copied_call.fn.__self__ is twin.unet and not copied_call.graphs
    assert copied_call.pool_owner is twin.vae.__dict__["decode"].pool_owner  # one pool per pipeline, as optimize()
    assert copied_call.pool_owner is not original_call.pool_owner
    rocm_sd.revert(twin)
    assert "forward" not in twin.unet.__dict__ and isinstance(pipe.unet.__dict__["forward"].inner, GraphedCall)
    rocm_sd.revert(pipe)


def test_undo_actions_refuse_closures():
    from rocm_sd.patch.core import PatchRecord

    model = torch.nn.Linear(2, 2)
    with pytest.raises(TypeError, match="closure"):
        PatchRecord().on_revert(lambda: model.to(torch.float64))


@pytest.mark.gpu
def test_a_deep_copy_of_a_graphed_pipeline_captures_its_own_graphs_on_the_gpu():
    pipe = models.build_sd_pipeline("tiny", "cuda", torch.float16)
    rocm_sd.optimize(pipe)
    conditioning = models.prompt_kwargs(pipe, "a cat")

    def run(p):
        with torch.no_grad():
            return p(**conditioning, num_inference_steps=3, generator=torch.Generator("cuda").manual_seed(0),
                     height=64, width=64, output_type="latent").images

    first = run(pipe)
    twin = copy.deepcopy(pipe)
    assert torch.equal(run(twin), first)
    assert twin.unet.__dict__["forward"].inner.stats["graph captures"] >= 1
    rocm_sd.revert(twin)
    assert torch.equal(run(pipe), first)
    assert pipe.unet.__dict__["forward"].inner.stats["graph replays"] >= 1
    rocm_sd.revert(pipe)
