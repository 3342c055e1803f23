"""optimize(precision=...): the 8-bit linear layers (modules/quantized_linear.py) and their patch (patch/precision.py)."""
import logging
import re
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import rocm_sd
from rocm_sd import config, dispatch, models
from rocm_sd.modules import RocmGEGLU, RocmLayerNorm
from rocm_sd.modules.quantized_linear import RocmQuantizedLinear, new_model_call
from rocm_sd.ops.quantize import FORMATS, dequantize_rows, quantize_rows_ref
from rocm_sd.patch import precision
from tests.test_optimize import run_pipe


def _reference(layer: RocmQuantizedLinear, x: torch.Tensor) -> torch.Tensor:
    """The 8-bit product in float64, from the same quantized operands."""
    q, scale = quantize_rows_ref(x.reshape(-1, layer.in_features), layer.format)
    w = dequantize_rows(layer.weight_q, layer.weight_scale.squeeze(0)).double()
    out = dequantize_rows(q, scale).double() @ w.t()
    return out if layer.bias is None else out + layer.bias.double()


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_linear_is_the_product_of_the_quantized_operands(fmt):
    linear = nn.Linear(64, 48)
    x = torch.randn(2, 5, 64)
    layer = RocmQuantizedLinear.from_module(linear, fmt)
    with config.override(log_fallbacks=False):
        out = layer(x)
    assert out.shape == (2, 5, 48) and out.dtype == x.dtype
    torch.testing.assert_close(out.reshape(-1, 48).double(), _reference(layer, x), rtol=1e-5, atol=1e-5)
    # and near the unquantized layer: e4m3 keeps 3 mantissa bits, int8 7
    error = (out - linear(x)).abs().max() / linear(x).abs().max()
    assert error < (0.1 if fmt != "int8" else 0.02), error


def test_pointwise_conv_keeps_channels_last():
    conv = nn.Conv2d(32, 16, 1)
    x = torch.randn(2, 32, 5, 7).to(memory_format=torch.channels_last)
    layer = RocmQuantizedLinear.from_module(conv, "e4m3fnuz")
    with config.override(log_fallbacks=False):
        out = layer(x)
    assert out.shape == (2, 16, 5, 7) and out.is_contiguous(memory_format=torch.channels_last)
    rows = _reference(layer, x.permute(0, 2, 3, 1)).reshape(2, 5, 7, 16).permute(0, 3, 1, 2)
    torch.testing.assert_close(out.double(), rows, rtol=1e-5, atol=1e-5)
    assert (out - conv(x)).abs().max() < 0.1 * conv(x).abs().max()


def test_wrong_input_is_a_clear_error():
    layer = RocmQuantizedLinear.from_module(nn.Linear(16, 16), "int8")
    with pytest.raises(ValueError, match="does not end in 16 features"):
        layer(torch.randn(3, 8))
    with pytest.raises(ValueError, match="format 'fp4'"):
        RocmQuantizedLinear(torch.randn(16, 16), None, "fp4")


def test_on_cpu_precision_is_not_applied_and_says_why(caplog):
    pipe = models.build_sd_pipeline("tiny", "cpu", torch.float32)
    with caplog.at_level(logging.WARNING, logger="rocm_sd"), config.override(log_fallbacks=False):
        rocm_sd.optimize(pipe, precision="fp8")
    assert any("precision=fp8 not applied" in r.getMessage() and "8-bit GEMMs need a GPU" in r.getMessage()
               for r in caplog.records)
    assert any(k.startswith("precision=fp8 not applied") for k in rocm_sd.report(pipe)["unet"])
    assert not any(isinstance(m, RocmQuantizedLinear) for m in pipe.unet.modules())
    rocm_sd.revert(pipe)


@pytest.mark.parametrize("fmt, precision_name", [("e4m3fn", "fp8"), ("int8", "int8")])
def test_patch_replaces_the_linears_and_revert_restores(monkeypatch, fmt, precision_name):
    """With the device check answered (a CPU has no 8-bit GEMMs; the layers then compute the same product from the
    dequantized operands), the patch replaces the transformer and 1x1 layers (self-attention's projections fused into
    one, cross-attention's keys and values into one: fuse_qkv's 8-bit default), leaves the one-row embeddings and the
    projections the fused ones replaced, and revert() puts the exact original modules back."""
    monkeypatch.setattr(precision, "number_format", lambda device, p: (fmt, None))
    pipe = models.build_sd_pipeline("tiny", "cpu", torch.float32)
    before = {k: v.clone() for k, v in pipe.unet.state_dict().items()}
    reference = run_pipe(pipe)
    with config.override(log_fallbacks=False):
        rocm_sd.optimize(pipe, precision=precision_name, channels_last=False)
        quantized = run_pipe(pipe)
    names = [name for name, m in pipe.unet.named_modules() if isinstance(m, RocmQuantizedLinear)]
    assert any(name.endswith("attn1.to_qkv") for name in names) and any(name.endswith("ff.net.2") for name in names)
    assert any(name.endswith("attn2.to_kv") for name in names) and any(name.endswith("attn2.to_q") for name in names)
    assert not any(name.endswith(("attn1.to_q", "attn1.to_k", "attn1.to_v", "attn2.to_k", "attn2.to_v"))
                   for name in names)
    assert any("proj_in" in name for name in names)
    assert not any(part in name for name in names for part in precision.FEW_ROWS)
    assert dispatch.stats()["quantize_rows"]["torch"] > 0
    assert torch.isfinite(quantized).all()
    error = (quantized - reference).abs().max() / reference.abs().max()
    assert 0 < error < 0.3, error  # a sanity bound: this tiny random model amplifies the 8-bit error (0.19-0.23)
    rocm_sd.revert(pipe)
    after = pipe.unet.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    assert torch.equal(run_pipe(pipe), reference)


@pytest.mark.parametrize("fuse_qkv", ["absent", None, True, False])
def test_8bit_precision_fuses_the_projections_unless_told_not_to(monkeypatch, fuse_qkv):
    """fuse_qkv defaults to on with an 8-bit precision (off in fp16): one 8-bit GEMM for q, k and v of
    self-attention, one for k and v of cross-attention, fed by the norm's and the text's one quantization; the
    separate projections are not quantized (they wait in CPU memory); fuse_qkv=False keeps them."""
    monkeypatch.setattr(precision, "number_format", lambda device, p: ("e4m3fn", None))
    pipe = models.build_sd_pipeline("tiny", "cpu", torch.float32)
    reference = run_pipe(pipe)
    keywords = {} if fuse_qkv == "absent" else {"fuse_qkv": fuse_qkv}  # None: the default too (the signature's)
    with config.override(log_fallbacks=False):
        rocm_sd.optimize(pipe, precision="fp8", channels_last=False, **keywords)
        quantized = run_pipe(pipe)
    fused = fuse_qkv is not False
    attentions = [m for m in pipe.unet.modules() if type(m).__name__ == "Attention"]
    assert attentions and all(getattr(m, "fused_projections", False) == fused for m in attentions)
    for attn in attentions:
        separate = [attn.to_k, attn.to_v] + ([attn.to_q] if hasattr(attn, "to_qkv") else [])
        assert all(isinstance(m, RocmQuantizedLinear) != fused for m in separate)
        if fused:
            assert isinstance(getattr(attn, "to_qkv", None) or attn.to_kv, RocmQuantizedLinear)
    assert rocm_sd.report(pipe)["unet"].get("fused qkv", 0) == int(fused)
    error = (quantized - reference).abs().max() / reference.abs().max()
    assert 0 < error < 0.3, error  # as in test_patch_replaces_the_linears_and_revert_restores
    rocm_sd.revert(pipe)
    assert not any(hasattr(m, "to_qkv") or hasattr(m, "to_kv") for m in attentions)
    assert torch.equal(run_pipe(pipe), reference)


def test_fused_projections_multiply_the_same_operands_with_row_scales(monkeypatch):
    """With a scale per row and output channel, the fused GEMM's operands are the separate ones' side by side: the
    same images bit for bit (one scale per tensor differs: the fused weight takes one scale for q, k and v)."""
    monkeypatch.setattr(precision, "number_format", lambda device, p: ("e4m3fn", None))
    images = []
    for fuse_qkv in (False, True):
        pipe = models.build_sd_pipeline("tiny", "cpu", torch.float32)
        with config.override(log_fallbacks=False):
            rocm_sd.optimize(pipe, precision="fp8", channels_last=False, precision_scales="row", fuse_qkv=fuse_qkv)
            assert rocm_sd.report(pipe)["unet"].get("fused qkv", 0) == int(fuse_qkv)
            images.append(run_pipe(pipe))
    assert torch.equal(*images)


def test_an_input_is_quantized_once_for_every_layer_that_takes_it():
    """to_q, to_k and to_v share one quantization of their input; an in-place write to it, or the next model call,
    makes the next layer quantize again. The shared quantization is the one each layer would have made."""
    layers = [RocmQuantizedLinear.from_module(nn.Linear(64, 32), "e4m3fn") for _ in range(3)]
    x = torch.randn(2, 5, 64)
    alone = [layer(x.clone()) for layer in layers]
    dispatch.reset_stats()
    with config.override(log_fallbacks=False):
        shared = [layer(x) for layer in layers]
        assert dispatch.stats()["quantize_rows"] == {"torch": 1}
        assert all(torch.equal(a, b) for a, b in zip(alone, shared))
        x.mul_(2)
        assert torch.equal(layers[0](x), layers[0](x.clone()))
        assert dispatch.stats()["quantize_rows"] == {"torch": 3}  # x changed: quantized again (and the clone)
        layers[1](x)
        new_model_call()
        layers[2](x)
        assert dispatch.stats()["quantize_rows"] == {"torch": 4}


@pytest.mark.parametrize("fmt", ["e4m3fn", "int8"])
def test_norms_and_geglu_quantize_for_the_layers_after_them(monkeypatch, fmt):
    """Where every consumer of a rocm_sd LayerNorm or GEGLU is an 8-bit layer of the format, that kernel writes the
    quantized output too and the layers quantize nothing: the same operands, so bit for bit the same images."""
    monkeypatch.setattr(precision, "number_format", lambda device, p: (fmt, None))
    pipe = models.build_sd_pipeline("tiny", "cpu", torch.float32)
    with config.override(log_fallbacks=False):
        rocm_sd.optimize(pipe, precision="fp8" if fmt != "int8" else "int8", channels_last=False,
                         precision_scales="row")
        producers = [m for m in pipe.unet.modules() if isinstance(m, (RocmLayerNorm, RocmGEGLU))]
        fused = [m for m in producers if m.quantized_output == fmt]
        blocks = sum(1 for m in pipe.unet.modules() if type(m).__name__ == "BasicTransformerBlock")
        assert len(fused) == 4 * blocks and blocks > 0  # norm1, norm2, norm3 and the GEGLU of each block
        report = rocm_sd.report(pipe)["unet"]
        assert report[f"RocmLayerNorm writes {fmt}"] == 3 * blocks and report[f"RocmGEGLU writes {fmt}"] == blocks
        dispatch.reset_stats()
        with_fusion = run_pipe(pipe)
        stats = dispatch.stats()
        assert stats["geglu_quantize_rows"]["torch"] > 0 and stats["add_layer_norm_quantize_rows"]["torch"] > 0
        quantizing = stats["quantize_rows"]["torch"]
        for module in fused:
            module.quantized_output = None
        dispatch.reset_stats()
        without = run_pipe(pipe)
        assert dispatch.stats()["quantize_rows"]["torch"] > quantizing
    assert torch.equal(with_fusion, without)
    for module in fused:
        module.quantized_output = fmt
    rocm_sd.revert(pipe)
    assert all("quantized_output" not in vars(m) for m in producers)


@pytest.mark.parametrize("fmt", ["e4m3fn", "int8"])
def test_the_feed_forward_hands_the_geglu_rows_to_the_8bit_layer_without_y(monkeypatch, fmt):
    """Once the feed-forward's output layer runs 8-bit for good, its GEGLU writes only the quantized rows
    (geglu_quantized) and the layer multiplies them: the operands of the unfused path, so the same images; a layer
    gone back to fp16 takes the usual path; revert() restores diffusers' forward."""
    monkeypatch.setattr(precision, "number_format", lambda device, p: (fmt, None))
    pipe = models.build_sd_pipeline("tiny", "cpu", torch.float32)
    feed_forwards = [m for m in pipe.unet.modules() if type(m).__name__ == "FeedForward"]
    with config.override(log_fallbacks=False):
        rocm_sd.optimize(pipe, precision="fp8" if fmt != "int8" else "int8", channels_last=False,
                         precision_layers="all", precision_scales="row")
        assert rocm_sd.report(pipe)["unet"][f"feed-forward: GEGLU writes only {fmt} rows"] == len(feed_forwards) > 0
        dispatch.reset_stats()
        handed_over = run_pipe(pipe)
        stats = dispatch.stats()
        assert stats["geglu_quantized"]["torch"] > 0 and "geglu_quantize_rows" not in stats
        for ff in feed_forwards:
            ff.net[0].quantized_output = None  # as when the output layer went back to fp16: diffusers' forward
        dispatch.reset_stats()
        usual = run_pipe(pipe)
        assert "geglu_quantized" not in dispatch.stats()
    assert torch.equal(handed_over, usual)
    rocm_sd.revert(pipe)
    assert all("forward" not in vars(ff) for ff in feed_forwards)


@pytest.mark.parametrize("fmt", ["e4m3fn", "int8"])
def test_norms_write_only_the_rows_their_8bit_consumers_take(monkeypatch, fmt):
    """A transformer block's norms whose every consumer multiplies their quantized rows for good write only those rows
    (layer_norm_quantized / add_layer_norm_quantized) and hand a stand-in on: the same operands, so the same images.
    A hook on one consumer (something else may read the output) makes its norm write the output again."""
    monkeypatch.setattr(precision, "number_format", lambda device, p: (fmt, None))
    pipe = models.build_sd_pipeline("tiny", "cpu", torch.float32)
    blocks = [m for m in pipe.unet.modules() if type(m).__name__ == "BasicTransformerBlock"]
    with config.override(log_fallbacks=False):
        rocm_sd.optimize(pipe, precision="fp8" if fmt != "int8" else "int8", channels_last=False,
                         precision_layers="all", precision_scales="row")
        dispatch.reset_stats()
        rows_only = run_pipe(pipe)
        stats = dispatch.stats()
        assert stats["layer_norm_quantized"]["torch"] == stats["add_layer_norm_quantized"]["torch"] / 2 > 0
        assert "layer_norm_quantize_rows" not in stats and "add_layer_norm_quantize_rows" not in stats
        hooks = [block.attn1.to_qkv.register_forward_pre_hook(lambda module, args: None) for block in blocks]
        hooks += [block.ff.net[0].proj.register_forward_pre_hook(lambda module, args: None) for block in blocks]
        dispatch.reset_stats()
        written = run_pipe(pipe)
        stats = dispatch.stats()
        assert "layer_norm_quantized" not in stats and stats["layer_norm_quantize_rows"]["torch"] > 0  # norm1
        # norm2 (cross-attention's query only) still writes only rows; norm3 (the hooked feed-forward) writes its output
        assert stats["add_layer_norm_quantized"]["torch"] == stats["add_layer_norm_quantize_rows"]["torch"] > 0
        for hook in hooks:
            hook.remove()
    assert torch.equal(rows_only, written)
    rocm_sd.revert(pipe)


def test_a_stand_in_is_never_read_as_an_output():
    """A stand-in (a norm's output it did not write) read by anything but an 8-bit layer that finds its rows fails
    loudly: it is on the meta device, and an 8-bit layer finding no rows on it says so."""
    from rocm_sd.modules.quantized_linear import rows_stand_in
    q, scale = quantize_rows_ref(torch.randn(6, 16), "e4m3fn")
    stand_in = rows_stand_in(torch.Size((2, 3, 16)), torch.float32, "e4m3fn", q, scale)
    layer = RocmQuantizedLinear.from_module(nn.Linear(16, 8), "e4m3fn")
    torch.testing.assert_close(layer(stand_in).reshape(6, 8).double(),
                               dequantize_rows(q, scale).double() @ dequantize_rows(
                                   layer.weight_q, layer.weight_scale.squeeze(0)).double().t() + layer.bias.double())
    with pytest.raises(RuntimeError):
        nn.Linear(16, 8)(stand_in) + torch.zeros(8)
    with pytest.raises(RuntimeError, match="stand-in .* without its int8 rows"):
        RocmQuantizedLinear.from_module(nn.Linear(16, 8), "int8")(stand_in)


def test_the_feed_forward_waits_for_the_measured_choice(monkeypatch):
    """With precision_layers="measured" the output layer decides at its first call, so that call takes the usual path
    (its GEGLU writes y too, which the fp16 layer would read); later calls hand the rows over."""
    monkeypatch.setattr(precision, "number_format", lambda device, p: ("e4m3fn", None))
    pipe = models.build_sd_pipeline("tiny", "cpu", torch.float32)
    with config.override(log_fallbacks=False):
        rocm_sd.optimize(pipe, precision="fp8", channels_last=False, cuda_graph=False)
        out_layers = [m.net[2] for m in pipe.unet.modules() if type(m).__name__ == "FeedForward"]
        assert out_layers and not any(layer.runs_8bit for layer in out_layers)
        dispatch.reset_stats()
        run_pipe(pipe, steps=2)  # two UNet calls
        assert all(layer.runs_8bit for layer in out_layers)  # nothing measured: 8-bit for good
        stats = dispatch.stats()
        assert stats["geglu_quantize_rows"]["torch"] == len(out_layers)  # the first call
        assert stats["geglu_quantized"]["torch"] == len(out_layers)  # the second
        # and so do the norms: their output written at the first call, their rows alone at the second
        assert stats["add_layer_norm_quantize_rows"]["torch"] == stats["add_layer_norm_quantized"]["torch"] == 2 * len(
            out_layers)
    rocm_sd.revert(pipe)


class _Database:
    """The tuning database as the dispatcher asks it (dispatch.use_tuning's interface), answering `answer(key)` for the
    `problem`'s keys (linear_8bit or conv_8bit; keeping every key asked) and nothing for the others."""

    def __init__(self, answer, problem: str = "linear_8bit"):
        self.answer, self.asked, self.prefix = answer, [], problem + "|"

    def tuned_choice(self, device, key_fn):
        key = key_fn()
        if not key.startswith(self.prefix):
            return None
        self.asked.append(key)
        return self.answer(key)

    def chose_anywhere(self, device, op, backend, variants_only=False):
        return False


def _shape(key: str) -> dict[str, str]:
    """'linear_8bit|float16|e4m3fn|K=64,N=32,shared=1,input=rows|M=128' -> {'K': '64', ..., 'M': '128'}."""
    return dict(part.split("=") for part in re.split(r"[,|]", key.split("|", 3)[3]))


def test_layers_go_back_to_fp16_where_the_database_measured_it_faster(monkeypatch):
    """precision_layers="measured" (the default): at its first call each 8-bit layer asks the database about its shape
    (rows, features, how many layers share its quantized input); where the answer is torch it runs its original layer
    from then on, the norm in front stops writing quantized output, and the report counts it. Later calls ask
    nothing, run the same, and revert() restores the model exactly."""
    monkeypatch.setattr(precision, "number_format", lambda device, p: ("e4m3fn", None))
    database = _Database(lambda key: dispatch.TORCH if _shape(key)["shared"] == "3" else None)
    monkeypatch.setattr(dispatch, "_tuning", database)
    pipe = models.build_sd_pipeline("tiny", "cpu", torch.float32)
    before = {k: v.clone() for k, v in pipe.unet.state_dict().items()}
    reference = run_pipe(pipe)
    originals = {name: m for name, m in pipe.unet.named_modules()
                 if name.endswith(("attn1.to_q", "attn1.to_k", "attn1.to_v"))}
    with config.override(log_fallbacks=False):
        rocm_sd.optimize(pipe, precision="fp8", channels_last=False, fuse_qkv=False)
        first = run_pipe(pipe)
        layers = {name: m for name, m in pipe.unet.named_modules() if isinstance(m, RocmQuantizedLinear)}
        kept = {name for name, m in layers.items() if m.fp16_layer is not None}
        assert kept == set(originals) and len(kept) >= 3
        assert all(layers[name].fp16_layer is originals[name] and layers[name].weight_q is None for name in kept)
        norms = {name: m for name, m in pipe.unet.named_modules()
                 if "transformer_blocks" in name and name.endswith(("norm1", "norm2"))}
        assert norms and all((m.quantized_output is None) == name.endswith("norm1") for name, m in norms.items())
        asked = len(database.asked)
        assert asked == len(layers)  # each layer once, at its first call
        blocks = len(kept) // 3
        assert {_shape(key)["shared"] for key in database.asked} == {"1", "3", str(2 * blocks)}  # 2: the text's K, V
        assert {_shape(key)["input"] for key in database.asked} == {"rows", "norm-tensor", "geglu-tensor"}
        report = rocm_sd.report(pipe)["unet"]
        assert report["linear kept in float32 (measured faster than e4m3fn)"] == 3 * blocks
        assert report["linear -> e4m3fn GEMM"] + report["conv1x1 -> e4m3fn GEMM"] == len(layers) - 3 * blocks
        second = run_pipe(pipe)
        assert len(database.asked) == asked
    assert torch.equal(first, second) and not torch.equal(first, reference)
    rocm_sd.revert(pipe)
    after = pipe.unet.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    assert torch.equal(run_pipe(pipe), reference)


def test_the_tuner_records_every_problem_the_layers_ask(monkeypatch):
    """The tuner's recording (an all-8-bit run in inference mode, as its harvest) holds every key the measured layers
    later look up, with the pipeline run outside inference mode (one quantization of the text embedding for every
    cross-attention key and value) or inside it (each of those layers quantizes it alone: shared=1)."""
    from rocm_sd.tune import linear_8bit

    monkeypatch.setattr(precision, "number_format", lambda device, p: ("e4m3fn", None))
    pipe = models.build_sd_pipeline("tiny", "cpu", torch.float32)
    with config.override(log_fallbacks=False):
        rocm_sd.optimize(pipe, precision="fp8", precision_layers="all", channels_last=False, fuse_qkv=False)
        with linear_8bit.recording(pipe.unet) as calls, torch.inference_mode():  # as the tuner's harvest runs
            run_pipe(pipe)
        recorded = {call.key for call in calls}
        rocm_sd.revert(pipe)
        text_sharers = {}
        for mode in (torch.no_grad, torch.inference_mode):
            database = _Database(lambda key: None)
            monkeypatch.setattr(dispatch, "_tuning", database)
            rocm_sd.optimize(pipe, precision="fp8", channels_last=False, fuse_qkv=False)
            with mode():
                run_pipe(pipe)
            assert database.asked and set(database.asked) <= recorded, set(database.asked) - recorded
            rocm_sd.revert(pipe)
            text_rows = 2 * models.prompt_kwargs(pipe, "a")["prompt_embeds"].shape[1]  # the text embedding, with CFG
            text = [_shape(key) for key in database.asked if _shape(key)["M"] == str(text_rows)]
            text_sharers[mode] = {s["shared"] for s in text}
    blocks = sum(type(m).__name__ == "BasicTransformerBlock" for m in pipe.unet.modules())
    assert text_sharers == {torch.no_grad: {str(2 * blocks)}, torch.inference_mode: {"1"}}


def test_an_empty_first_call_leaves_the_choice_to_the_next(monkeypatch):
    database = _Database(lambda key: dispatch.TORCH)
    monkeypatch.setattr(dispatch, "_tuning", database)
    original = nn.Linear(16, 32)
    layer = RocmQuantizedLinear.from_module(original, "e4m3fn")
    layer.offer_fp16(original, [], Counter())
    with config.override(log_fallbacks=False):
        assert layer(torch.randn(0, 16)).shape == (0, 32) and database.asked == []
        x = torch.randn(4, 16)
        assert torch.equal(layer(x), original(x)) and layer.fp16_layer is original
    assert database.asked == ["linear_8bit|float32|e4m3fn|K=16,N=32,shared=1,input=rows|M=4"]


@pytest.mark.parametrize("answer, layers_option", [("e4m3fn", "measured"), (None, "measured"), ("torch", "all")])
def test_layers_stay_8bit_unless_measured_slower(monkeypatch, answer, layers_option):
    """The database choosing the 8-bit GEMM, knowing nothing of the shape, or precision_layers="all" (never asked):
    every layer stays 8-bit."""
    monkeypatch.setattr(precision, "number_format", lambda device, p: ("e4m3fn", None))
    database = _Database(lambda key: answer)
    monkeypatch.setattr(dispatch, "_tuning", database)
    pipe = models.build_sd_pipeline("tiny", "cpu", torch.float32)
    with config.override(log_fallbacks=False):
        rocm_sd.optimize(pipe, precision="fp8", channels_last=False, precision_layers=layers_option)
        run_pipe(pipe)
    layers = [m for m in pipe.unet.modules() if isinstance(m, RocmQuantizedLinear)]
    assert layers and all(m.fp16_layer is None and m.weight_q is not None for m in layers)
    assert (len(database.asked) == len(layers)) == (layers_option == "measured")
    assert all(key.startswith("linear_8bit|float32|e4m3fn|K=") for key in database.asked)
    rocm_sd.revert(pipe)


def test_resnet_convolutions_become_fp8_gemms_where_measured_faster_and_revert_restores(monkeypatch):
    """precision="fp8" replaces both 3x3 convolutions of every resnet (their input is a GroupNorm's, bounded) and
    nothing else; at the first call each asks the database about its shape and, where it says torch, runs its
    original from then on; precision_convs=False leaves them all; revert() restores the model exactly."""
    from rocm_sd.modules.quantized_conv import RocmQuantizedConv2d

    monkeypatch.setattr(precision, "number_format", lambda device, p: ("e4m3fn", None))
    database = _Database(lambda key: dispatch.TORCH if "C=32,N=32," in key else None, problem="conv_8bit")
    monkeypatch.setattr(dispatch, "_tuning", database)
    pipe = models.build_sd_pipeline("tiny", "cpu", torch.float32)
    before = {k: v.clone() for k, v in pipe.unet.state_dict().items()}
    reference = run_pipe(pipe)
    resnets = [m for m in pipe.unet.modules() if type(m).__name__ == "ResnetBlock2D"]
    with config.override(log_fallbacks=False):
        rocm_sd.optimize(pipe, precision="fp8", precision_convs=False)
        assert not any(isinstance(m, RocmQuantizedConv2d) for m in pipe.unet.modules())
        rocm_sd.revert(pipe)
        dispatch.reset_stats()
        rocm_sd.optimize(pipe, precision="fp8")
        convs = {name: m for name, m in pipe.unet.named_modules() if isinstance(m, RocmQuantizedConv2d)}
        assert len(convs) == 2 * len(resnets) and all(name.endswith(("conv1", "conv2")) for name in convs)
        out = run_pipe(pipe)
        kept = {name for name, m in convs.items() if m.fp16_layer is not None}
        assert kept and kept == {name for name, m in convs.items() if (m.in_channels, m.out_channels) == (32, 32)}
        assert len(database.asked) == len(convs)
        assert dispatch.stats()["im2col_quantize"]["torch"] > 0
        report = rocm_sd.report(pipe)["unet"]
        assert report["conv3x3 kept in float32 (measured faster than e4m3fn)"] == len(kept)
        assert report["conv3x3 -> e4m3fn GEMM"] == len(convs) - len(kept)
    # The tiny random UNet carries FP8's rounding through its steps (0.28 here), so this only says the images changed
    # and stayed finite: the layer's accuracy (tap order, bias) is held in tests/ops/test_im2col_quantize.py.
    assert torch.isfinite(out).all() and 0 < (out - reference).abs().max() / reference.abs().max() < 0.5
    rocm_sd.revert(pipe)
    after = pipe.unet.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    assert torch.equal(run_pipe(pipe), reference)


# ------------------------------------------------------------------------------------------- GPU

@pytest.mark.gpu
@pytest.mark.parametrize("precision_name", ["fp8", "int8"])
def test_precision_on_the_gpu_runs_the_kernel_and_the_8bit_gemm(precision_name):
    pipe = models.build_sd_pipeline("tiny", "cuda", torch.float16)
    reference = run_pipe(pipe).float()
    with config.override(strict=True):
        dispatch.reset_stats()
        rocm_sd.optimize(pipe, precision=precision_name, precision_layers="all")
        report = rocm_sd.report(pipe)["unet"]
        assert any("GEMM" in key for key in report), report
        attentions = [m for m in pipe.unet.modules() if getattr(m, "fused_projections", False)]
        parked = [p for attn in attentions for name in ("to_q", "to_k", "to_v")[0 if hasattr(attn, "to_qkv") else 1:]
                  for p in getattr(attn, name).parameters()]
        assert attentions and all(p.device.type == "cpu" for p in parked)  # the projections the fused ones replaced
        quantized = run_pipe(pipe).float()
        assert dispatch.stats()["quantize_rows"].get("rocm_sd", 0) > 0
        assert "torch" not in dispatch.stats()["quantize_rows"]
    assert torch.isfinite(quantized).all()
    error = (quantized - reference).abs().max() / reference.abs().max()
    assert 0 < error < 0.3, error  # a sanity bound, as on the CPU (the fused q, k, v weight takes one scale: 0.27)
    rocm_sd.revert(pipe)
    assert all(p.is_cuda for p in parked)
    assert torch.equal(run_pipe(pipe).float(), reference)


@pytest.mark.gpu
def test_measured_choice_settles_before_the_graph_is_captured(monkeypatch):
    """The layers decide in the graphed UNet's warm-up calls: the captured graph runs the fp16 originals where the
    database said torch (their 8-bit weights freed), every later call replays it, and nothing falls back."""
    database = _Database(lambda key: dispatch.TORCH if _shape(key)["shared"] == "3" else None)
    monkeypatch.setattr(dispatch, "_tuning", database)
    pipe = models.build_sd_pipeline("tiny", "cuda", torch.float16)
    reference = run_pipe(pipe).float()
    with config.override(strict=True):
        rocm_sd.optimize(pipe, precision="fp8", fuse_qkv=False)  # q, k and v: three layers sharing one input
        first = run_pipe(pipe).float()
        second = run_pipe(pipe).float()
        report = rocm_sd.report(pipe)["unet"]
    layers = [m for m in pipe.unet.modules() if isinstance(m, RocmQuantizedLinear)]
    kept = [m for m in layers if m.fp16_layer is not None]
    assert kept and len(kept) < len(layers) and all(m.weight_q is None for m in kept)
    assert all(m.fp16_layer.weight.is_cuda for m in kept)
    assert len(database.asked) == len(layers)
    assert report["forward: graph captures"] >= 1 and report["forward: graph replays"] > report["forward: graph captures"]
    assert not any(key.startswith("forward: eager") for key in report), report
    assert torch.isfinite(first).all() and torch.allclose(first, second, rtol=1e-3, atol=1e-3)
    error = (first - reference).abs().max() / reference.abs().max()
    assert 0 < error < 0.25, error
    rocm_sd.revert(pipe)
    assert torch.equal(run_pipe(pipe).float(), reference)


@pytest.mark.gpu
@pytest.mark.parametrize("precision_name", ["fp8", "int8"])
@pytest.mark.parametrize("k", [320, 1280, 5120])
def test_the_8bit_gemm_on_the_gpu_is_the_product_of_the_quantized_operands(precision_name, k):
    """The GPU's GEMM (fp8 with fast accumulation on NVIDIA) against the float64 product of the same quantized operands:
    what it adds must stay well below what quantizing the operands costs (a few percent for e4m3)."""
    fmt, why_not = precision.number_format(torch.device("cuda"), precision_name)
    assert fmt is not None and why_not is None, why_not
    torch.manual_seed(0)
    linear = nn.Linear(k, 640).cuda().half()
    x = torch.randn(2048, k, device="cuda", dtype=torch.float16)
    layer = RocmQuantizedLinear.from_module(linear, fmt).cuda()
    with config.override(strict=True):
        new_model_call()
        out = layer(x)
    reference = _reference(layer, x)
    error = ((out.double() - reference).norm() / reference.norm()).item()
    largest = ((out.double() - reference).abs().max() / reference.abs().max()).item()
    print(f"{precision_name} K={k}: normwise {error:.2e}, largest {largest:.2e}")
    assert error < 2e-3 and largest < 5e-3, (error, largest)
