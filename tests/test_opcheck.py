"""Every rocm_sd op passes torch.library.opcheck (schema, fake kernel, dispatch) and works under
torch.compile(fullgraph=True)."""
import pytest
import torch

from rocm_sd import config, dispatch

CASES = {
    "group_norm": lambda device, dtype, cl: (
        (torch.randn(2, 64, 8, 8, device=device, dtype=dtype).to(
            memory_format=torch.channels_last if cl else torch.contiguous_format),
         32, torch.rand(64, device=device, dtype=dtype), torch.randn(64, device=device, dtype=dtype), 1e-5, True)),
    # geglu has one layout; the `cl` variant is an odd half-width (vector width 1 in the kernel).
    "geglu": lambda device, dtype, cl: (torch.randn(2, 16, 2 * (7 if cl else 64), device=device, dtype=dtype),),
    "layer_norm": lambda device, dtype, cl: (torch.randn(2, 8, 33 if cl else 320, device=device, dtype=dtype),
                                             torch.rand(33 if cl else 320, device=device, dtype=dtype),
                                             torch.randn(33 if cl else 320, device=device, dtype=dtype), 1e-5),
    "add_layer_norm": lambda device, dtype, cl: (torch.randn(2, 8, 33 if cl else 320, device=device, dtype=dtype),
                                                 torch.randn(2, 8, 33 if cl else 320, device=device, dtype=dtype),
                                                 torch.rand(33 if cl else 320, device=device, dtype=dtype),
                                                 torch.randn(33 if cl else 320, device=device, dtype=dtype), 1e-5),
    "parity_shuffle": lambda device, dtype, cl: (
        torch.randn(2, 4 * (3 if cl else 16), 5, 6, device=device, dtype=dtype).contiguous(memory_format=torch.channels_last),
        torch.randn(3 if cl else 16, device=device, dtype=dtype)),
    # attention: separate q, k, v; the `cl` variant is a packed QKV projection's per-head views.
    "attention": lambda device, dtype, cl: (
        tuple(torch.randn(2, 16, 3, 2, 64, device=device, dtype=dtype).unbind(2)) if cl else
        (torch.randn(2, 16, 2, 40, device=device, dtype=dtype), torch.randn(2, 9, 2, 40, device=device, dtype=dtype),
         torch.randn(2, 9, 2, 40, device=device, dtype=dtype))) + (0.125,),
    "bias_residual": lambda device, dtype, cl: tuple(
        t.to(memory_format=torch.channels_last if cl and t.dim() == 4 else torch.contiguous_format) if t.dim() == 4 else t
        for t in (torch.randn(2, 64, 8, 8, device=device, dtype=dtype), torch.randn(2, 64, 8, 8, device=device, dtype=dtype),
                  torch.randn(64, device=device, dtype=dtype))) + (0.5,),
    # the ops that host CK fusions, on their default paths: the `cl` variant has an odd K / NCHW activations
    "linear_geglu": lambda device, dtype, cl: (torch.randn(2, 8, 33 if cl else 64, device=device, dtype=dtype),
                                               torch.randn(48, 33 if cl else 64, device=device, dtype=dtype),
                                               torch.randn(48, device=device, dtype=dtype)),
    "conv_bias_residual": lambda device, dtype, cl: tuple(
        t.contiguous(memory_format=torch.contiguous_format if cl else torch.channels_last)
        for t in (torch.randn(2, 16, 8, 8, device=device, dtype=dtype), torch.randn(24, 16, 3, 3, device=device,
                                                                                    dtype=dtype))) + (
        torch.randn(24, device=device, dtype=dtype),
        torch.randn(2, 24, 8, 8, device=device, dtype=dtype).contiguous(
            memory_format=torch.contiguous_format if cl else torch.channels_last), 0.5, 1, 1),
}


def run_opcheck(device, dtype):
    for name, make in CASES.items():
        op = getattr(torch.ops.rocm_sd, name).default
        for cl in (False, True):
            torch.library.opcheck(op, make(device, dtype, cl))


def test_opcheck_cpu():
    with config.override(log_fallbacks=False):
        run_opcheck("cpu", torch.float32)


def test_compile_fullgraph_cpu():
    x, g, w, b, eps, silu = CASES["group_norm"]("cpu", torch.float32, True)
    fn = torch.compile(lambda x: torch.ops.rocm_sd.group_norm(x, g, w, b, eps, silu) * 2, fullgraph=True,
                       backend="eager")
    with config.override(log_fallbacks=False):
        assert torch.equal(fn(x), torch.ops.rocm_sd.group_norm(x, g, w, b, eps, silu) * 2)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_opcheck_gpu(dtype):
    # attention's kernel runs where tuned: forced here so that opcheck exercises it, not SDPA
    with config.override(strict=True), dispatch.force_backend("attention", "rocm_sd"):
        run_opcheck("cuda", dtype)


@pytest.mark.gpu
def test_compile_fullgraph_gpu():
    x, g, w, b, eps, silu = CASES["group_norm"]("cuda", torch.float16, True)
    with config.override(strict=True):
        fn = torch.compile(lambda x: torch.ops.rocm_sd.group_norm(x, g, w, b, eps, silu) * 2, fullgraph=True)
        assert torch.equal(fn(x), torch.ops.rocm_sd.group_norm(x, g, w, b, eps, silu) * 2)


# ---- `.call`: the op without torch's dispatcher where nothing needs it (ops._common.custom_op) ------------

class _Recorder:
    """Stands in for an op's dispatcher entry (CustomOpDef calls its `_opoverload`): counts, then forwards."""

    def __init__(self, overload):
        self.overload, self.calls = overload, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.overload(*args, **kwargs)

    def __getattr__(self, name):  # _schema and the like, which torch reads from the overload
        return getattr(self.overload, name)


def _recorders(monkeypatch):
    from rocm_sd import ops

    recorders = {}
    for name in CASES:
        op = ops.ALL_OPS[name]
        recorders[name] = _Recorder(op._opoverload)
        monkeypatch.setattr(op, "_opoverload", recorders[name])
    return ops.ALL_OPS, recorders


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b)) if isinstance(a, tuple) else torch.equal(a, b)


def run_direct_calls(device, dtype, monkeypatch):
    all_ops, recorders = _recorders(monkeypatch)
    for name, make in CASES.items():
        for cl in (False, True):
            args = make(device, dtype, cl)
            with torch.inference_mode():
                direct = all_ops[name].call(*args)
            assert recorders[name].calls == 0, name  # no dispatcher ...
            with torch.inference_mode():
                assert _same(direct, all_ops[name](*args)), name  # ... and the op's result to the bit
            assert dispatch.stats()[name] and recorders[name].calls == 1
            recorders[name].calls = 0


def test_call_runs_the_op_without_the_dispatcher_cpu(monkeypatch):
    with config.override(log_fallbacks=False):
        run_direct_calls("cpu", torch.float32, monkeypatch)


def test_call_takes_the_dispatcher_where_something_needs_it(monkeypatch):
    from torch.profiler import profile
    from torch.utils._python_dispatch import TorchDispatchMode

    all_ops, recorders = _recorders(monkeypatch)
    op, calls = all_ops["layer_norm"], lambda: recorders["layer_norm"].calls
    x, w, b, eps = CASES["layer_norm"]("cpu", torch.float32, False)

    class Seen(TorchDispatchMode):  # what the tuner's harvest and FakeTensorMode are
        names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(str(func))
            return func(*args, **(kwargs or {}))

    with config.override(log_fallbacks=False):
        op.call(x, w, b, eps)  # autograd on
        assert calls() == 1
        with torch.no_grad(), Seen():
            op.call(x, w, b, eps)
        assert calls() == 2 and "rocm_sd.layer_norm.default" in Seen.names
        with torch.no_grad(), profile() as prof:
            op.call(x, w, b, eps)
        assert calls() == 3 and any(e.name == "rocm_sd::layer_norm" for e in prof.events())
        compiled = torch.compile(lambda x: op.call(x, w, b, eps) * 2, fullgraph=True, backend="eager")
        with torch.no_grad():
            assert torch.equal(compiled(x), op.call(x, w, b, eps) * 2)
        assert calls() >= 4  # traced through the op (the direct call after it adds none)
        # a backward through a forward-only kernel must fail loudly, never give silently no gradient
        w_grad = w.clone().requires_grad_()
        with pytest.raises(RuntimeError):
            op.call(x, w_grad, b, eps).sum().backward()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_call_runs_the_op_without_the_dispatcher_gpu(dtype, monkeypatch):
    with config.override(strict=True), dispatch.force_backend("attention", "rocm_sd"):
        run_direct_calls("cuda", dtype, monkeypatch)
