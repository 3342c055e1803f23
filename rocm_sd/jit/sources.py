"""The kernel sources the runtime compiler takes: where they are (shipped in the package as rocm_sd/_hip, or
hip/ of a source checkout), which source file each op's kernels live in, the template instances its launcher
can pick (the same sets the C++ launchers switch over), and a hash of everything a compile reads."""
from __future__ import annotations

import functools
import hashlib
import itertools
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]

# Element types by rsd::DType code (rocm_sd/api.h), spelled as the kernels' template arguments.
TYPES = {0: "float", 1: "__half", 2: "rsd::bf16"}
VECS_BY_TYPE = {"float": (1, 2, 4), "__half": (1, 2, 4, 8), "rsd::bf16": (1, 2, 4, 8)}  # 16-byte accesses at most


def source_root() -> Path | None:
    """hip/ as installed (rocm_sd/_hip, CMake's install of the sources) or in a source checkout; None if absent."""
    for root in (PACKAGE / "_hip", PACKAGE.parent / "hip"):
        if (root / "include" / "rocm_sd" / "compat.h").is_file():
            return root
    return None


@dataclass(frozen=True)
class Unit:
    """One source file compiled at run time, with the name expressions of every kernel instance it provides."""
    name: str
    path: str  # relative to the source root
    expressions: tuple[str, ...]


def _bool(b: bool) -> str:
    return "true" if b else "false"


def _typed_vec(kernel: str, *extra: tuple) -> tuple[str, ...]:
    """`kernel<T, VEC, extra...>` for every element type and vector width (and every combination of `extra`)."""
    out = []
    for t, vecs in VECS_BY_TYPE.items():
        for vec in vecs:
            for rest in itertools.product(*extra):
                out.append(f"rsd::{kernel}<{', '.join([t, str(vec), *rest])}>")
    return tuple(out)


def _layer_norm_units() -> dict[str, "Unit"]:
    """A unit per input type, parameter type and vector width (the C++ launcher's first three choices), each with
    1..16 vectors a lane, with and without the residual (add_layer_norm); for 16-byte vectors of 16-bit inputs the
    quantized output's instances (up to 8 vectors a lane: layer_norm.hip's launch_vecs) in a unit of their own, which
    only precision="fp8" / "int8" loads. A first call compiles the 8-10 instances it can pick, not a dtype's 96."""
    units = {}
    for code, t in TYPES.items():
        for p, vec in itertools.product(dict.fromkeys((t, "float")), VECS_BY_TYPE[t]):
            float_params = p == "float" and t != "float"
            name = layer_norm_unit(code, float_params, vec, quantize=False)
            units[name] = Unit(name, "layer_norm/layer_norm.hip", tuple(
                f"rsd::layer_norm_rows<{t}, {p}, {vec}, {vecs}, {_bool(residual)}, false>"
                for vecs, residual in itertools.product((1, 2, 4, 8, 16), (False, True))))
            if t != "float" and vec == 8:
                name = layer_norm_unit(code, float_params, vec, quantize=True)
                units[name] = Unit(name, "layer_norm/layer_norm.hip", tuple(
                    f"rsd::layer_norm_rows<{t}, {p}, 8, {vecs}, {_bool(residual)}, true>"
                    for vecs, residual in itertools.product((1, 2, 4, 8), (False, True))))
    return units


def layer_norm_unit(dtype: int, float_params: bool, vec: int, quantize: bool) -> str:
    """The unit of LayerNorm's instances for inputs of `dtype`, float32 parameters or the input's, `vec`-wide
    vectors, writing a quantized output or not."""
    return f"layer_norm_{DTYPE_NAMES[dtype]}{'_pf32' if float_params else ''}_v{vec}{'_q' if quantize else ''}"


def _ada_layer_norm_units() -> dict[str, "Unit"]:
    """A unit per input type and vector width (ada_layer_norm.hip's launcher's first two choices), each with 1..8
    vectors a lane, with and without the gated residual (add_ada_layer_norm); for 16-byte vectors of 16-bit inputs the
    quantized output's instances in a unit of their own, which only precision="fp8" / "int8" loads."""
    units = {}
    for code, t in TYPES.items():
        for vec in VECS_BY_TYPE[t]:
            for quantize in (False, True) if t != "float" and vec == 8 else (False,):
                name = ada_layer_norm_unit(code, vec, quantize)
                units[name] = Unit(name, "ada_layer_norm/ada_layer_norm.hip", tuple(
                    f"rsd::ada_layer_norm_rows<{t}, {vec}, {vecs}, {_bool(gate)}, {_bool(quantize)}>"
                    for vecs, gate in itertools.product((1, 2, 4, 8), (False, True))))
    return units


def ada_layer_norm_unit(dtype: int, vec: int, quantize: bool = False) -> str:
    return f"ada_layer_norm_{DTYPE_NAMES[dtype]}_v{vec}{'_q' if quantize else ''}"


def _rms_norm_units() -> dict[str, "Unit"]:
    """A unit per input type, parameter type and vector width (rms_norm.hip's launcher's first choices), each with
    1..8 vectors a lane or the row read twice (0), without and (vectors of two or more) with the rotary embedding."""
    units = {}
    for code, t in TYPES.items():
        for p, vec in itertools.product(dict.fromkeys((t, "float")), VECS_BY_TYPE[t]):
            name = rms_norm_unit(code, p == "float" and t != "float", vec)
            units[name] = Unit(name, "rms_norm/rms_norm.hip", tuple(
                f"rsd::rms_norm_rows<{t}, {p}, {vec}, {vecs}, {_bool(rope)}>"
                for vecs, rope in itertools.product((1, 2, 4, 8, 0), (False, True)) if vec >= 2 or not rope))
    return units


def rms_norm_unit(dtype: int, float_params: bool, vec: int) -> str:
    """The unit of RMSNorm's instances for inputs of `dtype`, float32 weights or the input's, `vec`-wide vectors."""
    return f"rms_norm_{DTYPE_NAMES[dtype]}{'_pf32' if float_params else ''}_v{vec}"


# Short dtype names of unit names (a unit per input type where a source has many instances: a first call compiles
# only its own type's).
DTYPE_NAMES = {0: "f32", 1: "f16", 2: "bf16"}

def _group_norm_split(t: str, layout: str) -> tuple[str, ...]:
    """group_norm_split.hip's instances for inputs of type `t` in one layout (split_launch's switches): stats (NHWC:
    the 1024-thread instance, the 512-thread one, and the one whose vectors span two groups), finalize, and apply
    (NCHW: chunks and planes; NHWC: 512 and 1024 threads) with params of the input's type or float32, SiLU or not."""
    out = []
    for vec in VECS_BY_TYPE[t]:
        if layout == "nchw":
            out.append(f"rsd::gn::group_norm_stats_nchw<{t}, {vec}>")
        else:
            gpv = 2 if vec >= 2 else 1
            out += list(dict.fromkeys(f"rsd::gn::group_norm_stats_nhwc<{t}, {vec}, {g}, {threads}>"
                                      for g, threads in ((1, 1024), (1, 512), (gpv, 512))))
    out.append("rsd::gn::group_norm_finalize")
    for p, vec, silu in itertools.product(dict.fromkeys((t, "float")), VECS_BY_TYPE[t], (False, True)):
        if layout == "nchw":
            out += [f"rsd::gn::group_norm_apply_{kind}<{t}, {p}, {vec}, {_bool(silu)}>" for kind in ("nchw", "planes")]
        else:
            out += [f"rsd::gn::group_norm_apply_nhwc<{t}, {p}, {vec}, {_bool(silu)}, {threads}>"
                    for threads in (512, 1024)]
    return tuple(out)


def _group_norm_resident(t: str, layout: str) -> tuple[str, ...]:
    """group_norm_resident[_nhwc].hip's instances for inputs of type `t`: every vector width, params of the input's
    type or float32, SiLU or not (the four an occupancy query asks about per width are among them)."""
    return tuple(f"rsd::gn::group_norm_resident_{layout}<{t}, {p}, {vec}, {_bool(silu)}>"
                 for p, vec, silu in itertools.product(dict.fromkeys((t, "float")), VECS_BY_TYPE[t], (False, True)))


def _group_norm_units() -> dict[str, "Unit"]:
    """Per dtype: the split path's NCHW and NHWC kernels (one source, a unit per layout) and the resident kernels of
    each layout: a first call compiles only the layout and path it takes."""
    units = {}
    for code, t in TYPES.items():
        dt = DTYPE_NAMES[code]
        for layout in ("nchw", "nhwc"):
            name = f"group_norm_{layout}_{dt}"
            units[name] = Unit(name, "group_norm/group_norm_split.hip", _group_norm_split(t, layout))
        units[f"group_norm_resident_{dt}"] = Unit(f"group_norm_resident_{dt}", "group_norm/group_norm_resident.hip",
                                                  _group_norm_resident(t, "nchw"))
        units[f"group_norm_resident_nhwc_{dt}"] = Unit(f"group_norm_resident_nhwc_{dt}",
                                                       "group_norm/group_norm_resident_nhwc.hip",
                                                       _group_norm_resident(t, "nhwc"))
    return units


# Attention instances (hip/attention/attention.hip's kNarrow, attention_wide.hip's kWide): padded head dim ->
# (query tiles a wave, keys a tile) of the narrow family, all with 4 waves; the wide family's (waves, tiles).
NARROW_SHAPES = {dp: [(rows, n) for rows in ((1, 2) if dp <= 80 else (1,)) for n in (64, 32)]
                 for dp in (32, 48, 64, 80, 96, 128, 160)}
# The narrow instances of less shared memory (kNarrowKv): padded head dim -> (query tiles a wave, keys a tile,
# K / V tiles), in the C++ order.
NARROW_KV_SHAPES = {64: [(1, 64, 2), (2, 64, 2)], 80: [(1, 64, 2), (2, 64, 2)], 128: [(1, 64, 1), (1, 32, 2)],
                    160: [(1, 64, 1), (1, 32, 2)]}
WIDE_SHAPES = {512: [(4, 1), (8, 1), (4, 2)]}
ATTENTION_TYPES = {1: "__half", 2: "rsd::bf16"}


def _attention_units() -> dict[str, "Unit"]:
    """A unit per dtype and padded head dim: a first call compiles the few instances its head dim can pick."""
    units = {}
    for code, t in ATTENTION_TYPES.items():
        for dp, shapes in NARROW_SHAPES.items():
            name = f"attention_{DTYPE_NAMES[code]}_d{dp}"
            units[name] = Unit(name, "attention/attention.hip",
                               tuple(f"rsd::attention_kernel<{t}, {dp}, 4, {rows}, {n}>" for rows, n in shapes)
                               + tuple(f"rsd::attention_kernel<{t}, {dp}, 4, {rows}, {n}, {kv}>"
                                       for rows, n, kv in NARROW_KV_SHAPES.get(dp, ())))
        for dp, shapes in WIDE_SHAPES.items():
            name = f"attention_{DTYPE_NAMES[code]}_d{dp}"
            units[name] = Unit(name, "attention/attention_wide.hip",
                               tuple(f"rsd::attn::wide_attention_kernel<{t}, {dp}, {waves}, {rows}>"
                                     for waves, rows in shapes))
    return units


UNITS = {
    "bias_residual": Unit("bias_residual", "bias_residual/bias_residual.hip",
                          _typed_vec("bias_residual_kernel", ("true", "false"))),
    "parity_shuffle": Unit("parity_shuffle", "parity_shuffle/parity_shuffle.hip", _typed_vec("parity_shuffle_kernel")),
    "geglu": Unit("geglu", "geglu/geglu.hip", _typed_vec("geglu_kernel") + tuple(
        f"rsd::geglu_rows_quantized<{t}, {vec}>" for t in ("__half", "rsd::bf16") for vec in VECS_BY_TYPE[t]) + tuple(
        f"rsd::{kernel}<{t}, {vec}, {rows_only}>" for kernel in ("geglu_row_block_quantized", "geglu_bounded_quantized")
        for t in ("__half", "rsd::bf16") for vec in VECS_BY_TYPE[t] for rows_only in ("true", "false"))),
    "quantize_rows": Unit("quantize_rows", "quantize/quantize_rows.hip", _typed_vec("quantize_rows_kernel")),
    "gelu_tanh": Unit("gelu_tanh", "gelu_tanh/gelu_tanh.hip", _typed_vec("gelu_tanh_kernel", ("true", "false")) + tuple(
        f"rsd::gelu_tanh_row_block_quantized<{t}, 8, {bias}>" for t in ("__half", "rsd::bf16")
        for bias in ("true", "false"))),
    **_layer_norm_units(),
    **_ada_layer_norm_units(),
    **_rms_norm_units(),
    **_attention_units(),
    **_group_norm_units(),
}


def unit_source(unit: Unit, root: Path) -> str:
    """The source file's text: the program the compiler is given (its includes resolve from hip/include)."""
    return (root / unit.path).read_text()


@functools.lru_cache(maxsize=None)
def source_hash(root: Path) -> str:
    """sha256 over every file of the source tree (names and contents): a changed header changes every key."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()
