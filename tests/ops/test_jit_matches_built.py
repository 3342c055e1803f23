"""On a GPU that _C has code for: the runtime-compiled backend (rocm_sd/jit/) gives bit-identical results to _C for
every op it covers, on the ops' samples and on shapes where the plan's choices differ (vector width, vectors a
lane, a residual, GroupNorm's paths), in every dtype. Same source, same instance, same grid: the same bits. A JIT
plan that picked another vector width would change the order of LayerNorm's sums and show here
(rocm_sd/jit/plans.py). The whole GPU suite runs on the JIT with ROCM_SD_KERNELS=jit (docs/building.md)."""
import inspect
import re

import pytest
import torch

from rocm_sd import _ext
from rocm_sd.jit.backend import COVERED, JitBackend
from rocm_sd.ops import REGISTRY

pytestmark = pytest.mark.gpu
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@pytest.fixture(scope="module")
def backends():
    device = torch.device("cuda")
    if _ext.BUILT is None or _ext.BUILT.check_kernel_image(torch.cuda.current_device()):
        pytest.skip("needs _C with code for this GPU, to compare against")
    jit = JitBackend()
    why = jit.unavailable_reason()
    if why:
        pytest.fail(why)
    return device, _ext.BUILT, jit


def bits(t: torch.Tensor) -> torch.Tensor:
    """The bytes of t (NaN payloads and fp8 codes compare as bits)."""
    return t.contiguous().flatten().view(torch.uint8)


def run_on(backend, monkeypatch, kernel, args, kwargs=None):
    monkeypatch.setattr(_ext, "_C", backend)
    out = kernel(*args, **(kwargs or {}))
    torch.cuda.synchronize()
    return out if isinstance(out, tuple) else (out,)


def _group_norm_cases(r, device, dtype):
    """GroupNorm where its plans differ: NCHW groups of one block (resident) and of many (split: chunks, and planes
    for a tensor larger than L2), vector width 1; NHWC images of one block (resident) and of many (split), vectors
    spanning two groups (C = 128 in 32 groups, 16-bit); the resident path forced with an exchange between blocks
    (occupancy, zeroed counters), an input bias, float32 params, no SiLU. (args, kernel keyword arguments)."""
    def case(shape, groups=32, channels_last=False, silu=True, params=None, **kwargs):
        x = r(*shape).to(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
        c = shape[1]
        weight = torch.rand(c, device=device, dtype=params or dtype) + 0.5
        bias = torch.randn(c, device=device, dtype=params or dtype)
        if kwargs.pop("input_bias", False):
            kwargs["input_bias"] = r(shape[0], c)
        return (x, groups, weight, bias, 1e-5, silu), kwargs

    return [case((2, 1280, 8, 8)), case((2, 320, 64, 64)), case((1, 256, 512, 512)), case((3, 96, 7, 9)),
            case((2, 64, 4, 4), channels_last=True), case((2, 320, 64, 64), channels_last=True),
            case((1, 128, 64, 64), channels_last=True), case((2, 320, 32, 32), path="resident"),
            case((2, 640, 16, 16), channels_last=True, path="resident"), case((2, 640, 16, 16), input_bias=True),
            case((2, 320, 16, 16), channels_last=True, input_bias=True, silu=False),
            case((2, 320, 16, 16), channels_last=True, params=torch.float32)]


def extra_cases(op, device, dtype):
    """Shapes beyond the samples where the plans choose differently: odd widths (vector width 1), rows of 77,
    LayerNorm widths needing 1..16 vectors a lane, GroupNorm's paths. A case is the kernel's arguments, or
    (arguments, keyword arguments of the kernel)."""
    r = lambda *shape: torch.randn(*shape, device=device, dtype=dtype)  # noqa: E731
    if op == "group_norm":
        return _group_norm_cases(r, device, dtype)
    if op == "layer_norm":
        return [(r(3, 77, c), r(c), r(c), 1e-5) for c in (7, 320, 768, 1280, 2048, 4096)]
    if op == "add_layer_norm":
        return [(r(2, 77, c), r(2, 77, c), r(c), r(c), 1e-5) for c in (5, 320, 1280)]
    if op in ("ada_layer_norm", "add_ada_layer_norm"):  # one wave a row, row groups of 3-16 waves, scalar params
        def args(b, tokens, c, transposed=False):
            x = r(b, tokens, c)
            shift, scale, gate = (r(c, b).t() for _ in range(3)) if transposed else r(b, 6 * c).chunk(6, dim=1)[:3]
            return (x, scale, shift, 1e-6) if op == "ada_layer_norm" else (x, r(b, tokens, c), gate, scale, shift, 1e-6)
        return [args(2, 77, c) for c in (7, 320, 1536, 2432, 3072)] + [args(2, 5, 4096, transposed=True)]
    if op == "geglu":
        return [(r(2, 77, 2 * d),) for d in (3, 320, 1280)]
    if op == "bias_residual":
        return [(r(2, c, 9, 7), r(2, c, 9, 7), r(c), 0.5) for c in (3, 320)]
    if op == "rms_norm":  # rows in registers and read twice, scalar and 8-wide vectors, lead rows and rope
        angles = torch.randn(84, 64, device=device).repeat_interleave(2, dim=1)
        return [(r(1, 9, 1, 4096), r(4096), 1e-6), (r(2, 77, 3, 33), None, 1e-6, r(2, 7, 3, 33), r(33)),
                (r(2, 77, 3 * 3 * 128)[..., :384].unflatten(-1, (3, 128)), r(128), 1e-6, r(2, 7, 3, 128), r(128),
                 angles.cos(), angles.sin())]
    if op == "quantize_rows":
        return [(r(77, k), fmt) for k in (5, 320) for fmt in ("int8",)]
    return []


@pytest.mark.parametrize("op", COVERED)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_jit_is_bitwise_the_built_kernel(op, dtype, backends, monkeypatch):
    device, built, jit = backends
    spec = REGISTRY[op]
    cases = spec.samples(device, dtype) + extra_cases(op, device, dtype)
    compared, refused = 0, []
    supports_keywords = inspect.signature(spec.supports).parameters
    for case in cases:
        args, kwargs = case if len(case) == 2 and isinstance(case[1], dict) else (case, {})
        reasons = spec.supports(*args, **{k: v for k, v in kwargs.items() if k in supports_keywords})
        if reasons:  # a dtype the op does not take (attention: float32); anything else fails below
            refused += reasons
            continue
        try:
            reference = run_on(built, monkeypatch, spec.kernel, args, kwargs)
        except RuntimeError as error:  # a forced path this GPU cannot hold (GroupNorm's resident): the JIT says so too
            if "cannot hold" not in str(error):
                raise
            with pytest.raises(RuntimeError, match=re.escape(str(error))):
                run_on(jit, monkeypatch, spec.kernel, args, kwargs)
            continue
        ours = run_on(jit, monkeypatch, spec.kernel, args, kwargs)
        for a, b in zip(reference, ours, strict=True):
            assert a.shape == b.shape and a.dtype == b.dtype and a.stride() == b.stride()
            assert torch.equal(bits(a), bits(b)), \
                f"{op} {dtype}: JIT differs from _C for shapes {[tuple(t.shape) for t in args if torch.is_tensor(t)]}"
        compared += 1
    if not compared and refused and all("float32" in r for r in refused):
        pytest.skip(f"{op} takes no {dtype}: {refused[0]}")
    assert compared, f"{op} {dtype}: nothing compared: {refused[:3]}"
