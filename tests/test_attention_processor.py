"""RocmAttnProcessor computes what diffusers' AttnProcessor2_0 / FusedAttnProcessor2_0 compute, in every
configuration the SD UNets and VAE use (and a few they could), and optimize(attention=True) installs
and reverts it."""
import pytest
import torch
from diffusers.models.attention_processor import Attention, AttnProcessor2_0

import rocm_sd
from rocm_sd import models
from rocm_sd.modules.attention import RocmAttnProcessor

CONFIGS = {
    "self": dict(query_dim=64, heads=4, dim_head=16),
    "cross": dict(query_dim=64, cross_attention_dim=32, heads=4, dim_head=16),
    "cross-norm": dict(query_dim=64, cross_attention_dim=32, heads=4, dim_head=16, cross_attention_norm="layer_norm"),
    "qk-norm": dict(query_dim=64, heads=4, dim_head=16, qk_norm="layer_norm"),
    "vae": dict(query_dim=64, heads=1, dim_head=64, norm_num_groups=8, residual_connection=True,
                rescale_output_factor=2.0, bias=True, upcast_softmax=True),
}


def _module(name):
    torch.manual_seed(0)
    attn = Attention(**CONFIGS[name]).eval()
    for p in attn.parameters():
        p.data.normal_(0, 0.2)
    return attn


def _inputs(name):
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(2, 64, 8, 8, generator=g) if name == "vae" else torch.randn(2, 24, 64, generator=g)
    context = torch.randn(2, 7, 32, generator=g) if name.startswith("cross") else None
    return hidden, context


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_same_output_as_diffusers(name, fused):
    attn = _module(name)
    hidden, context = _inputs(name)
    if fused:
        attn.fuse_projections()
    reference_processor = attn.processor
    with torch.no_grad():
        expected = attn(hidden, encoder_hidden_states=context)
        attn.set_processor(RocmAttnProcessor(reference_processor))
        got = attn(hidden, encoder_hidden_states=context)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)


def test_attention_mask_like_diffusers():
    attn = _module("cross")
    hidden, context = _inputs("cross")
    mask = torch.zeros(2, 7)
    mask[:, 5:] = -10000.0  # padded keys
    with torch.no_grad():
        expected = attn(hidden, encoder_hidden_states=context, attention_mask=mask)
        attn.set_processor(RocmAttnProcessor(AttnProcessor2_0()))
        got = attn(hidden, encoder_hidden_states=context, attention_mask=mask)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)


def test_unknown_arguments_go_to_the_replaced_processor():
    calls = []

    class Spy(AttnProcessor2_0):
        def __call__(self, *args, **kwargs):
            calls.append(kwargs)
            return super().__call__(*args, **kwargs)

    attn = _module("self")
    attn.set_processor(RocmAttnProcessor(Spy()))
    hidden, _ = _inputs("self")
    with torch.no_grad():
        attn.processor(attn, hidden, scale=1.0)
    assert calls and calls[0]["scale"] == 1.0


def test_optimize_installs_and_revert_restores():
    pipe = models.build_sd_pipeline("tiny")
    kw = models.prompt_kwargs(pipe, "a fox")
    before = {name: type(p).__name__ for name, p in pipe.unet.attn_processors.items()}
    with torch.no_grad():
        expected = pipe(**kw, num_inference_steps=2, output_type="np", generator=torch.Generator().manual_seed(0)).images
    rocm_sd.optimize(pipe, attention=True)
    assert rocm_sd.report(pipe)["unet"]["attention processor"] == len(before)
    assert all(isinstance(p, RocmAttnProcessor) for p in pipe.unet.attn_processors.values())
    with torch.no_grad():
        got = pipe(**kw, num_inference_steps=2, output_type="np", generator=torch.Generator().manual_seed(0)).images
    assert abs(got - expected).max() < 2e-3
    rocm_sd.revert(pipe)
    assert {name: type(p).__name__ for name, p in pipe.unet.attn_processors.items()} == before
