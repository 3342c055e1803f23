"""modules/joint_rows.py: two streams' projections written into one joint tensor, and output projections reading a
stream's rows of the joint attention output in place, against torch.cat and the layers' own forwards."""
import pytest
import torch
from torch import nn

from rocm_sd.modules import joint_rows
from rocm_sd.modules.joint_rows import joint_linear, joint_qkv, linear_rows
from rocm_sd.modules.quantized_linear import RocmQuantizedLinear, _aligned, rows_stand_in
from rocm_sd.ops.quantize import quantize_rows_ref


def _layers(k=16, n=24, bias=True, seed=0):
    torch.manual_seed(seed)
    return nn.Linear(k, n, bias=bias), nn.Linear(k, n, bias=bias)


def _close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("batch", [1, 2, 3])
@pytest.mark.parametrize("bias", [True, False])
def test_joint_linear_is_the_concatenation(batch, bias):
    first, second = _layers(bias=bias)
    x1, x2 = torch.randn(batch, 7, 16), torch.randn(batch, 5, 16)
    with torch.no_grad():
        joint = joint_linear(first, x1, second, x2)
        _close(joint, torch.cat([first(x1), second(x2)], dim=1))
    assert joint.shape == (batch, 12, 24) and joint.is_contiguous()


def test_joint_linear_runs_a_hooked_layer_by_its_own_forward():
    first, second = _layers()
    second.register_forward_hook(lambda module, args, out: out * 2)  # what only the layer's own call does
    x1, x2 = torch.randn(2, 3, 16), torch.randn(2, 4, 16)
    with torch.no_grad():
        _close(joint_linear(first, x1, second, x2), torch.cat([first(x1), 2 * second.forward(x2)], dim=1))


def test_joint_linear_keeps_autograd():
    first, second = _layers()
    x1, x2 = torch.randn(1, 3, 16, requires_grad=True), torch.randn(1, 4, 16)
    joint_linear(first, x1, second, x2).sum().backward()
    assert x1.grad is not None and first.weight.grad is not None and second.weight.grad is not None


def test_joint_linear_of_8bit_layers_and_a_stand_in():
    """8-bit layers write their rows in place, one of them from a producer's rows (a meta stand-in), the other
    quantizing its input itself."""
    first, second = _layers()
    q1, q2 = (RocmQuantizedLinear.from_module(layer, "e4m3fn") for layer in (first, second))
    x1, x2 = torch.randn(2, 3, 16), torch.randn(2, 5, 16)
    rows_q, rows_scale = quantize_rows_ref(x1.reshape(-1, 16), "e4m3fn")
    stand_in = rows_stand_in(x1.shape, x1.dtype, "e4m3fn", rows_q, rows_scale)
    with torch.no_grad():
        joint = joint_linear(q1, stand_in, q2, x2)
        _close(joint, torch.cat([q1(x1), q2(x2)], dim=1))
    assert joint.device.type == "cpu"


@pytest.mark.parametrize("host_path", [False, True])
def test_joint_linear_of_a_hosts_8bit_copies(host_path):
    """A host's layers copied as 8-bit ones (ComfyUI's) write their rows in place too, one from a producer's rows (a
    stand-in); where the host takes a call itself (weights it casts per call) the copy is not run in place."""
    from rocm_sd.modules.host_copies import quantized_linear_copy

    first, second = _layers()
    c1, c2 = (quantized_linear_copy(layer, "e4m3fn", lambda module: host_path) for layer in (first, second))
    x1, x2 = torch.randn(2, 3, 16), torch.randn(2, 5, 16)
    with torch.no_grad():
        assert (joint_rows._runs_in_place(c1, x1, joint_rows.plain_torch_linear) is None) == host_path
        if host_path:
            _close(joint_linear(c1, x1, c2, x2), torch.cat([first(x1), second(x2)], dim=1))
            return
        rows_q, rows_scale = quantize_rows_ref(x1.reshape(-1, 16), "e4m3fn")
        stand_in = rows_stand_in(x1.shape, x1.dtype, "e4m3fn", rows_q, rows_scale)
        joint = joint_linear(c1, stand_in, c2, x2)
        _close(joint, torch.cat([c1(x1), c2(x2)], dim=1))
        assert c1(stand_in).device.type == "cpu"  # its own forward takes the stand-in's rows too


@pytest.mark.parametrize("batch", [1, 2])
def test_linear_rows_reads_a_streams_part_of_the_joint_output(batch):
    layer, _ = _layers()
    joint = torch.randn(batch, 9, 16)
    for rows in (joint[:, :6], joint[:, 6:]):
        assert not rows.is_contiguous() or batch == 1
        with torch.no_grad():
            _close(linear_rows(layer, rows), layer(rows.contiguous()))


def test_linear_rows_of_other_views_and_layers_is_their_forward():
    layer, _ = _layers()
    x = torch.randn(2, 16, 5).transpose(1, 2)  # rows not contiguous: the layer's own forward
    with torch.no_grad():
        _close(linear_rows(layer, x), layer(x))
        hooked, _ = _layers(seed=1)
        hooked.register_forward_hook(lambda module, args, out: out + 1)
        view = torch.randn(2, 8, 16)[:, :4]
        _close(linear_rows(hooked, view), hooked.forward(view) + 1)


def _qkv_reference(first, x1, second, x2):
    (q1, k1, v1), (q2, k2, v2) = (layer(x).chunk(3, dim=-1) for layer, x in ((first, x1), (second, x2)))
    return (q1, q2), (k1, k2), torch.cat([v1, v2], dim=1)


@pytest.mark.parametrize("hooked", [False, True])
def test_joint_qkv_is_the_streams_q_k_and_the_joint_v(hooked, monkeypatch):
    """In place (plain layers: Q, K, V of one joint tensor) and not (hooked layers: each stream's own projection,
    V alone joined, never the whole QKV concatenated)."""
    first, second = _layers(n=24)
    if hooked:
        for layer in (first, second):
            layer.register_forward_hook(lambda module, args, out: out * 2)
    cats = []
    real_cat = torch.cat
    monkeypatch.setattr(joint_rows.torch, "cat", lambda tensors, dim=0: cats.append(tensors[0].shape) or
                        real_cat(tensors, dim=dim))
    x1, x2 = torch.randn(2, 3, 16), torch.randn(2, 5, 16)
    with torch.no_grad():
        got = joint_qkv(first, x1, second, x2)
        monkeypatch.setattr(joint_rows.torch, "cat", real_cat)
        want = _qkv_reference(first, x1, second, x2)
    for g, w in zip(got[:2], want[:2]):
        _close(g[0], w[0])
        _close(g[1], w[1])
    _close(got[2], want[2])
    assert all(shape[-1] == 8 for shape in cats), f"a concatenation wider than V: {cats}"
    if not hooked:
        assert got[2]._base is not None and got[0][1]._base is got[2]._base  # one joint tensor


def test_row_scales_are_aligned_for_the_8bit_gemm():
    scales = torch.rand(2 * 333)
    second_batch = scales[333:].unsqueeze(1)
    assert second_batch.data_ptr() % 16 != 0
    aligned = _aligned(second_batch)
    assert aligned.data_ptr() % 16 == 0 and aligned.is_contiguous() and torch.equal(aligned, second_batch)
    first_batch = scales[:333].unsqueeze(1)
    assert _aligned(first_batch) is first_batch
