"""The JIT backend's launch plans (rocm_sd/jit/plans.py) against the C++ launchers they mirror: each op's source
is compiled by nvcc as host code into a driver that calls its checks and planning helpers (the anonymous-namespace
ones too: the driver includes the .hip file) for many argument sets, with the device facts stubbed; Python gives
its answers for the same sets. No GPU runs; nvcc is needed (the build checks' toolchain)."""
import itertools
import os
import pathlib
import shutil
import subprocess

import pytest

from rocm_sd.jit import plans
from rocm_sd.jit.launch import FastDiv

ROOT = pathlib.Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.build, pytest.mark.slow]  # an nvcc driver a test

SMS = (1, 80, 132, 304)
WAVES = (32, 64)
POINTERS = (0x10000, 0x10002, 0x10004, 0x10008, 0x10010)  # alignments 16 and less
DTYPES = (0, 1, 2)

STUBS = """
#include <cstdio>
#include <string>
namespace rsd {
int g_sms = 80, g_wave = 32, g_l2 = 0;  // g_l2 0: the runtime gives none (the fallback)
int device_attribute(int, Attr which, int fallback) {
  return which == Attr::multiprocessors ? g_sms : which == Attr::wave_size ? g_wave
         : which == Attr::l2_bytes && g_l2 ? g_l2 : fallback;
}
DeviceGuard::DeviceGuard(int) {}
DeviceGuard::~DeviceGuard() {}
}  // namespace rsd
using namespace rsd;
static const void* P(unsigned long long p) { return reinterpret_cast<const void*>(p); }
static void* M(unsigned long long p) { return reinterpret_cast<void*>(p); }
static void out(const std::string& s) { std::printf("%s\\n", s.c_str()); }
"""


def run_driver(tmp_path, source: str, body: list[str], extra: str = "", also: tuple = (),
               flags: tuple = ()) -> list[str]:
    """Builds and runs a driver that includes hip/<source> and runs `body` in main(); `also`: more sources
    compiled beside it (their anonymous namespaces stay theirs; relative to hip/, or absolute paths); `flags`: more
    nvcc options for every source."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        if os.environ.get("ROCM_SD_REQUIRE_BUILD_TOOLS"):
            pytest.fail("nvcc not found (ROCM_SD_REQUIRE_BUILD_TOOLS is set)")
        pytest.skip("nvcc not found")
    driver = tmp_path / "driver.cu"
    driver.write_text(f'#include "{ROOT / "hip" / source}"\n{STUBS}\n{extra}\nint main() {{\n' + "\n".join(body)
                      + "\n}\n")
    exe = tmp_path / "driver"
    result = subprocess.run([nvcc, "-std=c++17", "-O0", f"-I{ROOT / 'hip' / 'include'}", "-arch=compute_80",
                             "-code=compute_80", *flags, "-x", "cu", str(driver),
                             *[str(ROOT / "hip" / s) for s in also], "-o", str(exe)],
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    return subprocess.run([str(exe)], check=True, capture_output=True, text=True, timeout=60).stdout.splitlines()


def compare(cpp: list[str], python: list[str]) -> None:
    assert len(cpp) == len(python)
    mismatches = [f"C++ {c!r} != Python {p!r}" for c, p in zip(cpp, python) if c != p]
    assert not mismatches, f"{len(mismatches)} of {len(cpp)} differ:\n" + "\n".join(mismatches[:20])


def case_table(fields: str, rows: list[str], name: str = "kCases", struct: str = "Case") -> str:
    """The cases as a static table the driver loops over: one statement a case makes a main() that nvcc takes many
    minutes on (past the timeout on a loaded two-core machine), a table compiles in seconds."""
    return (f"struct {struct} {{ {fields} }};\nstatic const {struct} {name}[] = {{\n" + ",\n".join(rows)
            + "};\n")


def test_shared_helpers_match_launch_h(tmp_path):
    vec_rows, grid_rows, div_rows, expected = [], [], [], []
    for dtype, unit, a, b in itertools.product(DTYPES, (1, 2, 3, 4, 8, 12, 16, 77, 320), POINTERS, POINTERS):
        vec_rows.append(f"{{{dtype}, {unit}, {a}ULL, {b}ULL}}")
        expected.append(str(plans.widest_vec(dtype, unit, (a, b))))
    for sms, work, threads in itertools.product(SMS, (0, 1, 255, 256, 257, 10**5, 10**8), (64, 256)):
        grid_rows.append(f"{{{sms}, {work}LL, {threads}}}")
        expected.append(str(plans.grid_stride_blocks(sms, work, threads)))
    for d in (1, 2, 3, 7, 64, 77, 320, 1000, 4096, 65535, 2**31 - 1, 2**31, 2**32 - 1):
        div_rows.append(f"{{{d}u}}")
        fd = FastDiv.of(d)
        expected.append(f"{fd.divisor} {fd.multiplier} {fd.shift}")
    extra = (case_table("int dtype; long long unit; unsigned long long a, b;", vec_rows, "kVecs", "VecCase")
             + case_table("int sms; long long work; int threads;", grid_rows, "kGrids", "GridCase")
             + case_table("unsigned d;", div_rows, "kDivisors", "DivisorCase"))
    body = ["for (const auto& k : kVecs) out(std::to_string(widest_vec(DType(k.dtype), k.unit, {P(k.a), P(k.b)})));",
            "for (const auto& k : kGrids) { g_sms = k.sms; "
            "out(std::to_string(grid_stride_blocks(0, k.work, k.threads))); }",
            "for (const auto& k : kDivisors) { FastDiv f(k.d); out(std::to_string(f.divisor) + ' ' + "
            "std::to_string(f.multiplier) + ' ' + std::to_string(f.shift)); }"]
    compare(run_driver(tmp_path, "geglu/geglu.hip", body, extra=extra), expected)


def test_layer_norm_plan_matches_its_launcher(tmp_path):
    rows, expected = [], []
    # (q, scale, format, bound): a bound is refused with int8 and when negative
    quantized = ((0, 0, 0, 0.0), (0x60000, 0x70000, 1, 0.0), (0x60004, 0x70000, 2, 0.0), (0x60000, 0, 0, 0.0),
                 (0x60000, 0x70000, 7, 0.0), (0x60000, 0x70000, 0, 2.5), (0x60000, 0x70000, 2, 2.5),
                 (0x60000, 0x70000, 1, -1.0))
    for wave, dtype, pdtype, c, x, res, (q, scale, fmt, bound) in itertools.product(
            WAVES, DTYPES, (0, 1, 2), (1, 3, 8, 77, 320, 768, 1280, 2048, 4096, 8192, 20000), POINTERS[:4],
            (0, 0x20000, 0x20002), quantized):
        total = res + 0x100000 if res else 0
        rows.append(f"{{{wave}, {dtype}, {pdtype}, {c}LL, {x}ULL, {res}ULL, {total}ULL, {q}ULL, {scale}ULL, {fmt}, "
                    f"{bound}f}}")
        why = plans.layer_norm_check(x, x + 0x40000, 0, 0, dtype, pdtype, 7, c, 1e-5, wave, res, total, q, scale, fmt,
                                     bound)
        if why:
            expected.append(why)
        else:
            launch = plans.layer_norm_plan(x, x + 0x40000, 0, 0, dtype, pdtype, 7, c, 1e-5, wave, res, total, q, scale,
                                           fmt, bound)
            vec, vecs, _, quantize = launch.expression.rstrip(">").split(", ")[2:6]
            expected.append(f"{vec} {vecs}" + (" q" if quantize == "true" else ""))
            assert launch.args[-1] == (q, scale, fmt, bound)
    extra = case_table("int wave, dtype, pdtype; long long c; unsigned long long x, res, total, q, scale; int fmt; "
                       "float bound;", rows)
    # what the launcher decides: vector width, vectors a lane, and whether the quantizing instance runs
    body = ["for (const auto& k : kCases) { g_wave = k.wave; LayerNormArgs a{P(k.x), M(k.x + 0x40000), P(0), P(0), "
            "DType(k.dtype), DType(k.pdtype), 7, k.c, 1e-5f, nullptr, 0, P(k.res), M(k.total), M(k.q), "
            "(float*)M(k.scale), QuantFormat(k.fmt), k.bound}; std::string why = layer_norm_check(a); "
            "out(why.empty() ? std::to_string(pick_vec(a)) + ' ' + std::to_string(vecs_per_lane(a, pick_vec(a))) + "
            "(a.q && pick_vec(a) == kQuantizeVec ? \" q\" : \"\") : why); }"]
    cpp = run_driver(tmp_path, "layer_norm/layer_norm.hip", body, extra=extra)
    # the C++ prints vecs_per_lane itself (a power of two <= 16 once the check passed): the instance it launches
    compare(cpp, expected)


def test_ada_layer_norm_plan_matches_its_launcher(tmp_path):
    """Checks, vector width (rows and every (batch, channel)-strided parameter), vectors a lane, threads a row and
    rows a block, with and without the gated residual."""
    rows, expected = [], []
    strides = ((0, 1), (6 * 2432, 1), (6 * 2432 + 2, 1), (3, 1), (1, 2432), (-1, 1), (1 << 31, 1))
    for wave, dtype, c, x, param, stride, gated in itertools.product(
            WAVES, DTYPES, (1, 3, 33, 320, 1536, 2432, 3072, 4096, 8192, 32768, 40000), POINTERS[:4],
            POINTERS, strides, (False, True)):
        y, gate, h = (0x20000, param + 0x300000, 0x40000) if gated else (0, 0, 0)
        gate_stride = stride if gated else (0, 0)
        rows.append(f"{{{wave}, {x}ULL, {param}ULL, {dtype}, {c}, {stride[0]}LL, {stride[1]}LL, {int(gated)}}}")
        args = (x, x + 0x100000, param, param + 0x200000, dtype, 3, 77, c, stride, stride, 1e-6, wave, y, gate,
                gate_stride, h)
        why = plans.ada_layer_norm_check(*args)
        if why:
            expected.append(why)
        else:
            launch = plans.ada_layer_norm_plan(*args)
            vec, vecs = launch.expression.rstrip(">").split(", ")[1:3]
            row_threads = launch.args[-2]  # the last is the quantized output (none here)
            expected.append(f"{vec} {vecs} {row_threads} {launch.block // row_threads}")
            assert launch.grid == -(-3 * 77 // (launch.block // row_threads))
    table = case_table("int wave; unsigned long long x, param; int dtype; long long c, s0, s1; int gated;", rows)
    body = ["for (const Case& k : kCases) {",
            "  g_wave = k.wave;",
            "  AdaLayerNormArgs a{P(k.x), M(k.x + 0x100000), P(k.param), P(k.param + 0x200000), DType(k.dtype), 3, 77,",
            "                    k.c, {k.s0, k.s1}, {k.s0, k.s1}, 1e-6f, nullptr, 0};",
            "  if (k.gated) {",
            "    a.y = P(0x20000); a.gate = P(k.param + 0x300000); a.h = M(0x40000);",
            "    a.gate_stride[0] = k.s0; a.gate_stride[1] = k.s1;",
            "  }",
            "  std::string why = ada_layer_norm_check(a);",
            "  Plan p = plan_launch(a);",
            "  out(why.empty() ? std::to_string(p.vec) + ' ' + std::to_string(p.vecs) + ' ' +",
            "                    std::to_string(p.row_threads) + ' ' + std::to_string(p.rows_per_block) : why);",
            "}"]
    compare(run_driver(tmp_path, "ada_layer_norm/ada_layer_norm.hip", body, extra=table), expected)


def test_rms_norm_plan_matches_its_launcher(tmp_path):
    rows, expected = [], []
    for wave, dtype, pdtype, d, x, (weight, cos), lead_len, stride in itertools.product(
            WAVES, DTYPES, (0, 1, 2), (1, 2, 6, 33, 40, 64, 128, 4096, 8192, 65538), POINTERS[:4],
            ((0, 0), (0x50000, 0), (0x50008, 0x60000), (0x50000, 0x60004), (0x50002, 0x60008)), (0, 5), (1, 2)):
        lead = x + 0x200000 if lead_len else 0
        sin = cos + 0x8000 if cos else 0
        x_stride = [7 * 3 * d * stride, 3 * d * stride, d * stride]  # stride 2: a view of a fused projection
        lead_stride = [lead_len * 3 * d, 3 * d, d] if lead_len else [0, 0, 0]
        rows.append(f"{{{wave}, {dtype}, {pdtype}, {d}, {x}ull, {weight}ull, {lead}ull, {cos}ull, {sin}ull, {lead_len}, "
                    f"{{{', '.join(map(str, x_stride))}}}, {{{', '.join(map(str, lead_stride))}}}}}")
        py = (x, weight, lead, weight, cos, sin, x + 0x400000, dtype, pdtype, [2, 7, lead_len, 3, d], x_stride,
              lead_stride, 1e-6)
        why = plans.rms_norm_check(*py)
        if why:
            expected.append(why)
        else:
            launch = plans.rms_norm_plan(*py, wave)
            vec, vecs = launch.expression.rstrip(">").split(", ")[2:4]
            expected.append(f"{vec} {vecs} {launch.args[9]}")
    table = case_table("int wave, dtype, pdtype; long long d; unsigned long long x, weight, lead, cos, sin; "
                       "long long lead_len, xs[3], ls[3];", rows)
    body = ["for (const Case& c : kCases) { g_wave = c.wave; RmsNormArgs a{P(c.x), P(c.weight), P(c.lead), "
            "P(c.weight), (const float*)P(c.cos), (const float*)P(c.sin), M(c.x + 0x400000), DType(c.dtype), "
            "DType(c.pdtype), 2, 7, c.lead_len, 3, c.d, {c.xs[0], c.xs[1], c.xs[2]}, {c.ls[0], c.ls[1], c.ls[2]}, "
            "1e-6f, nullptr, 0}; std::string why = rms_norm_check(a); Shape s = plan(a); "
            "out(why.empty() ? std::to_string(s.vec) + ' ' + std::to_string(s.vecs) + ' ' + "
            "std::to_string(s.lanes_log2) : why); }"]
    compare(run_driver(tmp_path, "rms_norm/rms_norm.hip", body, extra=table), expected)


def test_geglu_quantized_plan_matches_its_launcher(tmp_path):
    rows, expected = [], []
    sizes = (1, 3, 8, 320, 1031, 1280, 5120, 8192, 8200, 16384, 16392)
    cases = itertools.chain(  # (..., y): with y, and without it (the kernels writing only the rows, or refusals)
        itertools.product(DTYPES, sizes, POINTERS, POINTERS, (0x80000, 0x80002, 0), (0, 2, 9), (0.0,), (32, 64),
                          (0x50000,)),
        itertools.product(DTYPES, (3, 320, 16392), POINTERS[:2], POINTERS[:2], (0x80000, 0), (0, 2), (3.5, -2.0),
                          (64,), (0x50000,)),
        itertools.product(DTYPES, sizes, POINTERS[:2], POINTERS[:2], (0x80000, 0), (0, 9), (0.0, 3.5), (32, 64),
                          (0,)))
    for dtype, d, x, q, scale, fmt, bound, wave, y in cases:
        rows.append(f"{{{dtype}, {d}LL, {x}ULL, {q}ULL, {scale}ULL, {fmt}, {bound}f, {wave}, {y}ULL}}")
        why = plans.geglu_check(x, y, dtype, 5, d, q, scale, fmt, bound, wave)
        if why:
            expected.append(why)
            continue
        launch = plans.geglu_plan(x, y, dtype, 5, d, 80, wave, q, scale, fmt, bound)
        kernel, arguments = launch.expression.rstrip(">").split("<")
        vec = arguments.split(", ")[1]
        if kernel != "rsd::geglu_rows_quantized":  # the wave-per-row kernel needs y (geglu_check)
            assert arguments.split(", ")[2] == ("false" if y else "true"), launch.expression
        block = launch.block if kernel == "rsd::geglu_row_block_quantized" else 0
        if kernel == "rsd::geglu_bounded_quantized":
            assert bound > 0 and launch.args[-1] == bound
            block = -1
        assert block or (kernel == "rsd::geglu_rows_quantized" and launch.block == plans.THREADS)
        expected.append(f"{vec} {block}")
    extra = case_table("int dtype; long long d; unsigned long long x, q, scale; int fmt; float bound; int wave; "
                       "unsigned long long y;", rows)
    # geglu_forward's quantized branch narrows the vector width to q's alignment; 0 threads: a wave per row, and
    # a bound takes the elementwise grid (-1); without y, the kernels writing only the rows
    body = ["for (const auto& k : kCases) { g_wave = k.wave; GegluArgs a{P(k.x), M(k.y), DType(k.dtype), 5, k.d, "
            "nullptr, 0, M(k.q), (float*)M(k.scale), QuantFormat(k.fmt), k.bound}; std::string why = geglu_check(a); "
            "int vec = widest_vec(a.dtype, a.d, {a.x, a.y}); while (vec > 1 && !aligned(a.q, vec)) vec /= 2; "
            "out(why.empty() ? std::to_string(vec) + \" \" + std::to_string(a.bound > 0.f ? -1 : "
            "geglu_row_block_threads(a.d, vec, k.wave)) : why); }"]
    compare(run_driver(tmp_path, "geglu/geglu.hip", body, extra=extra), expected)


def test_quantize_rows_plan_matches_its_launcher(tmp_path):
    rows, expected = [], []
    for dtype, fmt, k, x, q in itertools.product(DTYPES, (0, 1, 2, 5), (1, 3, 8, 64, 320, 5120), POINTERS, POINTERS):
        rows.append(f"{{{dtype}, {fmt}, {k}LL, {x}ULL, {q}ULL}}")
        why = plans.quantize_rows_check(x, q, 0x80000, dtype, fmt, 5, k)
        expected.append(why or plans.quantize_rows_plan(x, q, 0x80000, dtype, fmt, 5, k, 32).expression
                        .rsplit(", ", 1)[1].rstrip(">"))
    body = ["for (const auto& c : kCases) { QuantizeRowsArgs a{P(c.x), M(c.q), (float*)M(0x80000), DType(c.dtype), "
            "QuantFormat(c.fmt), 5, c.k, nullptr, 0}; std::string why = quantize_rows_check(a); "
            "out(why.empty() ? std::to_string(pick_vec(a)) : why); }"]
    extra = case_table("int dtype, fmt; long long k; unsigned long long x, q;", rows)
    compare(run_driver(tmp_path, "quantize/quantize_rows.hip", body, extra=extra), expected)


def test_elementwise_checks_match_their_launchers(tmp_path):
    rows = []
    expected = {"bias_residual/bias_residual.hip": [], "parity_shuffle/parity_shuffle.hip": [], "geglu/geglu.hip": []}
    for dtype, ptr, n, c, hw in itertools.product(DTYPES, POINTERS, (0, 1, 2), (0, 3, 320), (1, 4096, 2**25)):
        rows.append(f"{{{dtype}, {ptr}ULL, {n}LL, {c}LL, {hw}LL}}")
        expected["bias_residual/bias_residual.hip"].append(
            plans.bias_residual_check(ptr, 0x30000, 0x40000, 0x50000, dtype, 0, n, c, hw, 1.0))
        expected["parity_shuffle/parity_shuffle.hip"].append(
            plans.parity_shuffle_check(ptr, 0, 0x50000, dtype, n, c, c, hw))
        expected["geglu/geglu.hip"].append(plans.geglu_check(ptr, 0x50000, dtype, n * c, hw))
    calls = {
        "bias_residual/bias_residual.hip": "bias_residual_check(BiasResidualArgs{P(k.ptr), P(0x30000), P(0x40000), "
                                           "M(0x50000), DType(k.dtype), Layout::nchw, k.n, k.c, k.hw, 1.f, nullptr, 0})",
        "parity_shuffle/parity_shuffle.hip": "parity_shuffle_check(ParityShuffleArgs{P(k.ptr), P(0), M(0x50000), "
                                             "DType(k.dtype), k.n, k.c, k.c, k.hw, nullptr, 0})",
        "geglu/geglu.hip": "geglu_check(GegluArgs{P(k.ptr), M(0x50000), DType(k.dtype), k.n * k.c, k.hw, nullptr, 0})"}
    extra = case_table("int dtype; unsigned long long ptr; long long n, c, hw;", rows)
    for source, call in calls.items():
        body = [f"for (const auto& k : kCases) out({call});"]
        compare(run_driver(tmp_path, source, body, extra=extra), expected[source])


ATTENTION_STUBS = """
namespace rsd {
const char* g_arch = "sm_90";
std::string device_arch(int) { return g_arch; }
}  // namespace rsd
"""


def test_attention_plan_matches_its_launcher(tmp_path):
    """Checks, the instance the heuristic or a name picks, and the grid (attention_describe), for head dims, sequence
    lengths, dtypes, strides, pointers, scales and named instances; the instance list in order. The driver is
    built with nvcc, so its policy is NVIDIA's (sm_80+, and none below)."""
    from rocm_sd.jit import attention_plan

    body, expected = [], []
    body.append("for (const auto& name : attention_instances()) out(name);")
    expected += [inst.name for inst in attention_plan.INSTANCES]
    cases = []
    for arch, dtype, head_dim in itertools.product(("sm_90", "sm_75"), (0, 1, 2), (8, 40, 64, 72, 80, 88, 128, 160,
                                                                                   168, 512, 520)):
        for q_len, kv_len in ((77, 77), (4096, 77), (4096, 4096), (1024, 1024), (2048, 161)):
            cases.append((arch, dtype, [2, 8, q_len, kv_len, head_dim], 0x1000, 512, 0.125, ""))
    for arch, bad in itertools.product(("sm_90",), ("pointer", "stride", "scale", "nan", "empty")):
        cases.append((arch, 1, [1, 2, 64, 64 if bad != "empty" else 0, 64], 0x1008 if bad == "pointer" else 0x1000,
                      516 if bad == "stride" else 512, {"scale": -1.0, "nan": float("nan")}.get(bad, 0.125), ""))
    for inst, dtype in itertools.product(attention_plan.INSTANCES[::3], (1, 2)):
        cases.append(("sm_90", dtype, [1, 2, 300, 300, min(inst.padded_dim, 136)], 0x1000, 512, 0.125, inst.name))
    cases.append(("sm_90", 1, [1, 2, 300, 300, 64], 0x1000, 512, 0.125, "no_such_instance"))
    for arch, dtype, sizes, ptr, stride, scale, name in cases:
        device = 0 if arch == "sm_90" else 1  # the runtime caches each device's arch (rocm_sd/runtime.h)
        strides = [[8 * 4096 * 1024, stride, 64]] * 4
        scale_text = "__builtin_nanf(\"\")" if scale != scale else repr(scale) + "f"
        body.append(
            f'{{ g_arch = "{arch}"; AttentionArgs a; a.q = P({ptr}); a.k = P(0x2000); a.v = P(0x3000); a.out = M(0x4000); '
            f"a.dtype = DType({dtype}); a.batch = {sizes[0]}; a.heads = {sizes[1]}; a.q_len = {sizes[2]}; "
            f"a.kv_len = {sizes[3]}; a.head_dim = {sizes[4]}; "
            + "".join(f"a.{t}_stride[{i}] = {strides[0][i]};" for t in ("q", "k", "v", "out") for i in range(3))
            + f' a.scale = {scale_text}; a.stream = nullptr; a.device = {device}; a.instance = "{name}"; '
              f"out(attention_describe(a)); }}")
        why = attention_plan.check(ptr, 0x2000, 0x3000, 0x4000, dtype, sizes, strides, scale, "cuda", arch, device, name)
        if why:
            expected.append("error: " + why)
        else:
            expected.append(attention_plan.describe(*attention_plan.plan(ptr, 0x2000, 0x3000, 0x4000, dtype, sizes,
                                                                         strides, scale, "cuda", arch, 32, name)))
    compare(run_driver(tmp_path, "attention/attention.hip", body, extra=ATTENTION_STUBS,
                       also=["attention/attention_wide.hip"]), expected)


# ---- group_norm: check, path, plans, workspace, describe and every launch of group_norm_forward -------------------

# The kernels' parameter types as launch.CTYPES letters, from the kernels' own types (gn_test::add), and the
# launches group_norm_forward makes, caught by stubs of the runtime's launch and memset (ld --wrap): the instance,
# grid, block and every argument's value, in order.
GN_REGISTRY_H = r"""
#pragma once
#include <cstdint>
#include <map>
#include <string>
namespace gn_test {
struct Kernel { std::string name, signature; };
std::map<const void*, Kernel>& registry();
extern std::string launches;
extern int warps;
#ifdef RSD_GN_KERNELS  // the CUDA sources, with the kernels (the stubs, compiled by the host compiler, have no rsd::)
template <class T> struct Letter { static constexpr char c = '?'; };
template <class T> struct Letter<T*> { static constexpr char c = 'p'; };
template <> struct Letter<long> { static constexpr char c = 'q'; };
template <> struct Letter<long long> { static constexpr char c = 'q'; };
template <> struct Letter<int> { static constexpr char c = 'i'; };
template <> struct Letter<unsigned> { static constexpr char c = 'u'; };
template <> struct Letter<bool> { static constexpr char c = 'b'; };
template <> struct Letter<float> { static constexpr char c = 'f'; };
template <> struct Letter<rsd::FastDiv> { static constexpr char c = 'd'; };
template <class... P>
void add(void (*kernel)(P...), const char* name) {
  registry()[reinterpret_cast<const void*>(kernel)] = Kernel{name, std::string{Letter<P>::c...}};
}
#endif
}  // namespace gn_test
"""

# The runtime calls the GroupNorm launchers make (kernel launches, memsets, occupancy queries), replaced at link time
# (ld --wrap) by these, compiled by the host compiler alone.
GN_STUBS_CPP = r"""
#include <cstring>
#include "gn_registry.h"
namespace gn_test {
std::string launches;
int warps = 64;  // warps of a kernel's blocks a multiprocessor holds (the occupancy stub's answer)
std::map<const void*, Kernel>& registry() { static std::map<const void*, Kernel> r; return r; }
template <class V> V read(void* p) { V v; std::memcpy(&v, p, sizeof v); return v; }
}  // namespace gn_test
struct Dim3 { unsigned x, y, z; };
extern "C" int __wrap_cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, const void*, int threads, size_t) {
  *blocks = gn_test::warps / ((threads + 31) / 32);
  return 0;
}
extern "C" int __wrap_cudaGetLastError(void) { return 0; }
extern "C" int __wrap_cudaMemsetAsync(void* p, int value, size_t bytes, void*) {
  gn_test::launches += " | memset " + std::to_string(reinterpret_cast<uintptr_t>(p)) + " " +
                       std::to_string(value) + " " + std::to_string(bytes);
  return 0;
}
// <<<>>> calls __cudaGetKernel once per kernel, then __cudaLaunchKernel with its handle (CUDA 13; CUDA 12 calls
// cudaLaunchKernel with the kernel's host function): the handle here is that function.
extern "C" int __wrap___cudaGetKernel(const void** handle, const void* f) {
  *handle = f;
  return 0;
}
extern "C" int __wrap_cudaLaunchKernel(const void* f, Dim3 grid, Dim3 block, void** args, size_t shared, void*);
extern "C" int __wrap___cudaLaunchKernel(const void* f, Dim3 grid, Dim3 block, void** args, size_t shared, void* s) {
  return __wrap_cudaLaunchKernel(f, grid, block, args, shared, s);
}
extern "C" int __wrap_cudaLaunchKernel(const void* f, Dim3 grid, Dim3 block, void** args, size_t shared, void*) {
  using namespace gn_test;
  auto it = registry().find(f);
  if (it == registry().end()) { launches += " | unknown kernel"; return 0; }
  const std::string& sig = it->second.signature;
  launches += " | " + it->second.name + " grid=" + std::to_string(grid.x) + "," + std::to_string(grid.y) + "," +
         std::to_string(grid.z) + " block=" + std::to_string(block.x) + "," + std::to_string(block.y) + "," +
         std::to_string(block.z) + " shared=" + std::to_string(shared) + " sig=" + sig + " args=";
  for (size_t i = 0; i < sig.size(); ++i) {
    std::string v;
    switch (sig[i]) {
      case 'p': v = std::to_string(read<uintptr_t>(args[i])); break;
      case 'q': v = std::to_string(read<int64_t>(args[i])); break;
      case 'i': v = std::to_string(read<int32_t>(args[i])); break;
      case 'u': v = std::to_string(read<uint32_t>(args[i])); break;
      case 'b': v = read<bool>(args[i]) ? "1" : "0"; break;
      case 'f': v = std::to_string(read<uint32_t>(args[i])); break;  // the float's bits
      case 'd': { uint32_t d[3]; std::memcpy(d, args[i], sizeof d);  // rsd::FastDiv: divisor, multiplier, shift
                  v = std::to_string(d[0]) + "/" + std::to_string(d[1]) + "/" + std::to_string(d[2]); break; }
      case 'w': { uintptr_t w[5]; std::memcpy(w, args[i], sizeof w);  // gn::Workspace: five pointers
                  for (int k = 0; k < 5; ++k) v += (k ? "/" : "") + std::to_string(w[k]); break; }
      default: v = "?";
    }
    launches += (i ? " " : "") + v;
  }
  return 0;
}
"""

GN_STUBS = r"""
#define RSD_GN_KERNELS
#include "gn_registry.h"
void register_resident();
void register_resident_nhwc();
struct GnCase { unsigned long long x, y, gamma, beta; int dtype, pdtype, layout; long long n, c, hw; int groups;
                double eps; int silu; unsigned long long input_bias; int scenario; };
struct GnScenario { int sms, l2, warps; };
static std::string b(bool v) { return v ? "1" : "0"; }
static std::string s(long long v) { return std::to_string(v); }
"""

GN_MAIN = r"""
  register_split(); register_resident(); register_resident_nhwc();
  for (const GnCase& k : kCases) {
    const GnScenario& sc = kScenarios[k.scenario];
    g_sms = sc.sms; g_l2 = sc.l2; gn_test::warps = sc.warps;
    GroupNormArgs a{P(k.x), M(k.y), P(k.gamma), P(k.beta), DType(k.dtype), DType(k.pdtype), Layout(k.layout), k.n, k.c,
                    k.hw, k.groups, float(k.eps), bool(k.silu), M(0x7000000), nullptr, k.scenario,
                    GroupNormPath::automatic, P(k.input_bias)};
    const std::string why = group_norm_check(a);
    if (!why.empty()) { out("check: " + why); continue; }
    const gn::Plan p = gn::make_plan(a);
    out("split vec=" + s(p.vec) + " threads=" + s(p.threads) + " tpr=" + s(p.threads_per_row) + " rpi=" +
        s(p.rows_per_iter) + " chunk=" + s(p.chunk) + " splits=" + s(p.splits) + " partials=" + s(p.partial_count) +
        " planes=" + b(p.planes) + " plane_chunk=" + s(p.plane_chunk) + " plane_splits=" + s(p.plane_splits) +
        " streaming=" + b(p.streaming) + " gpv=" + s(p.groups_per_vec));
    gn::ResidentPlan r;
    out(gn::resident_plan(a, &r) ? "resident vec=" + s(r.vec) + " bpg=" + s(r.blocks_per_group) + " threads=" +
        s(r.threads) + " tpr=" + s(r.threads_per_row) + " rpi=" + s(r.rows_per_iter) + " rpb=" + s(r.rows_per_block) +
        " bpi=" + s(r.blocks_per_image) + " tickets=" + b(r.tickets) : std::string("no resident plan"));
    for (int path = 0; path < 3; ++path) {
      a.path = GroupNormPath(path);
      out("path " + s(path) + ": " + group_norm_describe(a) + " ws=" + s(group_norm_workspace_bytes(a)));
      gn_test::launches.clear();
      const std::string err = group_norm_forward(a);
      out(err.empty() ? "forward" + gn_test::launches : "forward error: " + err);
    }
  }
"""

# (multiprocessors, L2 bytes (0: the runtime gives none), warps a multiprocessor holds of the resident kernels (0: the
# occupancy is unknown)); each a device index of its own, as the C++ caches occupancy per device.
GN_SCENARIOS = ((132, 50 << 20, 64), (304, 256 << 20, 32), (1, 0, 64), (80, 6 << 20, 0), (20, 4 << 20, 8))
GN_SHAPES = (  # (n, c, hw, groups): SD's, then odd ones
    (2, 320, 64 * 64, 32), (2, 1280, 8 * 8, 32), (1, 128, 512 * 512, 32), (1, 512, 64 * 64, 32), (2, 640, 32 * 32, 32),
    (2, 1280, 16 * 16, 32), (1, 256, 256 * 256, 32), (2, 960, 32 * 32, 32), (1, 512, 128 * 128, 32),
    (2, 64, 16, 32), (3, 96, 63, 32), (2, 128, 64 * 64, 32), (2, 128, 16, 32), (1, 7, 77, 7), (2, 5, 1, 5),
    (1, 64, 1, 32), (4, 33, 9, 3), (1, 4096, 16, 32), (1, 2048, 8, 2048), (2, 1024, 4, 1024), (1, 64, 512 * 512, 1),
    (3000, 32, 5, 32), (70000, 8, 4, 4), (1, 8192, 2, 32), (1, 2, 2 ** 30, 1), (1, 1, 2 ** 31 - 1, 1), (0, 32, 4, 32),
    (2, 30, 4, 4))


def _gn_arg_text(kind: str, value) -> str:
    """A planned launch argument as the driver prints it (C++ reads it back from the launch's argument array)."""
    import struct

    if kind == "b":
        return "1" if value else "0"
    if kind == "f":
        return str(struct.unpack("<I", struct.pack("<f", value))[0])
    if kind == "d":
        d = FastDiv.of(value)
        return f"{d.divisor}/{d.multiplier}/{d.shift}"
    if kind == "w":
        return "/".join(str(v) for v in value)
    return str(value)


def _gn_work_text(work) -> str:
    if isinstance(work, plans.Memset):
        return f" | memset {work.pointer} 0 {work.nbytes}"
    gx, gy, gz = (work.grid, 1, 1) if isinstance(work.grid, int) else work.grid
    args = " ".join(_gn_arg_text(k, v) for k, v in zip(work.signature, work.args, strict=True))
    return f" | {work.expression} grid={gx},{gy},{gz} block={work.block},1,1 shared=0 sig={work.signature} args={args}"


def test_group_norm_plan_matches_its_launcher(tmp_path):
    """group_norm_check; make_plan (split); resident_plan (with an occupancy stub: 0 = unknown, and small devices
    that cannot hold an exchange); for each path (automatic, resident, split) group_norm_describe,
    group_norm_workspace_bytes, and the launches and memsets group_norm_forward makes with every argument. NCHW and
    NHWC, SD's shapes and odd ones, every dtype, alignments, float32 params, SiLU, input bias."""
    from dataclasses import replace

    from rocm_sd.jit import group_norm_plan as gnp
    from rocm_sd.jit import sources

    cases, expected = [], []
    pointers = (0x10000000, 0x10000002, 0x10000004, 0x10000008)
    index = 0
    for scenario, (sms, l2, warps) in enumerate(GN_SCENARIOS):
        facts = gnp.Facts(sms, l2 or 32 << 20)

        def capacity(layout, dtype, vec, threads, _warps=warps, _sms=sms):
            return _warps // ((threads + 31) // 32) * _sms

        for (n, c, hw, groups), dtype, layout, x in itertools.product(GN_SHAPES, DTYPES, (0, 1), pointers):
            index += 1
            pdtype = (dtype + 1) % 3 if dtype and index % 11 == 0 else (0 if index % 5 in (1, 3) else dtype)
            y = 0x20000001 if index % 17 == 0 else 0x20000000
            gamma, beta = (0, 0) if index % 4 == 3 else (0x30000000, 0x30001000)
            input_bias = 0x40000000 if index % 3 == 1 else 0
            eps, silu = (1e-5, 1e-6)[index % 2], index % 7 < 4
            cases.append(f"{{{x}ULL, {y}ULL, {gamma}ULL, {beta}ULL, {dtype}, {pdtype}, {layout}, {n}LL, {c}LL, {hw}LL, "
                         f"{groups}, {eps!r}, {int(silu)}, {input_bias}ULL, {scenario}}}")
            a = gnp.Args(x, y, gamma, beta, dtype, pdtype, layout, n, c, hw, groups, eps, silu, 0x7000000,
                         gnp.AUTOMATIC, input_bias)
            why = gnp.check(a)
            if why:
                expected.append("check: " + why)
                continue
            p = gnp.split_plan(a, facts)
            expected.append(f"split vec={p.vec} threads={p.threads} tpr={p.threads_per_row} rpi={p.rows_per_iter} "
                            f"chunk={p.chunk} splits={p.splits} partials={p.partial_count} planes={int(p.planes)} "
                            f"plane_chunk={p.plane_chunk} plane_splits={p.plane_splits} "
                            f"streaming={int(p.streaming)} gpv={p.groups_per_vec}")
            r = gnp.resident_plan(a, capacity)
            expected.append(f"resident vec={r.vec} bpg={r.blocks_per_group} threads={r.threads} "
                            f"tpr={r.threads_per_row} rpi={r.rows_per_iter} rpb={r.rows_per_block} "
                            f"bpi={r.blocks_per_image} tickets={int(r.tickets)}" if r else "no resident plan")
            for path in (gnp.AUTOMATIC, gnp.RESIDENT, gnp.SPLIT):
                ap = replace(a, path=path)
                expected.append(f"path {path}: {gnp.describe(ap, facts, capacity)} "
                                f"ws={gnp.workspace_bytes(ap, facts, capacity)}")
                try:
                    expected.append("forward" + "".join(_gn_work_text(w) for w in gnp.launches(ap, facts, capacity)))
                except RuntimeError as error:
                    expected.append(f"forward error: {error}")

    def registrations(function: str, unit_prefix: str) -> str:
        expressions = dict.fromkeys(e for name, unit in sources.UNITS.items() if name.startswith(unit_prefix)
                                    for e in unit.expressions)
        return f"void {function}() {{\n" + "".join(f'  gn_test::add(&{e}, "{e}");\n' for e in expressions) + "}\n"

    (tmp_path / "gn_registry.h").write_text(GN_REGISTRY_H)
    (tmp_path / "gn_stubs.cpp").write_text(GN_STUBS_CPP)
    host = shutil.which("c++") or shutil.which("g++")  # nvcc's host compiler
    if host is None:
        if os.environ.get("ROCM_SD_REQUIRE_BUILD_TOOLS"):
            pytest.fail("no host C++ compiler (ROCM_SD_REQUIRE_BUILD_TOOLS is set)")
        pytest.skip("no host C++ compiler")
    built = subprocess.run([host, "-std=c++17", "-c", f"-I{tmp_path}", str(tmp_path / "gn_stubs.cpp"), "-o",
                            str(tmp_path / "gn_stubs.o")], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-4000:]
    hip = ROOT / "hip" / "group_norm"
    header = '#define RSD_GN_KERNELS\n#include "gn_registry.h"\n'
    resident = tmp_path / "resident.cu"
    resident.write_text(f'#include "{hip / "group_norm_resident.hip"}"\n' + header
                        + registrations("register_resident", ("group_norm_resident_f", "group_norm_resident_b")))
    resident_nhwc = tmp_path / "resident_nhwc.cu"
    resident_nhwc.write_text(f'#include "{hip / "group_norm_resident_nhwc.hip"}"\n' + header
                             + "template <> struct gn_test::Letter<rsd::gn::Workspace> "
                               "{ static constexpr char c = 'w'; };\n"
                             + registrations("register_resident_nhwc", "group_norm_resident_nhwc_"))
    scenarios = ", ".join(f"{{{s}, {l2}, {w}}}" for s, l2, w in GN_SCENARIOS)
    extra = (GN_STUBS + registrations("register_split", ("group_norm_nchw_", "group_norm_nhwc_"))
             + f"static const GnScenario kScenarios[] = {{{scenarios}}};\n"
             + "static const GnCase kCases[] = {\n" + ",\n".join(cases) + "};\n")
    wrapped = ("cudaOccupancyMaxActiveBlocksPerMultiprocessor", "cudaLaunchKernel", "__cudaLaunchKernel",
               "__cudaGetKernel", "cudaMemsetAsync", "cudaGetLastError")
    cpp = run_driver(tmp_path, "group_norm/group_norm_split.hip", [GN_MAIN], extra=extra,
                     also=("group_norm/group_norm.hip", resident, resident_nhwc),
                     flags=(f"-I{tmp_path}", "-Xlinker", str(tmp_path / "gn_stubs.o"),
                            *(f"-Xlinker=--wrap={name}" for name in wrapped)))
    compare(cpp, expected)
    launched = [line for line in expected if line.startswith("forward |")]
    assert len(launched) > 1000 and any("memset" in line for line in launched)
    assert any("group_norm_apply_planes" in line for line in launched)
    assert any("memset" in line and "group_norm_resident_nchw<" in line for line in launched)
    assert any("memset" in line and "group_norm_resident_nhwc<" in line for line in launched)
