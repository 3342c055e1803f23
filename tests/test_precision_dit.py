"""optimize(precision="fp8" | "int8") on the diffusion transformers (SD3 / SD3.5 MMDiT, Flux): patch/precision_dit.py
and the fused forwards' 8-bit paths (modules/mmdit.py). On the CPU the device check is answered (a CPU has no 8-bit
GEMMs; the layers compute the same product from the dequantized operands); on a GPU strictly."""
import pytest
import torch
from torch import nn

import rocm_sd
from rocm_sd import bench, config, dispatch, models
from rocm_sd.modules.quantized_linear import (RocmQuantizedLinear, RocmQuantizedSplitLinear, eight_bit,
                                               forward_8bit_blocks, forward_8bit_parts)
from rocm_sd.ops.quantize import dequantize_rows, quantize_rows_ref
from rocm_sd.patch import precision
from rocm_sd.patch.diffusers import fused_away
from rocm_sd.patch.pipeline import skipped_options
from tests.test_dit import generate
from tests.test_precision import _Database, _shape

# The blocks' layers that become 8-bit, by their names in the block (fuse_qkv on: 8-bit's default), per tiny model.
SD3_JOINT = {"attn.to_qkv", "attn.to_added_qkv", "attn.to_out.0", "ff.net.0.proj", "ff.net.2"}
EXPECTED = {
    "tiny-sd3": {  # block 0 has SD3.5's second attention; block 1, the last, keeps no text stream after attention
        "transformer_blocks.0": SD3_JOINT | {"attn.to_add_out", "ff_context.net.0.proj", "ff_context.net.2",
                                             "attn2.to_qkv", "attn2.to_out.0"},
        "transformer_blocks.1": SD3_JOINT},
    "tiny-flux": {
        **{f"transformer_blocks.{i}": SD3_JOINT | {"attn.to_add_out", "ff_context.net.0.proj", "ff_context.net.2"}
           for i in range(2)},
        **{f"single_transformer_blocks.{i}": {"attn.to_qkv", "proj_mlp", "proj_out.first", "proj_out.second"}
           for i in range(2)}},
}


@pytest.fixture
def fp8_here(monkeypatch):
    monkeypatch.setattr(precision, "number_format", lambda device, p: ("e4m3fn" if p == "fp8" else "int8", None))


def _eight_bit(model) -> dict[str, nn.Module]:
    return {name: m for name, m in model.named_modules() if isinstance(m, RocmQuantizedLinear)}


def _error(out: torch.Tensor, reference: torch.Tensor) -> float:
    return ((out - reference).abs().max() / reference.abs().max()).item()


@pytest.mark.parametrize("arch, precision_name", [("tiny-sd3", "fp8"), ("tiny-flux", "fp8"), ("tiny-flux", "int8")])
def test_the_blocks_linears_become_8bit_and_revert_restores(fp8_here, arch, precision_name):
    """Every attention projection and feed-forward linear of the blocks (Flux's single blocks' proj_mlp and proj_out
    too, proj_out split into its two column blocks) is 8-bit; the AdaLN modulation, the embedders and the model's
    proj_out are not; the fused blocks still run fused; the images stay close; revert() restores the model exactly."""
    pipe = models.build_sd_pipeline(arch, "cpu", torch.float32)
    before = {k: v.clone() for k, v in pipe.transformer.state_dict().items()}
    reference = generate(pipe)
    with config.override(log_fallbacks=False):
        dispatch.reset_stats()
        rocm_sd.optimize(pipe, precision=precision_name)
        report = rocm_sd.report(pipe)["transformer"]
        out = generate(pipe)
    layers = _eight_bit(pipe.transformer)
    expected = {f"{block}.{name}" for block, names in EXPECTED[arch].items() for name in names}
    assert set(layers) == expected, set(layers) ^ expected
    fmt = "e4m3fn" if precision_name == "fp8" else "int8"
    assert report[f"linear -> {fmt} GEMM"] == len(expected)
    fused = {"tiny-sd3": ["MMDiT block fused"], "tiny-flux": ["Flux double block fused", "Flux single block fused"]}
    assert all(report[what] == 2 for what in fused[arch]), report
    assert report.get(f"single block proj_out as two {fmt} GEMMs", 0) == (2 if arch == "tiny-flux" else 0)
    unused = {m for attn in pipe.transformer.modules() for m in fused_away(attn)}  # fuse_qkv's, parked
    plain = [name for name, m in pipe.transformer.named_modules() if type(m) is nn.Linear and m not in unused]
    assert plain and all(name.startswith(("time_text_embed", "context_embedder", "x_embedder", "norm_out", "proj_out"))
                         or ".norm" in name for name in plain), plain
    assert dispatch.stats()["quantize_rows"]["torch"] > 0
    assert 0 < _error(out, reference) < 0.1  # e4m3: 0.003-0.01 here; int8 less
    rocm_sd.revert(pipe)
    after = pipe.transformer.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    assert not _eight_bit(pipe.transformer) and torch.equal(generate(pipe), reference)


def _concatenated(self, x):
    raise AssertionError("the fused single block built the concatenation for proj_out")


def test_no_call_reads_the_replaced_weights(fp8_here, monkeypatch):
    """The fused forwards (the single block's split proj_out, the GELU projection's epilogue, fused QKV) multiply the
    8-bit layers, never the fp16 weights they replaced nor the projections fused QKV replaced: with all of those
    turned to NaN the images do not change. The single blocks stay fused: proj_out's halves take the attention and
    MLP outputs as they are, never their concatenation (diffusers' forward)."""
    monkeypatch.setattr(RocmQuantizedSplitLinear, "forward", _concatenated)
    pipe = models.build_sd_pipeline("tiny-flux", "cpu", torch.float32)
    linears = [m for m in pipe.transformer.modules() if type(m) is nn.Linear]
    with config.override(log_fallbacks=False):
        rocm_sd.optimize(pipe, precision="fp8", precision_layers="all")
        out = generate(pipe)
        in_model = list(pipe.transformer.modules())
        unused = [m for attn in in_model for m in fused_away(attn)]  # beside fuse_qkv's projections, parked
        replaced = [m for m in linears if not any(m is k for k in in_model)] + unused
        assert len(unused) == 3 * 2 * 2 + 3 * 2 and len(replaced) > len(unused)  # q, k, v (and the text's) per block
        kept = [m.weight.clone() for m in replaced]
        for m in replaced:
            m.weight.data.fill_(float("nan"))
        assert torch.equal(generate(pipe), out)
    for m, weight in zip(replaced, kept):
        m.weight.data.copy_(weight)
    rocm_sd.revert(pipe)


def test_the_split_proj_out_is_the_8bit_layer_of_the_concatenation():
    """Its halves dequantize to the original's weight columns (one scale per output channel over the whole row), and
    its output is the float64 product of each input's own row quantization with them: no concatenation built."""
    linear = nn.Linear(160, 32)
    first, second = torch.randn(2, 7, 32), torch.randn(2, 7, 128)
    split = RocmQuantizedSplitLinear(linear, 32, "e4m3fn")
    whole = RocmQuantizedLinear.from_module(linear, "e4m3fn")
    w = dequantize_rows(whole.weight_q, whole.weight_scale.squeeze(0))
    assert torch.equal(torch.cat([dequantize_rows(h.weight_q, h.weight_scale.squeeze(0))
                                  for h in (split.first, split.second)], dim=1), w)
    assert split.first.bias is not None and split.second.bias is None
    with config.override(log_fallbacks=False):
        out = split.forward_parts(first, second)
        assert torch.allclose(split(torch.cat([first, second], -1)), out, rtol=1e-6, atol=1e-6)
    truth = linear.bias.double()
    for x, h in ((first, split.first), (second, split.second)):
        q, scale = quantize_rows_ref(x.reshape(-1, x.shape[-1]), "e4m3fn")
        truth = truth + dequantize_rows(q, scale).double() @ dequantize_rows(h.weight_q, h.weight_scale[0]).double().t()
    torch.testing.assert_close(out.reshape(-1, 32).double(), truth, rtol=1e-5, atol=1e-5)
    halves = split.originals(linear)
    x = torch.cat([first, second], -1)
    assert torch.allclose(halves[0](first) + halves[1](second), linear(x), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="split at 160 is not inside 160 features"):
        RocmQuantizedSplitLinear(linear, 160, "e4m3fn")


@pytest.mark.parametrize("fmt", ["e4m3fn", "int8"])
def test_blocks_of_an_8bit_gemm_are_views_that_compute_the_layer(fmt):
    """EightBit.output_block / input_block (ComfyUI's Flux single blocks: linear1's qkv and MLP outputs, linear2's
    [attention, MLP] inputs): views of the one 8-bit weight, the bias with the first block only; the output blocks'
    products are the layer's, the input blocks' sum is the float64 product of each part's own row quantization; a block
    off the GEMMs' 16-element boundaries is refused."""
    linear = nn.Linear(160, 48)
    layer = RocmQuantizedLinear.from_module(linear, fmt)
    way = eight_bit(layer)
    x = torch.randn(2, 7, 160)
    with config.override(log_fallbacks=False):
        outputs = way.output_block(0, 16), way.output_block(16, 48)
        assert all(b.weight_q.untyped_storage().data_ptr() == way.weight_q.untyped_storage().data_ptr()
                   for b in outputs)
        assert outputs[1].weight_q.storage_offset() == 16 * 160 and torch.equal(outputs[1].bias, layer.bias[16:])
        qkv, rest = forward_8bit_blocks(x, list(outputs))
        torch.testing.assert_close(torch.cat([qkv, rest], -1), layer(x), rtol=1e-6, atol=1e-6)
        inputs = way.input_block(0, 32), way.input_block(32, 160)
        assert inputs[1].weight_q.storage_offset() == 32 and inputs[1].weight_q.stride() == (160, 1)
        assert inputs[0].bias is layer.bias and inputs[1].bias is None
        first, second = x[..., :32].contiguous(), x[..., 32:].contiguous()
        out = forward_8bit_parts([first, second], list(inputs))
    truth = linear.bias.double()
    w = dequantize_rows(layer.weight_q, layer.weight_scale.squeeze(0)).double()
    for part, columns in ((first, slice(0, 32)), (second, slice(32, 160))):
        q, scale = quantize_rows_ref(part.reshape(-1, part.shape[-1]), fmt)
        truth = truth + dequantize_rows(q, scale).double() @ w[:, columns].t()
    torch.testing.assert_close(out.reshape(-1, 48).double(), truth, rtol=1e-5, atol=1e-5)
    assert way.output_block(0, 8) is None and way.output_block(8, 48) is None and way.output_block(16, 64) is None
    assert way.input_block(8, 160) is None and way.input_block(0, 200) is None


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["e4m3fn", "int8"])
def test_8bit_gemms_take_column_blocks_of_the_weight_in_place(fmt):
    """input_block's weight is a column slice, its leading dimension the whole row: torch._scaled_mm / torch._int_mm
    multiply it as they do a contiguous copy, bit for bit."""
    layer = RocmQuantizedLinear.from_module(nn.Linear(3072 + 1536, 512, device="cuda", dtype=torch.bfloat16), fmt)
    way = eight_bit(layer)
    parts = [torch.randn(64, 3072, device="cuda", dtype=torch.bfloat16),
             torch.randn(64, 1536, device="cuda", dtype=torch.bfloat16)]
    blocks = [way.input_block(0, 3072), way.input_block(3072, 4608)]
    assert not blocks[1].weight_q.is_contiguous()
    copies = [b._replace(weight_q=b.weight_q.contiguous()) for b in blocks]
    dispatch.reset_stats()
    with config.override(strict=True):
        got = forward_8bit_parts(parts, blocks)
        want = forward_8bit_parts(parts, copies)
    assert dispatch.stats()["quantize_rows"].keys() == {"rocm_sd"}
    assert torch.equal(got, want)


def test_layers_go_back_to_the_models_dtype_where_measured_faster(fp8_here, monkeypatch):
    """precision_layers="measured": each layer (each half of a split proj_out too) asks the database at its first call
    with its own shape and how many layers share its input (q, k, v and proj_mlp in a single block); where it says
    torch, the layer runs its original (a half: its columns of the original), and the images are the unquantized
    ones up to rounding."""
    database = _Database(lambda key: dispatch.TORCH)
    monkeypatch.setattr(dispatch, "_tuning", database)
    pipe = models.build_sd_pipeline("tiny-flux", "cpu", torch.float32)
    reference = generate(pipe)
    with config.override(log_fallbacks=False):
        rocm_sd.optimize(pipe, precision="fp8", fuse_qkv=False)
        out = generate(pipe)
        report = rocm_sd.report(pipe)["transformer"]
    layers = _eight_bit(pipe.transformer)
    assert layers and all(m.fp16_layer is not None and m.weight_q is None for m in layers.values())
    assert len(database.asked) == len(layers)
    single = [_shape(key) for key in database.asked if _shape(key)["shared"] == "4"]  # to_q, to_k, to_v, proj_mlp
    assert len(single) == 4 * 2 and {s["N"] for s in single} == {"32", "128"}
    assert {(s["K"], s["N"]) for s in map(_shape, database.asked)} >= {("32", "32"), ("128", "32")}  # the halves
    assert report["linear kept in float32 (measured faster than e4m3fn)"] == len(layers)
    assert torch.allclose(out, reference, rtol=1e-4, atol=1e-4)
    rocm_sd.revert(pipe)


def test_on_a_cpu_the_transformer_keeps_its_layers_and_says_why():
    pipe = models.build_sd_pipeline("tiny-sd3", "cpu", torch.float32)
    with config.override(log_fallbacks=False):
        skipped = bench.optimize_with_options(pipe, {"precision": "fp8"})
    assert skipped == ["transformer: precision=fp8 not applied: the model is on cpu; 8-bit GEMMs need a GPU"]
    assert not _eight_bit(pipe.transformer)
    rocm_sd.revert(pipe)


def test_bench_adds_an_fp8_row_with_its_psnr_against_rocm_sd(fp8_here, tmp_path):
    rows = bench.run(model="tiny-flux", steps=1, repeats=1, warmup=0, engines=("rocm_sd-fp8",), out_dir=str(tmp_path))
    by_label = {r["label"]: r for r in rows}
    assert set(by_label) == {"rocm_sd", "rocm_sd-fp8"} and not by_label["rocm_sd-fp8"].get("skipped")
    assert 10 < by_label["rocm_sd-fp8"]["psnr_vs_fp16_db"] < 100


# ------------------------------------------------------------------------------------------- GPU

@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["tiny-sd3", "tiny-flux"])
@pytest.mark.parametrize("precision_name", ["fp8", "int8"])
def test_the_transformers_run_8bit_gemms_on_the_gpu(arch, precision_name):
    """bf16 blocks of both transformers (SD3.5's dual attention and Q/K RMSNorm, Flux's double and single blocks),
    graphed, with every layer 8-bit and nothing falling back."""
    pipe = models.build_sd_pipeline(arch, "cuda", torch.bfloat16)
    reference = generate(pipe).float()
    with config.override(strict=True):
        dispatch.reset_stats()
        rocm_sd.optimize(pipe, precision=precision_name, precision_layers="all")
        assert not skipped_options(pipe, {"precision": precision_name})
        first = generate(pipe).float()
        second = generate(pipe).float()
        report = rocm_sd.report(pipe)["transformer"]
        stats = dispatch.stats()
    layers = _eight_bit(pipe.transformer)
    assert layers and all(m.runs_8bit and m.weight_q.is_cuda for m in layers.values())
    assert stats["quantize_rows"].get("rocm_sd", 0) > 0 and "torch" not in stats["quantize_rows"], stats
    assert report["forward: graph replays"] >= 1, report
    assert torch.isfinite(first).all() and torch.allclose(first, second, rtol=1e-3, atol=1e-3)
    assert 0 < _error(first, reference) < 0.1
    rocm_sd.revert(pipe)
    assert torch.equal(generate(pipe).float(), reference)


@pytest.mark.parametrize("arch", ["tiny-sd3", "tiny-flux"])
def test_norms_and_gelus_write_the_8bit_rows_and_change_nothing(fp8_here, arch, monkeypatch):
    """With 8-bit projections the blocks' AdaLN and feed-forward GELU write only their consumers' rows
    (modules/mmdit_8bit.py): the same image bit for bit as the norms' outputs quantized by the consumers, with fewer
    quantize_rows passes."""
    from rocm_sd.modules import mmdit_8bit

    pipe = models.build_sd_pipeline(arch, "cpu", torch.bfloat16)  # the quantized outputs take 16-bit rows
    with config.override(log_fallbacks=False):
        rocm_sd.optimize(pipe, precision="fp8")
        dispatch.reset_stats()
        fused = generate(pipe)
        stats = dispatch.stats()
        for op in ("ada_layer_norm_quantized", "add_ada_layer_norm_quantized", "gelu_tanh_quantized"):
            assert sum(stats.get(op, {}).values()) > 0, (op, stats)
        monkeypatch.setattr(mmdit_8bit, "producers_write_rows", lambda x=None: False)
        dispatch.reset_stats()
        plain = generate(pipe)
        plain_stats = dispatch.stats()
    assert "ada_layer_norm_quantized" not in plain_stats and "gelu_tanh_quantized" not in plain_stats
    assert sum(stats["quantize_rows"].values()) < sum(plain_stats["quantize_rows"].values())
    assert torch.equal(fused, plain)
