"""Every rocm_sd op passes torch.library.opcheck (schema, fake kernel, dispatch) and works under
torch.compile(fullgraph=True)."""
import pytest
import torch

from rocm_sd import config, dispatch
from rocm_sd.ops import REGISTRY

def cases(device, dtype):
    """(op name, args) for every registered op and each of its sample calls (OpSpec.samples: its layouts)."""
    return [(name, args) for name, spec in REGISTRY.items() for args in spec.samples(device, dtype)]


def run_opcheck(device, dtype):
    for name, args in cases(device, dtype):
        torch.library.opcheck(getattr(torch.ops.rocm_sd, name).default, args)


def test_opcheck_cpu():
    with config.override(log_fallbacks=False):
        run_opcheck("cpu", torch.float32)


def test_compile_fullgraph_cpu():
    x, g, w, b, eps, silu = REGISTRY["group_norm"].samples("cpu", torch.float32)[1]
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
    x, g, w, b, eps, silu = REGISTRY["group_norm"].samples("cuda", torch.float16)[1]
    with config.override(strict=True):
        fn = torch.compile(lambda x: torch.ops.rocm_sd.group_norm(x, g, w, b, eps, silu) * 2, fullgraph=True)
        assert torch.equal(fn(x), torch.ops.rocm_sd.group_norm(x, g, w, b, eps, silu) * 2)


# ---- `.call`: the op without torch's dispatcher where nothing needs it (OpSpec.call) ------------------------

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
    recorders = {}
    for name, spec in REGISTRY.items():
        recorders[name] = _Recorder(spec.op._opoverload)
        monkeypatch.setattr(spec.op, "_opoverload", recorders[name])
    return {name: spec.op for name, spec in REGISTRY.items()}, recorders


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b)) if isinstance(a, tuple) else torch.equal(a, b)


def run_direct_calls(device, dtype, monkeypatch):
    all_ops, recorders = _recorders(monkeypatch)
    for name, args in cases(device, dtype):
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
    x, w, b, eps = REGISTRY["layer_norm"].samples("cpu", torch.float32)[0]

    class Seen(TorchDispatchMode):  # what the tuner's harvest and FakeTensorMode are
        names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(str(func))
            return func(*args, **(kwargs or {}))

    with config.override(log_fallbacks=False):
        op.call(x, w, b, eps)  # autograd on, but nothing requires gradients: no dispatcher needed
        assert calls() == 0
        with torch.no_grad(), Seen():
            op.call(x, w, b, eps)
        assert calls() == 1 and "rocm_sd.layer_norm.default" in Seen.names
        with torch.no_grad(), profile() as prof:
            op.call(x, w, b, eps)
        assert calls() == 2 and any(e.name == "rocm_sd::layer_norm" for e in prof.events())
        compiled = torch.compile(lambda x: op.call(x, w, b, eps) * 2, fullgraph=True, backend="eager")
        with torch.no_grad():
            assert torch.equal(compiled(x), op.call(x, w, b, eps) * 2)
        assert calls() >= 3  # traced through the op (the direct call after it adds none)


def test_calls_that_need_gradients_get_the_gradients_of_the_pytorch_path():
    """The kernels are forward-only: a call that needs gradients takes the op's differentiable PyTorch path (`.call`),
    and through torch's dispatcher the op's registered backward differentiates that path at the saved inputs, so
    both give PyTorch's own gradients (never silently none)."""
    import torch.nn.functional as F

    x, w, b, eps = REGISTRY["layer_norm"].samples("cpu", torch.float64)[0]
    x, w = x.requires_grad_(), w.requires_grad_()
    expected = torch.autograd.grad((F.layer_norm(x, x.shape[-1:], w, b, eps) ** 2).sum(), (x, w))
    spec = REGISTRY["layer_norm"]
    with config.override(log_fallbacks=False):
        for call in (spec.op.call, spec.op, torch.ops.rocm_sd.layer_norm):
            got = torch.autograd.grad((call(x, w, b, eps) ** 2).sum(), (x, w))
            for g, e in zip(got, expected):
                torch.testing.assert_close(g, e)
        x2, res, w2, b2, eps2 = (a.detach().requires_grad_() if isinstance(a, torch.Tensor) else a
                                 for a in REGISTRY["add_layer_norm"].samples("cpu", torch.float64)[0])
        total, y = torch.ops.rocm_sd.add_layer_norm(x2, res, w2, b2, eps2)  # two outputs, both differentiated
        got = torch.autograd.grad(total.sum() + (y ** 2).sum(), (x2, res, w2))
        t = x2 + res
        want = torch.autograd.grad(t.sum() + (F.layer_norm(t, t.shape[-1:], w2, b2, eps2) ** 2).sum(), (x2, res, w2))
        for g, e in zip(got, want):
            torch.testing.assert_close(g, e)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_call_runs_the_op_without_the_dispatcher_gpu(dtype, monkeypatch):
    with config.override(strict=True), dispatch.force_backend("attention", "rocm_sd"):
        run_direct_calls("cuda", dtype, monkeypatch)
