"""optimize(text_kv=True): cross-attention's keys and values computed once per text (modules/text_kv.py)."""
import copy

import pytest
import torch

import rocm_sd
from rocm_sd import config, models
from rocm_sd.modules.text_kv import TextKV
from tests.test_optimize import run_pipe


def _cross_attentions(unet):
    return [m for m in unet.modules() if getattr(m, "is_cross_attention", False)]


def _count_projections(unet) -> list[int]:
    """A counter of the text projections' calls (to_k / to_kv of every cross-attention module)."""
    calls = [0]

    def counted(*_):
        calls[0] += 1

    for attn in _cross_attentions(unet):
        projection = attn.to_kv if getattr(attn, "fused_projections", False) else attn.to_k
        projection.register_forward_hook(counted)
    return calls


@pytest.mark.parametrize("model, fuse_qkv", [("tiny", False), ("tiny", True), ("tiny-xl", False)])
def test_same_numbers_with_the_projections_once_per_prompt(model, fuse_qkv):
    pipe = models.build_sd_pipeline(model, "cpu", torch.float32)
    attentions = len(_cross_attentions(pipe.unet))
    rocm_sd.optimize(pipe, cuda_graph=False, text_kv=False, fuse_qkv=fuse_qkv)
    calls = _count_projections(pipe.unet)
    reference = run_pipe(pipe, steps=3)
    assert calls[0] == 3 * attentions  # every step projects the text
    rocm_sd.revert(pipe)

    rocm_sd.optimize(pipe, cuda_graph=False, fuse_qkv=fuse_qkv)
    assert isinstance(pipe.unet.forward, TextKV)
    calls = _count_projections(pipe.unet)
    out = run_pipe(pipe, steps=3)
    assert calls[0] == attentions  # once for the three steps
    assert torch.equal(out, reference)
    report = rocm_sd.report(pipe)["unet"]
    assert report["text keys and values: computed"] == 1 and report["text keys and values: reused"] == 2
    assert run_pipe(pipe, steps=3).equal(reference) and calls[0] == 2 * attentions  # a new call: a new embedding
    rocm_sd.revert(pipe)
    assert "forward" not in vars(pipe.unet)
    assert all(attn.processor.__class__.__name__ != "RocmAttnProcessor" for attn in _cross_attentions(pipe.unet))


@pytest.fixture
def optimized_unet():
    pipe = models.build_sd_pipeline("tiny", "cpu", torch.float32)
    rocm_sd.optimize(pipe, cuda_graph=False)
    unet = pipe.unet
    torch.manual_seed(0)
    sample = torch.randn(2, unet.config.in_channels, 8, 8)
    text = torch.randn(2, 77, unet.config.cross_attention_dim)
    yield unet, sample, text, _count_projections(unet)
    rocm_sd.revert(pipe)


def _step(unet, sample, text, **kwargs):
    with torch.no_grad():
        return unet(sample, torch.tensor(10.0), text, **kwargs).sample


def test_a_changed_text_or_weight_is_projected_again(optimized_unet):
    unet, sample, text, calls = optimized_unet
    attentions = len(_cross_attentions(unet))
    first = _step(unet, sample, text)
    _step(unet, sample, text)
    assert calls[0] == attentions
    text.mul_(2)  # in place: a new version
    changed = _step(unet, sample, text)
    assert calls[0] == 2 * attentions and not changed.equal(first)
    with torch.no_grad():
        _cross_attentions(unet)[0].to_v.weight.mul_(0.5)  # a weight changed in place
    _step(unet, sample, text)
    assert calls[0] == 3 * attentions
    _step(unet, sample, text.clone())  # another tensor with the same values
    assert calls[0] == 4 * attentions


def test_calls_it_does_not_take_project_the_text_themselves(optimized_unet):
    unet, sample, text, calls = optimized_unet
    attentions = len(_cross_attentions(unet))
    _step(unet, sample, text)
    reused = _step(unet, sample, text)
    assert calls[0] == attentions
    with torch.enable_grad():  # autograd: the kept keys and values hold no graph
        unet(sample, torch.tensor(10.0), text)
    assert calls[0] == 2 * attentions
    with torch.no_grad():  # another text batch: its own buffers, computed
        _step(unet, sample[:1], text[:1])
    assert calls[0] == 3 * attentions
    assert _step(unet, sample, text).equal(reused)  # one text is kept at a time: the first is computed again
    assert calls[0] == 4 * attentions
    unet._hf_hook = object()  # accelerate's model offload, installed first: its hook moves the weights inside the call
    try:
        assert _step(unet, sample, text).equal(reused) and _step(unet, sample, text).equal(reused)
        assert calls[0] == 6 * attentions
    finally:
        del unet._hf_hook


def test_invalidate_graphs_forgets_the_keys_and_values(optimized_unet):
    unet, sample, text, calls = optimized_unet
    _step(unet, sample, text)
    rocm_sd.invalidate_graphs(unet)
    _step(unet, sample, text)
    assert calls[0] == 2 * len(_cross_attentions(unet))



def test_a_controlnet_projects_the_text_once_too():
    from diffusers import ControlNetModel

    pipe = models.build_sd_pipeline("tiny", "cpu", torch.float32)
    controlnet = ControlNetModel.from_unet(pipe.unet, conditioning_channels=3,
                                           conditioning_embedding_out_channels=(16, 32))
    torch.manual_seed(0)
    sample, text = torch.randn(2, 4, 8, 8), torch.randn(2, 77, pipe.unet.config.cross_attention_dim)
    cond = torch.rand(2, 3, 16, 16)  # the conditioning embedding halves it once

    def run():
        with torch.no_grad():
            down, mid = controlnet(sample, torch.tensor(10.0), text, cond, return_dict=False)
        return torch.cat([d.flatten() for d in down] + [mid.flatten()])

    reference = run()
    rocm_sd.optimize(controlnet, cuda_graph=False)
    calls = _count_projections(controlnet)
    first, second = run(), run()
    assert calls[0] == len(_cross_attentions(controlnet)) > 0
    assert torch.allclose(first, reference, rtol=1e-5, atol=1e-6) and torch.equal(first, second)
    rocm_sd.revert(controlnet)
    assert run().equal(reference)

def test_a_copy_computes_its_own():
    pipe = models.build_sd_pipeline("tiny", "cpu", torch.float32)
    rocm_sd.optimize(pipe, cuda_graph=False)
    reference = run_pipe(pipe)
    unet = copy.deepcopy(pipe.unet)
    assert isinstance(unet.forward, TextKV) and unet.forward.model is unet
    pipe.unet = unet
    assert run_pipe(pipe).equal(reference)
    rocm_sd.revert(pipe)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "fp8"])
def test_on_the_gpu_the_graphed_step_reads_the_kept_keys_and_values(precision):
    """Graphs on: the keys and values come from their own graph, once per call; the step's graph replays without the
    projections, and the image is the one without text_kv."""
    pipe = models.build_sd_pipeline("tiny", "cuda", torch.float16)
    with config.override(strict=True):
        rocm_sd.optimize(pipe, text_kv=False, precision=precision)
        reference = run_pipe(pipe, steps=4).float()
        rocm_sd.revert(pipe)
        rocm_sd.optimize(pipe, precision=precision)
        calls = _count_projections(pipe.unet)
        first = run_pipe(pipe, steps=4).float()
        second = run_pipe(pipe, steps=4).float()
        report = rocm_sd.report(pipe)["unet"]
    assert report["text keys and values: computed"] == 2 and report["text keys and values: reused"] == 6
    assert report["text keys and values: graph replays"] >= 1, report
    assert not any("eager" in key for key in report), report
    assert calls[0] <= 3 * len(_cross_attentions(pipe.unet))  # the warm-ups of the keys' graph, then replays only
    assert torch.allclose(first, reference, rtol=1e-3, atol=1e-3) and torch.equal(first, second)
    rocm_sd.revert(pipe)
