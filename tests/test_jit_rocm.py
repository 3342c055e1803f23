"""The runtime-compiled backend in the current-ROCm lane: hiprtc (the sid root's libhiprtc, HIP 6.4 / clang 21)
compiles every JIT kernel source for gfx942, gfx1100 and gfx1201 on the CPU, exactly as rocm_sd/jit/ does on a
user's GPU at first use, and the code objects' resources equal those of the hipcc build in the committed table
(bench/results/amd-resources-<toolchain>.json): the same kernels, not a slower variant. Nothing runs on a GPU.

Needs root and ROCM_SD_SID_ROOT, as tests/test_build_rocm.py."""
import json
import sys
import time

import pytest

from tests.test_build_rocm import ROOT, in_root, sid_root

sys.path.insert(0, str(ROOT / ".ci"))
import amd_resources  # noqa: E402

from rocm_sd.jit import sources  # noqa: E402

pytestmark = [pytest.mark.build, pytest.mark.slow]
ARCHS = ["gfx942", "gfx1100", "gfx1201"]
# Equal to the letter: what decides occupancy, memory traffic and correctness of the exchange.
RESOURCES = ("agpr", "vgpr_spill", "sgpr_spill", "scratch", "dynamic_stack", "lds", "max_workgroup",
             "waves_per_simd", "matrix", "load128", "wave")
# hiprtc's driver (comgr) compiles otherwise than hipcc in details (-mllvm -amdgpu-internalize-symbols, its own
# runtime header): measured with HIP 6.4 / clang 21, every kernel has the build's registers and occupancy except
# 16 gfx1201 attention kernels with one VGPR more (same waves per SIMD) and up to 9 instructions apart, and
# quantize_rows_kernel<float, 4> with 98 SGPRs against the build's 100 on gfx942 (same waves per SIMD). Allowed:
VGPR_SLACK = 2
SGPR_SLACK = 4
INSTRUCTION_SLACK = 0.01  # of the build's count, plus one (padding between kernels goes to the one before it)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    sid_root()
    out = tmp_path_factory.mktemp("jit_code_objects")
    start = time.monotonic()
    result = in_root("/usr/bin/python3", ROOT / ".ci" / "jit_compile.py", out, *ARCHS)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-6000:]
    print(f"rocm lane: hiprtc compiled every JIT source for {', '.join(ARCHS)} in {time.monotonic() - start:.0f} s:\n"
          + result.stdout)
    objects = [(path.stem.rsplit("-", 1)[1], path) for path in sorted(out.glob("*.co"))]
    return json.loads((out / "compiled.json").read_text()), amd_resources.read_kernels(objects, out)


def test_every_instance_compiles_for_each_arch(compiled):
    report, kernels = compiled
    for arch in ARCHS:
        for unit in sources.UNITS.values():
            lowered = report["units"][f"{unit.name}-{arch}"]["lowered"]
            assert sorted(lowered) == sorted(unit.expressions), f"{unit.name} {arch}"
        mangled = {k["mangled"] for k in kernels[arch]}
        expected = {symbol for name, entry in report["units"].items() if name.endswith(f"-{arch}")
                    for symbol in entry["lowered"].values()}
        assert expected <= mangled, f"{arch}: instances without a kernel in the code objects"
        wave = 64 if arch.startswith("gfx9") else 32
        assert {k["wave"] for k in kernels[arch]} == {wave}, arch


def test_resources_equal_the_build_table(compiled):
    _, kernels = compiled
    (table_path,) = sorted((ROOT / "bench" / "results").glob("amd-resources-hipcc*.json"))[-1:]
    table = amd_resources.load(table_path)
    problems = []
    for arch in ARCHS:
        built = {k["name"]: k for k in table["targets"][arch]}
        for k in kernels[arch]:
            if k["name"] not in built:
                problems.append(f"{arch} {k['name']}: not in the build's table")
                continue
            ref = built[k["name"]]
            differ = {c: (k[c], ref[c]) for c in RESOURCES if k[c] != ref[c]}
            if abs(k["vgpr"] - ref["vgpr"]) > VGPR_SLACK:
                differ["vgpr"] = (k["vgpr"], ref["vgpr"])
            if abs(k["sgpr"] - ref["sgpr"]) > SGPR_SLACK:
                differ["sgpr"] = (k["sgpr"], ref["sgpr"])
            if abs(k["instructions"] - ref["instructions"]) > 1 + INSTRUCTION_SLACK * ref["instructions"]:
                differ["instructions"] = (k["instructions"], ref["instructions"])
            if differ:
                problems.append(f"{arch} {k['name']}: (JIT, build) {differ}")
    assert not problems, f"{len(problems)} kernels differ from {table_path.name}:\n" + "\n".join(problems[:40])
