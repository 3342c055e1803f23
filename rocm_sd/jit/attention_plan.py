"""The attention launcher of hip/attention/attention.hip in Python (plans.py says why a mirror): its instance
tables (kNarrow, attention_wide.hip's kWide), the checks, the matrix-unit policy per arch, the heuristic that picks
an instance (pick_instance), named instances (find_instance), and the grid. tests/test_jit_plans.py compares it
with the C++."""
from __future__ import annotations

import math
from dataclasses import dataclass

from .plans import Launch, ceil_div
from .sources import ATTENTION_TYPES, DTYPE_NAMES, NARROW_KV_SHAPES, NARROW_SHAPES, WIDE_SHAPES

F32 = 0
MAX_NARROW_DIM = 160
MAX_HEAD_DIM = 512
PADDED_DIMS = (32, 48, 64, 80, 96, 128, 160, 512)
LOG2E = 1.4426950408889634
CODES = {1: "f16", 2: "bf16"}


@dataclass(frozen=True)
class Instance:
    name: str
    dtype: int
    padded_dim: int
    waves: int
    rows: int
    block_n: int
    block_m: int
    wide: bool
    kv_tiles: int = 0  # the "_kv<tiles>" instances' K / V tiles in shared memory (SharedPlan); 0: the family's plan


def _instances() -> tuple[Instance, ...]:
    """kNarrow (RSD_ATTENTION_DIM[_R2] per padded dim: f16 then bf16 per shape), kNarrowKv (RSD_ATTENTION_KV's,
    likewise), then kWide, in the C++ order (all_instances)."""
    out = []
    for dp, shapes in NARROW_SHAPES.items():
        for rows, block_n in sorted(shapes, key=lambda s: (s[0], -s[1])):  # (1, 64), (1, 32), (2, 64), (2, 32)
            for code in (1, 2):
                out.append(Instance(f"{CODES[code]}_d{dp}_w4_r{rows}_n{block_n}", code, dp, 4, rows, block_n,
                                    16 * rows * 4, False))
    for dp, shapes in NARROW_KV_SHAPES.items():
        for rows, block_n, kv in shapes:
            for code in (1, 2):
                out.append(Instance(f"{CODES[code]}_d{dp}_w4_r{rows}_n{block_n}_kv{kv}", code, dp, 4, rows, block_n,
                                    16 * rows * 4, False, kv))
    for dp, shapes in WIDE_SHAPES.items():
        for waves, rows in shapes:
            for code in (1, 2):
                out.append(Instance(f"{CODES[code]}_d{dp}_w{waves}_r{rows}_n16_wide", code, dp, waves, rows, 16,
                                    16 * rows, True))
    return tuple(out)


INSTANCES = _instances()


def matrix_units(platform: str, arch: str) -> str:
    """matrix_units_of: 'unknown', 'none', 'nv', 'cdna', 'rdna3' or 'rdna4' (a CUDA build knows sm_80+ only, a HIP
    build the gfx lists only)."""
    if not arch:
        return "unknown"
    if platform == "cuda":
        return "nv" if arch.startswith("sm_") and arch[3:].isdigit() and int(arch[3:]) >= 80 else "none"
    if arch in ("gfx90a", "gfx940", "gfx941", "gfx942", "gfx950"):
        return "cdna"
    if arch in ("gfx1100", "gfx1101", "gfx1102", "gfx1103", "gfx1150", "gfx1151"):
        return "rdna3"
    return "rdna4" if arch in ("gfx1200", "gfx1201") else "none"


def spills_on(units: str, inst: Instance) -> bool:
    return units == "rdna3" and inst.padded_dim > MAX_NARROW_DIM and inst.waves == 4 and inst.rows > 1


def padded_dim(head_dim: int) -> int:
    return next((dp for dp in PADDED_DIMS if head_dim <= dp), 0)


def pick_instance(dtype: int, head_dim: int, q_len: int, kv_len: int, units: str) -> Instance | None:
    dp = padded_dim(head_dim)
    many_keys = kv_len > 160
    waves, rows = 4, 2 if dp <= 64 and many_keys and q_len >= 2048 else 1
    block_n = 64 if dp <= 96 and many_keys else 32
    if dp > MAX_NARROW_DIM:
        rows, block_n = 2, 16
    for _ in range(2):
        for inst in INSTANCES:
            if (inst.dtype, inst.padded_dim, inst.waves, inst.rows, inst.block_n, inst.kv_tiles) == \
                    (dtype, dp, waves, rows, block_n, 0) and not spills_on(units, inst):
                return inst
        rows = 1
    return None


def find_instance(dtype: int, head_dim: int, q_len: int, kv_len: int, units: str, arch: str,
                  name: str) -> tuple[Instance | None, str]:
    if not name:
        return pick_instance(dtype, head_dim, q_len, kv_len, units), ""
    for inst in INSTANCES:
        if inst.name != name:
            continue
        if inst.dtype != dtype:
            return None, f"instance {name} is for another dtype"
        if inst.padded_dim < head_dim:
            return None, f"instance {name} holds a smaller head dim"
        if spills_on(units, inst):
            return None, f"instance {name} spills registers to scratch on {arch} (bench/results/amd-resources-*.md)"
        return inst, ""
    return None, f"no attention instance named {name}"


def check(q, k, v, out, dtype, sizes, strides, scale, platform: str, arch: str, device: int, instance: str = "") -> str:
    if dtype == F32:
        return "float32 (the matrix-unit kernel takes float16 and bfloat16)"
    batch, heads, q_len, kv_len, head_dim = sizes
    if min(sizes) <= 0:
        return "empty tensor"
    if head_dim % 8:
        return f"head dim {head_dim} is not a multiple of 8"
    if head_dim > MAX_HEAD_DIM:
        return f"head dim {head_dim} > {MAX_HEAD_DIM} (the wide family holds at most 512)"
    if batch > 65535 or heads > 65535:
        return "batch or heads > 65535 (grid limit)"
    if q_len >= 1 << 30 or kv_len >= 1 << 30:
        return "sequence of 2^30 or more"
    scale = _f32(scale)
    if not (scale > 0) or not math.isfinite(scale):
        return "scale is not a positive finite number"
    if any(p % 16 for p in (q, k, v, out)):
        return "a data pointer is not 16-byte aligned"
    if any(s % 8 for triple in strides for s in triple):
        return "batch, sequence or head strides not multiples of 8 elements (16-byte rows)"
    units = matrix_units(platform, arch)
    if units == "unknown":
        return f"the runtime could not describe device {device}"
    if units == "none":
        return f"no matrix-unit attention policy for {arch} (mma sm_80+, MFMA gfx90a/gfx94x/gfx950, WMMA gfx11/gfx12)"
    inst, why = find_instance(dtype, head_dim, q_len, kv_len, units, arch, instance)
    return "" if inst else (why or "no instance for these arguments")


def _f32(x: float) -> float:
    """x rounded to float32 (the C++ holds the scale as a float)."""
    import struct

    return struct.unpack("f", struct.pack("f", x))[0]


def plan(q, k, v, out, dtype, sizes, strides, scale, platform: str, arch: str, wave: int,
         instance: str = "") -> tuple[Launch, Instance]:
    """The launch of a call that check() passed: make_params and launch_instance / launch_wide."""
    batch, heads, q_len, kv_len, head_dim = sizes
    inst, _ = find_instance(dtype, head_dim, q_len, kv_len, matrix_units(platform, arch), arch, instance)
    t = ATTENTION_TYPES[dtype]
    if inst.wide:
        expression = f"rsd::attn::wide_attention_kernel<{t}, {inst.padded_dim}, {inst.waves}, {inst.rows}>"
    else:
        kv = f", {inst.kv_tiles}" if inst.kv_tiles else ""
        expression = f"rsd::attention_kernel<{t}, {inst.padded_dim}, 4, {inst.rows}, {inst.block_n}{kv}>"
    params = (q, k, v, out, *[tuple(s) for s in strides], q_len, kv_len, head_dim, _f32(_f32(scale) * _f32(LOG2E)))
    launch = Launch(f"attention_{DTYPE_NAMES[dtype]}_d{inst.padded_dim}", expression,
                    (ceil_div(q_len, inst.block_m), heads, batch), "a", (params,), block=inst.waves * wave)
    return launch, inst


def describe(launch: Launch, inst: Instance) -> str:
    gx, heads, batch = launch.grid
    return f"{inst.name} grid={gx}x{heads}x{batch}"
