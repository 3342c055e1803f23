"""precision_scales="tensor": the bounds the LayerNorms and the GEGLU quantize their outputs with (patch/precision.py),
and the per-tensor 8-bit layers that take them (modules/quantized_linear.py)."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import rocm_sd
from rocm_sd import config, models
from rocm_sd.modules import RocmGEGLU, RocmLayerNorm
from rocm_sd.modules import quantized_linear
from rocm_sd.modules.quantized_linear import RocmQuantizedLinear, linear_8bit, quantize_weight
from rocm_sd.ops.quantize import dequantize_rows, quantize_rows_ref
from rocm_sd.patch import precision
from tests.test_optimize import run_pipe


def _norm(c: int, affine: bool = True, bias_scale: float = 0.3) -> RocmLayerNorm:
    torch.manual_seed(c)
    norm = nn.LayerNorm(c, elementwise_affine=affine)
    if affine:
        with torch.no_grad():
            norm.weight.copy_(torch.randn(c) * 2)
            norm.bias.copy_(torch.randn(c) * bias_scale)
    return RocmLayerNorm.from_layer_norm(norm)


def _adversarial_rows(c: int) -> torch.Tensor:
    """Rows whose normalized values reach the most there is: one channel far from all the others (at every channel),
    and Gaussian rows with outliers."""
    one_hot = torch.eye(c, dtype=torch.float64) * 1e4
    gaussian = torch.randn(64, c, dtype=torch.float64)
    gaussian[:, :3] *= 50
    return torch.cat([one_hot, gaussian])


@pytest.mark.parametrize("c", [320, 1280])
@pytest.mark.parametrize("affine", [True, False])
def test_no_layer_norm_output_exceeds_its_bound_and_the_bound_is_reached(c, affine):
    norm = _norm(c, affine, bias_scale=0.0)
    bound = precision.layer_norm_bound(norm)
    weight = None if norm.weight is None else norm.weight.double()
    bias = None if norm.bias is None else norm.bias.double()
    y = F.layer_norm(_adversarial_rows(c), (c,), weight, bias, norm.eps)
    assert y.abs().max() <= bound
    # the one-hot row at the channel of the largest gain reaches sqrt(C - 1) max|gain|: the bound is not loose
    assert y.abs().max() >= bound / precision.BOUND_MARGIN * 0.999


def test_the_bound_counts_the_bias():
    norm = _norm(320, bias_scale=5.0)
    y = F.layer_norm(_adversarial_rows(320), (320,), norm.weight.double(), norm.bias.double(), norm.eps)
    assert y.abs().max() <= precision.layer_norm_bound(norm)


def _geglu(c: int, d: int, quantized: str | None) -> RocmGEGLU:
    torch.manual_seed(d)
    proj = nn.Linear(c, 2 * d)
    with torch.no_grad():
        proj.weight.mul_(3)
        proj.bias.normal_(0, 2)
    if quantized:
        proj = RocmQuantizedLinear.from_module(proj, quantized)
    return RocmGEGLU(proj)


@pytest.mark.parametrize("quantized", [None, "e4m3fn"])
def test_no_geglu_output_exceeds_its_bound(quantized):
    """Rows of the norm's output pointed along each value and gate weight row (where Cauchy-Schwarz is tight) and
    random rows: the GEGLU's outputs stay within geglu_bound."""
    c, d = 320, 1280
    norm, geglu = _norm(c), _geglu(c, d, quantized)
    bound = precision.geglu_bound(geglu, norm)
    weight, bias = precision._linear_weight(geglu.proj)
    value, gate = weight.double().chunk(2)
    length = precision._layer_norm_row_norm(norm)
    directions = torch.cat([value[:64], gate[:64], value[:64] / value[:64].norm(dim=1, keepdim=True)
                            + gate[:64] / gate[:64].norm(dim=1, keepdim=True), torch.randn(64, c, dtype=torch.float64)])
    rows = directions / directions.norm(dim=1, keepdim=True) * length
    a, g = (rows @ weight.double().t() + bias.double()).chunk(2, dim=-1)
    out = a * F.gelu(g)
    assert out.abs().max() <= bound
    # and through the real norm: its outputs are such rows
    x = torch.randn(256, c) * 4
    with config.override(log_fallbacks=False):
        y = geglu(norm(x))
    assert y.abs().max() <= bound


def test_per_tensor_operands_multiply_as_their_dequantized_values():
    """linear_8bit off a GPU with a per-tensor input scale (0-dim) and weight scale ((1, 1)), and mixed with per-row
    ones: the product of the dequantized operands."""
    torch.manual_seed(0)
    x, weight, bias = torch.randn(32, 64), torch.randn(48, 64), torch.randn(48)
    q_rows, scale_rows = quantize_rows_ref(x, "e4m3fn")
    q_tensor, scale_tensor = quantize_rows_ref(x, "e4m3fn", bound=x.abs().max().item())
    scale_tensor = scale_tensor[0]
    for per_tensor_weight in (False, True):
        weight_q, weight_scale = quantize_weight(weight, "e4m3fn", per_tensor=per_tensor_weight)
        assert weight_scale.shape == ((1, 1) if per_tensor_weight else (1, 48))
        w = dequantize_rows(weight_q, weight_scale.expand(1, 48).squeeze(0)).double()
        for q, scale in ((q_rows, scale_rows), (q_tensor, scale_tensor)):
            out = linear_8bit(q, scale, weight_q, weight_scale, bias, "e4m3fn", torch.float32)
            want = (q.double() * (scale.double() if scale.dim() == 0 else scale.double().unsqueeze(1))) @ w.t()
            assert torch.allclose(out.double(), want + bias.double(), rtol=1e-5, atol=1e-4)


def _patched(monkeypatch, scales: str):
    monkeypatch.setattr(precision, "number_format", lambda device, p: ("e4m3fn", None))
    pipe = models.build_sd_pipeline("tiny", "cpu", torch.float32)
    rocm_sd.optimize(pipe, precision="fp8", channels_last=False, precision_layers="all", precision_scales=scales)
    return pipe


def test_tensor_scales_reach_the_layers_and_revert_removes_them(monkeypatch):
    """Every LayerNorm of the blocks and every GEGLU writes one scale; the layers after them hold one weight scale and
    take the per-tensor product; the layers with no bounded producer (attention outputs, the text's K / V, proj_in /
    proj_out, the 1x1 convolutions) stay per row. The images stay as close to fp32's as the per-row ones."""
    with config.override(log_fallbacks=False):
        reference = run_pipe(models.build_sd_pipeline("tiny", "cpu", torch.float32))
        per_row = run_pipe(_patched(monkeypatch, "row"))
        pipe = _patched(monkeypatch, "tensor")
        blocks = sum(1 for m in pipe.unet.modules() if type(m).__name__ == "BasicTransformerBlock")
        producers = [m for m in pipe.unet.modules() if isinstance(m, (RocmLayerNorm, RocmGEGLU))]
        bounded = [m for m in producers if m.quantized_bound > 0]
        assert len(bounded) == 4 * blocks > 0
        report = rocm_sd.report(pipe)["unet"]
        assert report["RocmLayerNorm writes e4m3fn, one scale per tensor"] == 3 * blocks
        assert report["RocmGEGLU writes e4m3fn, one scale per tensor"] == blocks
        layers = [m for m in pipe.unet.modules() if isinstance(m, RocmQuantizedLinear)]
        tensor = [m for m in layers if m.weight_scale.numel() == 1]
        assert all(m.input_quantizer.endswith("-tensor") for m in tensor)
        assert all(not m.input_quantizer.endswith("-tensor") for m in layers if m not in tensor)
        assert len(tensor) == 4 * blocks  # q k v (fused), cross-attention's q, the GEGLU's projection, the output layer

        products = []
        original = quantized_linear.linear_8bit

        def spy(q, scale, weight_q, weight_scale, *args):
            products.append(scale.dim() == 0 and weight_scale.numel() == 1)
            return original(q, scale, weight_q, weight_scale, *args)

        monkeypatch.setattr(quantized_linear, "linear_8bit", spy)
        per_tensor = run_pipe(pipe)
        monkeypatch.setattr(quantized_linear, "linear_8bit", original)
        # each call of those layers is per tensor: once a step each (run_pipe's two steps); the text's keys and values
        # (per row) are projected once per prompt (text_kv), so the calls are not spread evenly over the layers
        assert sum(products) == 2 * len(tensor)
    error = lambda image: (image - reference).norm() / reference.norm()  # noqa: E731
    assert torch.isfinite(per_tensor).all() and 0 < error(per_tensor) < max(2 * error(per_row), 0.02)
    rocm_sd.revert(pipe)
    assert all("quantized_bound" not in vars(m) for m in producers)
    assert torch.equal(run_pipe(pipe), reference)


def test_int8_and_row_scales_keep_scales_per_row(monkeypatch):
    with config.override(log_fallbacks=False):
        pipe = _patched(monkeypatch, "row")
        assert all(m.quantized_bound == 0 for m in pipe.unet.modules() if isinstance(m, (RocmLayerNorm, RocmGEGLU)))
        monkeypatch.setattr(precision, "number_format", lambda device, p: ("int8", None))
        pipe = models.build_sd_pipeline("tiny", "cpu", torch.float32)
        rocm_sd.optimize(pipe, precision="int8", channels_last=False)
        layers = [m for m in pipe.unet.modules() if isinstance(m, RocmQuantizedLinear)]
        assert layers and all(m.weight_scale.numel() == m.out_features for m in layers)
    with pytest.raises(ValueError, match="precision_scales"):
        rocm_sd.optimize(models.build_sd_pipeline("tiny", "cpu", torch.float32), precision="fp8",
                         precision_scales="channel")


def test_bounds_are_finite_for_the_models_blocks():
    pipe = models.build_sd_pipeline("tiny", "cpu", torch.float32)
    rocm_sd.optimize(pipe, channels_last=False)
    blocks = [m for m in pipe.unet.modules() if type(m).__name__ == "BasicTransformerBlock"]
    bounds = precision._bounds(blocks)
    assert len(bounds) == 4 * len(blocks) and all(math.isfinite(b) and b > 0 for b in bounds.values())


@pytest.mark.parametrize("shape", [(1000, 64), (3, 5), (4, 8)])
def test_a_per_tensor_weight_is_quantized_as_one_row(shape):
    """quantize_weight(per_tensor=True) quantizes a block of rows at a time (its peak memory) with the tensor's max:
    the codes and scale of the whole weight quantized as one row, an all-zero weight included."""
    weight = torch.randn(*shape, dtype=torch.float16) * 3 if shape != (4, 8) else torch.zeros(shape)
    q, scale = quantize_weight(weight, "e4m3fn", per_tensor=True)
    q_whole, scale_whole = quantize_rows_ref(weight.reshape(1, -1), "e4m3fn")
    assert torch.equal(q.float(), q_whole.view(shape).float()) and torch.equal(scale, scale_whole.view(1, 1))
