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
pytestmark = pytest.mark.build

SMS = (1, 80, 132, 304)
WAVES = (32, 64)
POINTERS = (0x10000, 0x10002, 0x10004, 0x10008, 0x10010)  # alignments 16 and less
DTYPES = (0, 1, 2)

STUBS = """
#include <cstdio>
#include <string>
namespace rsd {
int g_sms = 80, g_wave = 32;
int device_attribute(int, Attr which, int fallback) {
  return which == Attr::multiprocessors ? g_sms : which == Attr::wave_size ? g_wave : fallback;
}
DeviceGuard::DeviceGuard(int) {}
DeviceGuard::~DeviceGuard() {}
}  // namespace rsd
using namespace rsd;
static const void* P(unsigned long long p) { return reinterpret_cast<const void*>(p); }
static void* M(unsigned long long p) { return reinterpret_cast<void*>(p); }
static void out(const std::string& s) { std::printf("%s\\n", s.c_str()); }
"""


def run_driver(tmp_path, source: str, body: list[str], extra: str = "", also: tuple = ()) -> list[str]:
    """Builds and runs a driver that includes hip/<source> and runs `body` in main(); `also`: more sources
    compiled beside it (their anonymous namespaces stay theirs)."""
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
                             "-code=compute_80", "-x", "cu", str(driver), *[str(ROOT / "hip" / s) for s in also], "-o", str(exe)],
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    return subprocess.run([str(exe)], check=True, capture_output=True, text=True, timeout=60).stdout.splitlines()


def compare(cpp: list[str], python: list[str]) -> None:
    assert len(cpp) == len(python)
    mismatches = [f"C++ {c!r} != Python {p!r}" for c, p in zip(cpp, python) if c != p]
    assert not mismatches, f"{len(mismatches)} of {len(cpp)} differ:\n" + "\n".join(mismatches[:20])


def test_shared_helpers_match_launch_h(tmp_path):
    body, expected = [], []
    for dtype, unit, a, b in itertools.product(DTYPES, (1, 2, 3, 4, 8, 12, 16, 77, 320), POINTERS, POINTERS):
        body.append(f'out(std::to_string(widest_vec(DType({dtype}), {unit}, {{P({a}), P({b})}})));')
        expected.append(str(plans.widest_vec(dtype, unit, (a, b))))
    for sms, work, threads in itertools.product(SMS, (0, 1, 255, 256, 257, 10**5, 10**8), (64, 256)):
        body.append(f"g_sms = {sms}; out(std::to_string(grid_stride_blocks(0, {work}LL, {threads})));")
        expected.append(str(plans.grid_stride_blocks(sms, work, threads)))
    for d in (1, 2, 3, 7, 64, 77, 320, 1000, 4096, 65535, 2**31 - 1, 2**31, 2**32 - 1):
        body.append(f"{{ FastDiv f({d}u); out(std::to_string(f.divisor) + ' ' + std::to_string(f.multiplier) + ' ' + "
                    f"std::to_string(f.shift)); }}")
        fd = FastDiv.of(d)
        expected.append(f"{fd.divisor} {fd.multiplier} {fd.shift}")
    compare(run_driver(tmp_path, "geglu/geglu.hip", body), expected)


def test_layer_norm_plan_matches_its_launcher(tmp_path):
    body, expected = [], []
    quantized = ((0, 0, 0), (0x60000, 0x70000, 1), (0x60004, 0x70000, 2), (0x60000, 0, 0), (0x60000, 0x70000, 7))
    for wave, dtype, pdtype, c, x, res, (q, scale, fmt) in itertools.product(
            WAVES, DTYPES, (0, 1, 2), (1, 3, 8, 77, 320, 768, 1280, 2048, 4096, 8192, 20000), POINTERS[:4],
            (0, 0x20000, 0x20002), quantized):
        total = res + 0x100000 if res else 0
        args = f"LayerNormArgs{{P({x}), M({x} + 0x40000), P(0), P(0), DType({dtype}), DType({pdtype}), 7, {c}, 1e-5f, " \
               f"nullptr, 0, P({res}), M({total}), M({q}), (float*)M({scale}), QuantFormat({fmt})}}"
        # what the launcher decides: vector width, vectors a lane, and whether the quantizing instance runs
        body.append(f"{{ g_wave = {wave}; LayerNormArgs a = {args}; std::string why = layer_norm_check(a); "
                    f"out(why.empty() ? std::to_string(pick_vec(a)) + ' ' + std::to_string(vecs_per_lane(a, "
                    f"pick_vec(a))) + (a.q && pick_vec(a) == kQuantizeVec ? \" q\" : \"\") : why); }}")
        why = plans.layer_norm_check(x, x + 0x40000, 0, 0, dtype, pdtype, 7, c, 1e-5, wave, res, total, q, scale, fmt)
        if why:
            expected.append(why)
        else:
            launch = plans.layer_norm_plan(x, x + 0x40000, 0, 0, dtype, pdtype, 7, c, 1e-5, wave, res, total, q, scale,
                                           fmt)
            vec, vecs, _, quantize = launch.expression.rstrip(">").split(", ")[2:6]
            expected.append(f"{vec} {vecs}" + (" q" if quantize == "true" else ""))
            assert launch.args[-1] == (q, scale, fmt)
    cpp = run_driver(tmp_path, "layer_norm/layer_norm.hip", body)
    # the C++ prints vecs_per_lane itself (a power of two <= 16 once the check passed): the instance it launches
    compare(cpp, expected)


def test_geglu_quantized_plan_matches_its_launcher(tmp_path):
    body, expected = [], []
    for dtype, d, x, q, scale, fmt in itertools.product(DTYPES, (1, 3, 8, 320, 1280), POINTERS, POINTERS,
                                                        (0x80000, 0x80002, 0), (0, 2, 9)):
        args = f"GegluArgs{{P({x}), M(0x50000), DType({dtype}), 5, {d}, nullptr, 0, M({q}), (float*)M({scale}), " \
               f"QuantFormat({fmt})}}"
        # geglu_forward's quantized branch narrows the vector width to q's alignment
        body.append(f"{{ GegluArgs a = {args}; std::string why = geglu_check(a); int vec = widest_vec(a.dtype, a.d, "
                    f"{{a.x, a.y}}); while (vec > 1 && !aligned(a.q, vec)) vec /= 2; "
                    f"out(why.empty() ? std::to_string(vec) : why); }}")
        why = plans.geglu_check(x, 0x50000, dtype, 5, d, q, scale, fmt)
        expected.append(why or plans.geglu_plan(x, 0x50000, dtype, 5, d, 80, 32, q, scale, fmt).expression
                        .rsplit(", ", 1)[1].rstrip(">"))
    compare(run_driver(tmp_path, "geglu/geglu.hip", body), expected)


def test_quantize_rows_plan_matches_its_launcher(tmp_path):
    body, expected = [], []
    for dtype, fmt, k, x, q in itertools.product(DTYPES, (0, 1, 2, 5), (1, 3, 8, 64, 320, 5120), POINTERS, POINTERS):
        args = f"QuantizeRowsArgs{{P({x}), M({q}), (float*)M(0x80000), DType({dtype}), QuantFormat({fmt}), 5, {k}, " \
               f"nullptr, 0}}"
        body.append(f"{{ QuantizeRowsArgs a = {args}; std::string why = quantize_rows_check(a); "
                    f"out(why.empty() ? std::to_string(pick_vec(a)) : why); }}")
        why = plans.quantize_rows_check(x, q, 0x80000, dtype, fmt, 5, k)
        expected.append(why or plans.quantize_rows_plan(x, q, 0x80000, dtype, fmt, 5, k, 32).expression
                        .rsplit(", ", 1)[1].rstrip(">"))
    compare(run_driver(tmp_path, "quantize/quantize_rows.hip", body), expected)


def test_elementwise_checks_match_their_launchers(tmp_path):
    cases = {
        "bias_residual/bias_residual.hip": [], "parity_shuffle/parity_shuffle.hip": [], "geglu/geglu.hip": []}
    expected = {name: [] for name in cases}
    for dtype, ptr, n, c, hw in itertools.product(DTYPES, POINTERS, (0, 1, 2), (0, 3, 320), (1, 4096, 2**25)):
        cases["bias_residual/bias_residual.hip"].append(
            f"out(bias_residual_check(BiasResidualArgs{{P({ptr}), P(0x30000), P(0x40000), M(0x50000), DType({dtype}), "
            f"Layout::nchw, {n}, {c}, {hw}, 1.f, nullptr, 0}}));")
        expected["bias_residual/bias_residual.hip"].append(
            plans.bias_residual_check(ptr, 0x30000, 0x40000, 0x50000, dtype, 0, n, c, hw, 1.0))
        cases["parity_shuffle/parity_shuffle.hip"].append(
            f"out(parity_shuffle_check(ParityShuffleArgs{{P({ptr}), P(0), M(0x50000), DType({dtype}), {n}, {c}, {c}, "
            f"{hw}, nullptr, 0}}));")
        expected["parity_shuffle/parity_shuffle.hip"].append(
            plans.parity_shuffle_check(ptr, 0, 0x50000, dtype, n, c, c, hw))
        cases["geglu/geglu.hip"].append(
            f"out(geglu_check(GegluArgs{{P({ptr}), M(0x50000), DType({dtype}), {n * c}, {hw}, nullptr, 0}}));")
        expected["geglu/geglu.hip"].append(plans.geglu_check(ptr, 0x50000, dtype, n * c, hw))
    for source, body in cases.items():
        compare(run_driver(tmp_path, source, body), expected[source])


ATTENTION_STUBS = """
namespace rsd {
const char* g_arch = "sm_90";
std::string device_info(int, DeviceInfo* out) { out->arch = g_arch; return std::string(); }
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
        device = 0 if arch == "sm_90" else 1  # the C++ caches each device's matrix-unit policy
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
