"""optimize(attention_precision="fp8"): the UNet's RocmAttnProcessors through rocm_sd::attention_fp8
(patch/attention_fp8.py)."""
import logging

import pytest
import torch

import rocm_sd
from rocm_sd import config, dispatch, models
from rocm_sd.modules.attention import RocmAttnProcessor
from rocm_sd.patch import attention_fp8 as patch
from tests.test_optimize import run_pipe


def processors(model):
    return [m.processor for m in model.modules() if isinstance(getattr(m, "processor", None), RocmAttnProcessor)]


def test_on_cpu_it_is_not_applied_and_says_why(caplog):
    pipe = models.build_sd_pipeline("tiny", "cpu", torch.float32)
    with caplog.at_level(logging.WARNING, logger="rocm_sd"), config.override(log_fallbacks=False):
        rocm_sd.optimize(pipe, attention_precision="fp8")
    assert any("attention_precision=fp8 not applied" in r.getMessage() and "needs a GPU" in r.getMessage()
               for r in caplog.records)
    assert any(k.startswith("attention_precision=fp8 not applied") for k in rocm_sd.report(pipe)["unet"])
    assert all(p.fp8_format is None for p in processors(pipe.unet))
    rocm_sd.revert(pipe)


def test_without_the_attention_flag_it_says_so(monkeypatch):
    monkeypatch.setattr(patch, "fp8_of", lambda device: ("e4m3fnuz", None))
    pipe = models.build_sd_pipeline("tiny", "cpu", torch.float32)
    with config.override(log_fallbacks=False):
        rocm_sd.optimize(pipe, attention_precision="fp8", attention=False)
    assert any(k.endswith("(the `attention` flag is off)") for k in rocm_sd.report(pipe)["unet"])
    rocm_sd.revert(pipe)


def test_processors_route_unmasked_calls_and_revert_restores(monkeypatch):
    """With the device check answered (a CPU has no FP8), every UNet attention goes to attention_fp8, which on the CPU
    (untuned) computes the fp16 attention: the same images; revert() turns it off."""
    monkeypatch.setattr(patch, "fp8_of", lambda device: ("e4m3fn", None))
    pipe = models.build_sd_pipeline("tiny", "cpu", torch.float32)
    with config.override(log_fallbacks=False):
        before = run_pipe(pipe)
        rocm_sd.optimize(pipe, attention_precision="fp8", cuda_graph=False)
    record = rocm_sd.report(pipe)["unet"]
    assert record["attention -> e4m3fn where measured faster"] == len(processors(pipe.unet)) > 0
    dispatch.reset_stats()
    with config.override(log_fallbacks=False):
        after = run_pipe(pipe)
    assert dispatch.stats()["attention_fp8"]["torch"] > 0  # the op ran, and chose the fp16 attention (untuned)
    for processor in processors(pipe.unet):
        processor.fp8_format = None
    with config.override(log_fallbacks=False):
        fp16 = run_pipe(pipe)
    torch.testing.assert_close(after, fp16, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(after, before, rtol=1e-2, atol=1e-3)  # and the other flags change little
    rocm_sd.revert(pipe)
    assert not processors(pipe.unet)


@pytest.mark.gpu
def test_sd_pipeline_runs_the_fp8_kernel_when_forced():
    from rocm_sd import platform
    from rocm_sd.ops.quantize import fp8_format

    fmt, why = fp8_format(platform.device_arch(torch.device("cuda")))
    if fmt is None:
        pytest.skip(why)
    pipe = models.build_sd_pipeline("tiny", "cuda", torch.float16)
    before = run_pipe(pipe)
    rocm_sd.optimize(pipe, attention_precision="fp8")
    dispatch.reset_stats()
    with config.override(strict=True), dispatch.force_backend("attention_fp8", "rocm_sd"):
        after = run_pipe(pipe)
    assert dispatch.stats()["attention_fp8"]["rocm_sd"] > 0
    assert torch.isfinite(after).all()
    error = ((after - before).float().abs().max() / before.float().abs().max()).item()
    assert 0 < error < 0.2, error  # FP8 changes the latents, and by an FP8-sized amount
    rocm_sd.revert(pipe)
