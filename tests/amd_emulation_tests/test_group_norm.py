"""group_norm under the emulation: the automatic choice (hip/group_norm/group_norm.hip), the resident kernels
(group_norm_resident.hip, group_norm_resident_nhwc.hip) with blocks that wait for each other, and the split path
(group_norm_split.hip), in NCHW and NHWC."""

import ctypes

import pytest
import torch

from rocm_sd.ops._common import DTYPE_CODES, NCHW, NHWC, within_tolerance
from rocm_sd.ops.group_norm import PATHS, group_norm_ref
from tests.amd_emulation_tests.emulated import ARCHS, MARKS, library, pointer, run
from tests.ops.test_group_norm import make_inputs

pytestmark = MARKS

LIBRARIES = {"emulated": ["group_norm", "group_norm_resident", "group_norm_resident_nhwc", "group_norm_split"]}
EPS = 1e-6


@pytest.fixture(scope="module", params=ARCHS)
def emulated(request):
    """(arch, the emulated group_norm library: every path)."""
    i64, i32 = ctypes.c_int64, ctypes.c_int
    lib = library(request.param, LIBRARIES["emulated"],
                  rsd_emu_group_norm=[ctypes.c_void_p] * 4 + [i32] * 3 + [i64] * 3 + [i32, ctypes.c_float, i32, i32,
                                                                                       ctypes.c_void_p],
                  rsd_emu_group_norm_describe=[ctypes.c_void_p] * 2 + [i32] * 2 + [i64] * 3 + [i32] * 2)
    lib.rsd_emu_device_l2_bytes.restype = ctypes.c_int
    return request.param, lib


f32, f16, bf16 = torch.float32, torch.float16, torch.bfloat16
# (shape, groups, dtype, channels_last, path, the plan group_norm_describe must report, extras): each case takes
# one path of the kernels on the emulated device (4 multiprocessors x 2 resident blocks: the resident paths hold
# exchanges of up to 4 blocks), with odd channels a group, spatial sizes that leave partial vectors, chunks or
# waves, and batch 3. Extras: silu, input_bias (the (N, C) bias added before normalising), fp32 parameters of a
# 16-bit input, no affine parameters.
CASES = [
    # NCHW, a group in one block: the resident kernel without exchange; scalar loads (7 x 9)
    ((3, 96, 7, 9), 32, f16, False, "auto", "resident vec=1 blocks_per_group=1", {"silu", "input_bias"}),
    # NCHW resident, each group of 5 x 45 x 41 fp32 values in 3 blocks that take tickets and exchange partials
    ((3, 20, 45, 41), 4, f32, False, "resident", "resident vec=1 blocks_per_group=3", {"input_bias"}),
    # the same with 16-bit sums (one shift a block), pairs of bf16, a partial last chunk, fp32 parameters
    ((3, 18, 34, 31), 1, bf16, False, "resident", "resident vec=2 blocks_per_group=3", {"silu", "fp32_params"}),
    # NCHW groups of several blocks: split, 3 chunks a group merged by the finalize launch
    ((3, 20, 45, 41), 1, f16, False, "auto", "split vec=1", {"silu", "no_affine"}),
    # split with groups of one block: the stats launch writes mean and rstd itself, no finalize
    ((2, 36, 5, 5), 4, bf16, False, "split", "split vec=1", {"silu"}),
    # a tensor larger than the emulated L2: the split path applies plane by plane
    ((1, 8, 363, 363), 2, f32, False, "auto", "split vec=1", {"silu", "large"}),
    # NHWC, an image in one block: 96 threads a pixel row, 2 rows
    ((3, 96, 7, 9), 32, f16, True, "auto", "resident vec=1 blocks_per_image=1", {"silu", "input_bias"}),
    # NHWC, 15 channels: blocks of 255 threads, the last wave partial (the fp64 merge takes whole waves only)
    ((3, 15, 6, 7), 5, f32, True, "auto", "resident vec=1 blocks_per_image=1", set()),
    # NHWC resident, 3 blocks an image exchanging partials and per-group owners; 9 blocks in all take tickets
    ((3, 36, 15, 19), 2, f32, True, "resident", "resident vec=2 blocks_per_image=3", {"silu", "input_bias"}),
    # one image of 3 blocks, few enough to be named by blockIdx (no tickets); the last block holds 1 row
    ((1, 36, 15, 19), 2, bf16, True, "resident", "resident vec=2 blocks_per_image=3", set()),
    # NHWC split, 2 channels a group: each 4-wide vector spans two groups
    ((2, 64, 5, 7), 32, f16, True, "split", "split vec=4", {"silu", "fp32_params"}),
    # NHWC rows of 520 threads: the split kernels' 1024-thread instantiation (too wide to be resident)
    ((1, 520, 3, 3), 8, f32, True, "auto", "split vec=1", set()),
]


def _double(t):
    return None if t is None else t.double()


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-g{c[1]}-{str(c[2])[6:]}-{'nhwc' if c[3] else 'nchw'}-"
                                                      f"{c[4]}")
def test_group_norm(emulated, case):
    arch, lib = emulated
    shape, groups, dtype, channels_last, path, plan, extras = case
    x, _, w, b = make_inputs(shape, groups, dtype, "cpu", channels_last, f32 if "fp32_params" in extras else None,
                             affine="no_affine" not in extras)
    n, c = shape[:2]
    hw = x.numel() // (n * c)
    input_bias = (torch.randn(n, c) * 3).to(dtype) if "input_bias" in extras else None  # conv bias + time embedding
    silu = "silu" in extras
    y = torch.full_like(x, float("nan"))  # poisoned: every element must be written
    layout = NHWC if channels_last else NCHW
    described = lib.rsd_emu_group_norm_describe(pointer(x), pointer(y), DTYPE_CODES[dtype], layout, n, c, hw, groups,
                                                PATHS[path]).decode()
    assert described == plan, f"{arch}: the case no longer takes the path it is meant to test"
    if "large" in extras:
        assert x.numel() * x.element_size() > lib.rsd_emu_device_l2_bytes(), "plane-wise apply needs more than L2"
    params = w if w is not None else b
    run(lib.rsd_emu_group_norm, pointer(x), pointer(y), pointer(w), pointer(b), DTYPE_CODES[dtype],
        DTYPE_CODES[params.dtype if params is not None else dtype], layout, n, c, hw, groups, EPS, silu, PATHS[path],
        pointer(input_bias))
    truth = group_norm_ref(x.double(), groups, _double(w), _double(b), EPS, silu, _double(input_bias))
    same = group_norm_ref(x, groups, None if w is None else w.to(dtype), None if b is None else b.to(dtype), EPS, silu,
                          input_bias)
    ok, err, allowed = within_tolerance(y, truth, same)
    assert ok, f"{arch} {case}: max err {err:.3g} > allowed {allowed:.3g}"
