"""The current ROCm toolchain lane: `_C` configured, compiled and linked with CMake (ROCM_SD_GPU=hip) by Debian
sid's hipcc 7 / clang 21 for the default GPU_TARGETS, inside the sid root of .ci/rocm_toolchain.sh, then
checked from its code objects: it loads (no GPU here, so it may only fail at "no device"), holds a code object
per target, and its kernel resource table (.ci/amd_resources.py) has no scratch or spills, matrix
instructions in every attention kernel, LDS within each arch's limit, no occupancy below the committed table and
instruction counts no higher (matrix instructions: equal), except the gaps tests/amd_known_gaps.json lists, exactly (a new gap fails, and so does a fixed one until it
leaves the list). Nothing runs on a GPU.

Needs root and ROCM_SD_SID_ROOT (.ci/run sets both; locally: `export ROCM_SD_SID_ROOT=$(.ci/rocm_toolchain.sh
ensure)`). ROCM_SD_WRITE_RESOURCES=1 writes the table into bench/results/ (commit it with a toolchain change)."""
import hashlib
import json
import os
import pathlib
import re
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
TOOLCHAIN = ROOT / ".ci" / "rocm_toolchain.sh"
RESULTS = ROOT / "bench" / "results"
GAPS = json.loads((pathlib.Path(__file__).with_name("amd_known_gaps.json")).read_text())
# CMakeLists.txt's default GPU_TARGETS: what the lane must link, each with a code object.
TARGETS = ["gfx90a", "gfx942", "gfx950", "gfx1100", "gfx1101", "gfx1151", "gfx1200", "gfx1201"]
LDS_LIMIT = {"gfx950": 160 * 1024}  # bytes per workgroup; 64 KiB everywhere else
MATRIX = {"gfx90a": "v_mfma", "gfx942": "v_mfma", "gfx950": "v_mfma"}  # gfx11 / gfx12: v_wmma
# The targets with FP8 matrix instructions: elsewhere the FP8 attention kernel is a stub that attention_fp8_check
# never launches (hip/attention_fp8/attention_fp8.hip).
FP8_MATRIX = ("gfx942", "gfx950", "gfx1200", "gfx1201")

pytestmark = [pytest.mark.build, pytest.mark.slow]  # CMake builds of _C: the default run skips them

sys.path.insert(0, str(ROOT / ".ci"))
import amd_resources  # noqa: E402


def sid_root():
    root = os.environ.get("ROCM_SD_SID_ROOT")
    if not root or not pathlib.Path(root, "usr/bin/hipcc").exists():
        if os.environ.get("ROCM_SD_REQUIRE_BUILD_TOOLS"):
            pytest.fail("ROCM_SD_SID_ROOT is not a sid ROCm root (ROCM_SD_REQUIRE_BUILD_TOOLS is set; .ci/run makes it)")
        pytest.skip("no sid ROCm root (ROCM_SD_SID_ROOT; .ci/rocm_toolchain.sh ensure)")
    if os.geteuid() != 0:
        pytest.skip("the sid root is entered with chroot: needs root")
    return root


def in_root(*command, env=None, timeout=3600):
    """Runs command (the root's tools by absolute path) inside the sid root, in this directory."""
    return subprocess.run([str(TOOLCHAIN), "exec", "--", *map(str, command)], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout)


def timed(step, *command, env=None):
    start = time.monotonic()
    result = in_root(*command, env=env)
    seconds = time.monotonic() - start
    print(f"rocm lane: {step}: {seconds:.0f} s")
    assert result.returncode == 0, f"{step} failed:\n{result.stdout[-6000:]}\n{result.stderr[-6000:]}"
    return result, seconds


def cmake_build(build: pathlib.Path, targets: str, ck_root: str) -> pathlib.Path:
    """_C configured and built by CMake in the sid root for `targets` ("" = CMakeLists.txt's defaults), with the
    Composable Kernel instances when `ck_root` names CK's headers."""
    env = {"ROCM_SD_CK_ROOT": ck_root, "GPU_TARGETS": targets, "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2)}
    timed("cmake configure", "/usr/bin/cmake", "-S", ROOT, "-B", build, "-G", "Ninja", "-DROCM_SD_GPU=hip",
          "-DCMAKE_BUILD_TYPE=Release", "-DCMAKE_HIP_COMPILER=/usr/lib/llvm-21/bin/clang++",
          "-DCMAKE_CXX_COMPILER=/usr/lib/llvm-21/bin/clang++", env=env)
    timed("compile and link _C", "/usr/bin/cmake", "--build", build, env=env)
    log = (build / ".ninja_log").read_text().splitlines()[1:]
    steps = sorted(((int(end) - int(start)) / 1000, target) for start, end, _, target, _ in
                   (line.split("\t") for line in log))
    print("rocm lane: slowest steps: " + ", ".join(f"{pathlib.Path(t).name} {s:.0f} s" for s, t in steps[::-1][:5]))
    (so,) = build.glob("_C*.so")
    return so


@pytest.fixture(scope="module")
def hip_build(tmp_path_factory):
    """_C for the default GPU_TARGETS, without CK instances (ck_build builds those, for fewer targets)."""
    sid_root()
    return cmake_build(tmp_path_factory.mktemp("hip_build"), "", "")


# CK's GEMM, attention and convolution instances come as XDL (MFMA: CDNA) and WMMA (RDNA3/4) device ops, each
# compiled only for its own targets (ck_templates/instances.py), in one build: one target of each family, CDNA3 and
# RDNA3 (MI300X and the RX 7900 series). CK's instances are the slowest sources of the CI (a quarter hour of the
# two cores per pair of targets); gfx950 and gfx1201 take the same instances, linked by the four-target CI builds up
# to 5d7948b (bench/results/amd-resources-ck-*.json holds all four), not by every CI run.
CK_TARGETS = ["gfx942", "gfx1100"]
CK_FAMILIES = {"all": sorted(CK_TARGETS), "xdl": [t for t in CK_TARGETS if t.startswith("gfx9")],
               "wmma": [t for t in CK_TARGETS if t.startswith("gfx1")]}
# CK's instruction-cache flush, which the WMMA GEMM's invoker compiles in for CK's timing runs (StreamConfig
# flush_cache, never set by rocm_sd): a helper kernel, not an instance's, with no matrix work.
CK_HELPER_KERNELS = {"ck::flush_icache"}


@pytest.fixture(scope="module")
def ck_build(tmp_path_factory):
    """_C with every generated Composable Kernel instance for CK_TARGETS, CK's headers from ROCM_SD_CK_ROOT
    (.ci/run fetches them from the amd-aiter wheel: ck_templates/ck_headers.py)."""
    sid_root()
    ck_root = os.environ.get("ROCM_SD_CK_ROOT", "")
    if not pathlib.Path(ck_root, "include", "ck").is_dir():
        if os.environ.get("ROCM_SD_REQUIRE_BUILD_TOOLS"):
            pytest.fail(f"no Composable Kernel headers under ROCM_SD_CK_ROOT={ck_root!r}")
        pytest.skip("no Composable Kernel headers (ROCM_SD_CK_ROOT; python3 ck_templates/ck_headers.py fetch DIR)")
    return cmake_build(tmp_path_factory.mktemp("ck_build"), ";".join(CK_TARGETS), ck_root)


@pytest.fixture(scope="module")
def ck_table(ck_build, tmp_path_factory):
    table = amd_resources.build_table(ck_build, tmp_path_factory.mktemp("ck_code_objects"),
                                      command="pytest tests/test_build_rocm.py (the CMake build of _C with CK "
                                              "instances for " + ";".join(CK_TARGETS) + ")")
    if os.environ.get("ROCM_SD_WRITE_RESOURCES"):
        for path in amd_resources.write(table, RESULTS, "ck"):
            print(f"rocm lane: wrote {path.relative_to(ROOT)}")
    return table


@pytest.fixture(scope="module")
def table(hip_build, tmp_path_factory):
    start = time.monotonic()
    table = amd_resources.build_table(hip_build, tmp_path_factory.mktemp("code_objects"),
                                      command="pytest tests/test_build_rocm.py (the CMake build of _C for "
                                              + ";".join(TARGETS) + ")")
    print(f"rocm lane: resource table: {time.monotonic() - start:.0f} s")
    if os.environ.get("ROCM_SD_WRITE_RESOURCES"):
        for path in amd_resources.write(table, RESULTS):
            print(f"rocm lane: wrote {path.relative_to(ROOT)}")
    return table


def test_c_links_and_loads_without_a_gpu(hip_build):
    """Every symbol resolves at load (LD_BIND_NOW), the build says it is a HIP build for the default targets, and
    the first runtime call fails only because there is no GPU."""
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); import _C; b = _C.build_info(); print(b['platform'], "
             "b['targets']); print('device:', _C.check_kernel_image(0))")
    result = in_root("/usr/bin/python3", "-c", probe, hip_build.parent, env={"LD_BIND_NOW": "1"})
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "undefined symbol" not in output, output
    assert f"hip {','.join(TARGETS)}" in output, output
    assert re.search(r"device: .*no ROCm-capable device", output), output


def test_a_code_object_per_target(table):
    """clang-offload-bundler lists every target (and the host) in each offload bundle of _C, and each target's
    code objects hold the same kernels."""
    assert table["bundles"], "no offload bundles in _C's .hip_fatbin section"
    for bundle, entries in table["bundles"].items():
        targets = sorted(e.rsplit("-", 1)[-1] for e in entries if e.startswith("hip"))
        assert targets == sorted(TARGETS), f"{bundle}: {entries}"
        assert any(e.startswith("host-") for e in entries), f"{bundle}: {entries}"
    names = {arch: {k["name"] for k in kernels} for arch, kernels in table["targets"].items()}
    assert sorted(names) == sorted(TARGETS)
    for arch in TARGETS:
        assert names[arch] == names["gfx90a"], f"{arch}: kernels differ from gfx90a's"
        assert len(names[arch]) > 100, f"{arch}: {len(names[arch])} kernels"


def _gap_check(kind, found: dict[str, list[str]], ck: bool = False):
    """found: arch ("ck:<arch>" for the CK build's kernels, with `ck`) -> offending kernels. Must equal the
    committed list exactly."""
    known = {arch: sorted(names) for arch, names in GAPS[kind].items()
             if not arch.startswith("_") and arch.startswith("ck:") == ck
             and (not ck or arch.removeprefix("ck:") in CK_TARGETS)}  # the CK gaps of the targets built here
    found = {arch: sorted(names) for arch, names in found.items() if names}
    problems = []
    for arch in sorted(set(known) | set(found)):
        new = sorted(set(found.get(arch, [])) - set(known.get(arch, [])))
        fixed = sorted(set(known.get(arch, [])) - set(found.get(arch, [])))
        if new:
            problems.append(f"{arch}: NEW {kind}: " + ", ".join(new))
        if fixed:
            problems.append(f"{arch}: no longer {kind} (remove from tests/amd_known_gaps.json): " + ", ".join(fixed))
    assert not problems, "\n".join(problems)


def test_wave_size_and_wide_loads(table):
    """wave64 on CDNA, wave32 on RDNA; the GroupNorm kernels read with 16-byte loads on every target."""
    for arch, kernels in table["targets"].items():
        wave = 64 if arch.startswith("gfx9") else 32
        assert {k["wave"] for k in kernels} == {wave}, arch
        group_norm = [k for k in kernels if "group_norm" in k["family"]]
        assert len(group_norm) >= 4 and any(k["load128"] for k in group_norm), f"{arch}: no 16-byte GroupNorm loads"


def test_no_scratch_or_spills_beyond_the_known_gaps(table):
    """Scratch (private memory: a spill or a local kept in memory), a dynamic stack, spilled VGPRs, and SGPRs
    spilled into VGPR lanes."""
    scratch, sgpr = {}, {}
    for arch, kernels in table["targets"].items():
        scratch[arch] = [k["name"] for k in kernels if k["scratch"] or k["vgpr_spill"] or k["dynamic_stack"]]
        sgpr[arch] = [k["name"] for k in kernels if k["sgpr_spill"] and not (k["scratch"] or k["vgpr_spill"])]
    _gap_check("scratch", scratch)
    _gap_check("sgpr_spills", sgpr)


def test_attention_uses_the_matrix_units(table):
    """CDNA: v_mfma; RDNA3/4: v_wmma; an arch without it is listed (with the reason docs/amd.md gives). The FP8
    attention: the same on the FP8 targets, and no code elsewhere."""
    missing = {}
    for arch, kernels in table["targets"].items():
        want = MATRIX.get(arch, "v_wmma")
        fp8 = [k for k in kernels if k["family"] == "attention_fp8"]
        assert fp8, f"{arch}: no FP8 attention kernel in the code object"
        if arch not in FP8_MATRIX:
            assert all(k["matrix"] == "none" for k in fp8), f"{arch} has no FP8 matrix instructions, yet its stub has some"
        missing[arch] = [k["name"] for k in kernels if k["family"].startswith("attention") and k["matrix"] != want
                         and (k["family"] != "attention_fp8" or arch in FP8_MATRIX)]
    _gap_check("attention_without_matrix", missing)
    amd = (ROOT / "docs" / "amd.md").read_text()
    section = amd[amd.index("## Supported AMD GPUs"):]
    for arch in GAPS["attention_without_matrix"]:
        if not arch.startswith("_"):
            assert arch in section, f"docs/amd.md's Supported AMD GPUs table does not explain {arch}"


RDNA = ("gfx1100", "gfx1101", "gfx1151", "gfx1200", "gfx1201")


def instance_name(kernel):
    """attention_kernel<bf16,48,4,1,64> -> bf16_d48_w4_r1_n64 (hip/attention/attention.hip's names), one of less
    shared memory attention_kernel<bf16,128,4,1,64,1> -> bf16_d128_w4_r1_n64_kv1; wide ones end _n16_wide."""
    dtype, dim, waves, rows, *rest = kernel[kernel.index("<") + 1:-1].split(",")
    tail = "".join(f"_{key}{value}" for key, value in zip(("n", "kv"), rest)) if rest else "_n16_wide"
    return f"{dtype}_d{dim}_w{waves}_r{rows}{tail}"


def test_rdna_refuses_exactly_the_spilling_attention_instances(hip_build, table):
    """attention_check never offers an instance that spills on RDNA (gfx11, gfx12), and refuses nothing else:
    per arch, _C's refused list equals the instances with scratch in that arch's code objects."""
    probe = ("import json, sys; sys.path.insert(0, sys.argv[1]); import _C; "
             "print(json.dumps({a: _C.attention_refused_instances(a) for a in sys.argv[2:]}))")
    result = in_root("/usr/bin/python3", "-c", probe, hip_build.parent, *TARGETS)
    assert result.returncode == 0, result.stderr
    refused = json.loads(result.stdout)
    for arch in TARGETS:
        spilling = {instance_name(k["name"]) for k in table["targets"][arch]
                    if k["family"].startswith("attention") and (k["scratch"] or k["vgpr_spill"])}
        assert arch in RDNA or not spilling, f"{arch}: attention spills where nothing is refused: {sorted(spilling)}"
        assert set(refused[arch]) == spilling, (
            f"{arch}: refused but not spilling: {sorted(set(refused[arch]) - spilling)}; "
            f"spilling but offered: {sorted(spilling - set(refused[arch]))}")


# The CDNA targets of 64 KiB of LDS a CU, where a narrow attention instance of more than 32 KiB leaves one 4-wave
# workgroup a CU (1 wave a SIMD): hip/attention/attention.hip's "_kv" instances (one template parameter more,
# attention_kernel<..., K / V tiles>) are there to fit two.
CDNA_64K_LDS = ("gfx90a", "gfx942")


def kv_instance_problems(targets) -> list[str]:
    """targets: arch -> a table's kernels. On gfx90a / gfx942 every narrow attention instance that LDS holds to one
    wave a SIMD has a "_kv" twin, and every twin fits two workgroups a CU (LDS at most 32 KiB, 2 waves a SIMD or
    more) without scratch or spills."""
    problems = []
    for arch in CDNA_64K_LDS:
        narrow = {k["name"]: k for k in targets.get(arch, []) if k["name"].startswith("attention_kernel<")}
        twins = {name: k for name, k in narrow.items() if name.count(",") == 5}
        for name, k in twins.items():
            if k["waves_per_simd"] < 2 or 2 * k["lds"] > 64 * 1024 or k["scratch"] or k["vgpr_spill"]:
                problems.append(f"{arch}: {name}: {k['waves_per_simd']} waves/SIMD ({k['limited_by']}), LDS "
                                f"{k['lds']} B, scratch {k['scratch']} B, {k['vgpr_spill']} VGPRs spilled")
        covered = {name.rsplit(",", 1)[0] + ">" for name in twins}
        for name, k in narrow.items():
            if name not in twins and k["waves_per_simd"] == 1 and k["limited_by"] == "lds" and name not in covered:
                problems.append(f"{arch}: {name}: 1 wave/SIMD for its {k['lds']} B of LDS, and no _kv instance")
    return problems


def test_kv_instances_fit_two_workgroups_a_cu_on_cdna(table):
    assert not kv_instance_problems(table["targets"]), "\n".join(kv_instance_problems(table["targets"]))


def test_lds_within_each_arch_limit(table):
    over = [f"{arch}: {k['name']} {k['lds']} B" for arch, kernels in table["targets"].items() for k in kernels
            if k["lds"] > LDS_LIMIT.get(arch, 64 * 1024)]
    assert not over, "\n".join(over)


def committed_table(toolchain):
    """The committed table of this toolchain, else the newest committed one (sid moved: compare with it)."""
    exact = RESULTS / f"amd-resources-{toolchain}.json"
    if exact.exists():
        return exact
    tables = sorted(RESULTS.glob("amd-resources-*.json"), key=lambda p: amd_resources.load(p)["date"])
    return tables[-1] if tables else None


def test_occupancy_not_below_the_committed_table(table):
    path = committed_table(table["toolchain"])
    assert path is not None, "no committed bench/results/amd-resources-*.json (ROCM_SD_WRITE_RESOURCES=1 writes one)"
    committed = amd_resources.load(path)
    worse = []
    for arch, kernels in table["targets"].items():
        before = {k["name"]: k for k in committed["targets"].get(arch, [])}
        for k in kernels:
            old = before.get(k["name"])
            if old and k["waves_per_simd"] < old["waves_per_simd"]:
                worse.append(f"{arch}: {k['name']} {old['waves_per_simd']} -> {k['waves_per_simd']} waves/SIMD "
                             f"({k['limited_by']}: VGPR {old['vgpr']} -> {k['vgpr']}, LDS {old['lds']} -> {k['lds']})")
    assert not worse, f"occupancy below {path.relative_to(ROOT)}:\n" + "\n".join(worse)


def test_instruction_counts_against_the_committed_table(table):
    """Per kernel: matrix instructions (whole kernel and key loop) exactly as committed; instructions and LDS
    instructions (whole kernel and one pass of the key loop) not above; every attention kernel with matrix code
    has a key loop."""
    path = committed_table(table["toolchain"])
    assert path is not None, "no committed bench/results/amd-resources-*.json (ROCM_SD_WRITE_RESOURCES=1 writes one)"
    problems = amd_resources.count_regressions(table["targets"], amd_resources.load(path)["targets"])
    assert not problems, (f"instruction counts against {path.relative_to(ROOT)} (ROCM_SD_WRITE_RESOURCES=1 writes "
                          f"the table; commit it where the change is meant):\n" + "\n".join(problems[:60]))


def _ck_kernels(table, arch):
    return [k for k in table["targets"][arch] if k["name"].startswith("ck::")]


def ck_id(name: str) -> str:
    """A CK kernel's template name runs to kilobytes: its base name and a hash of the whole, for the gap lists."""
    return f"{re.sub(r'<.*', '', name)}#{hashlib.sha1(name.encode()).hexdigest()[:10]}"


def _ck_instance_names(arch: str = "") -> dict[str, list[str]]:
    """What each _C listing function must list for a GPU of `arch` ("": every instance in the build)."""
    from ck_templates.instances import (ATTENTION_INSTANCES, CONV_BIAS_RESIDUAL_INSTANCES, GROUP_NORM_INSTANCES,
                                        LINEAR_GEGLU_INSTANCES, built_targets)

    def names(instances):
        return [i.name for i in instances if built_targets(i.family, [arch] if arch else CK_TARGETS)]

    return {"ck_group_norm_instances": names(GROUP_NORM_INSTANCES),
            "ck_attention_instances": names(ATTENTION_INSTANCES),
            "ck_linear_geglu_instances": names(LINEAR_GEGLU_INSTANCES),
            "ck_conv_bias_residual_instances": names(CONV_BIAS_RESIDUAL_INSTANCES)}


def test_ck_instances_are_linked_and_listed_per_arch(ck_build, ck_table):
    """Every generated instance is compiled by clang 21 for its family's targets only (XDL: gfx942, WMMA: gfx1100,
    GroupNorm: both), linked into _C and listed by it: for a GPU arch, exactly the
    instances with code for it (an XDL instance on gfx1100 would be an empty kernel, and so would a WMMA one on
    gfx942); for no arch, all of them."""
    probe = ("import json, sys; sys.path.insert(0, sys.argv[1]); import _C; "
             "print(json.dumps({a: {f: [i if isinstance(i, str) else i[0] for i in getattr(_C, f)(a)] "
             "for f in sys.argv[3:]} for a in json.loads(sys.argv[2])}))")
    arches = ["", *CK_TARGETS, "gfx942:sramecc+:xnack-", "gfx90a", "gfx950", "gfx1201", "gfx1030"]
    result = in_root("/usr/bin/python3", "-c", probe, ck_build.parent, json.dumps(arches), *_ck_instance_names(),
                     env={"LD_BIND_NOW": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
    listed = json.loads(result.stdout)
    for arch in arches:
        # gfx90a (CDNA2) is an XDL target, but not one of this build's: nothing but the build's own targets lists.
        want = _ck_instance_names(arch) if arch in ("", *CK_TARGETS) or ":" in arch else \
            {f: [] for f in _ck_instance_names()}
        assert listed[arch] == want, arch
    assert any("_wmma_" in n for n in listed["gfx1100"]["ck_attention_instances"])
    assert not any("_wmma_" in n for n in listed["gfx942"]["ck_attention_instances"])
    families = CK_FAMILIES
    seen = set()
    for bundle, entries in ck_table["bundles"].items():
        targets = sorted(e.rsplit("-", 1)[-1] for e in entries if e.startswith("hip"))
        assert targets in families.values(), f"{bundle}: {targets}"
        seen.add(tuple(targets))
    assert seen == {tuple(t) for t in families.values()}, "a family's sources are missing"
    for arch in CK_TARGETS:
        instances = sum(len(names) for names in _ck_instance_names(arch).values())
        assert len(_ck_kernels(ck_table, arch)) >= instances, f"{arch}: CK kernels missing"


def test_ck_kernels_use_the_arch_matrix_units_without_scratch_beyond_the_known_gaps(ck_table):
    """CK's GEMM, attention and convolution kernels run on the arch's matrix instructions (v_mfma on gfx942,
    v_wmma on gfx1100; its normalization kernels have no matrix work), hold no scratch or
    spilled registers and are not empty, except the listed gaps (by ck_id), and fit the arch's LDS. An empty
    kernel (a body the CK headers compile away for this target) would leave its output unwritten: the tuner's
    check against a float64 truth refuses it, and it must never become a default."""
    scratch, sgpr, empty = {}, {}, {}
    for arch in CK_TARGETS:
        kernels = [k for k in _ck_kernels(ck_table, arch) if k["name"] not in CK_HELPER_KERNELS]
        scratch[f"ck:{arch}"] = [ck_id(k["name"]) for k in kernels if k["scratch"] or k["vgpr_spill"]
                                 or k["dynamic_stack"]]
        sgpr[f"ck:{arch}"] = [ck_id(k["name"]) for k in kernels if k["sgpr_spill"] and not (k["scratch"]
                                                                                             or k["vgpr_spill"])]
        empty[f"ck:{arch}"] = [ck_id(k["name"]) for k in kernels if k["vgpr"] == 0]
        want = MATRIX.get(arch, "v_wmma")
        without = [k["name"] for k in kernels if k["vgpr"] and "normalization" not in k["name"] and k["matrix"] != want]
        assert not without, f"{arch}: CK kernels without {want}: {without}"
        # Each GEMM / attention / convolution instance has kernels with real matrix code here (a GEGLU instance two).
        with_matrix = sum(1 for k in kernels if k["matrix"] == want)
        names = _ck_instance_names(arch)
        needed = len(names["ck_attention_instances"]) + 2 * len(names["ck_linear_geglu_instances"]) + \
            len(names["ck_conv_bias_residual_instances"])
        assert with_matrix >= needed, f"{arch}: {with_matrix} CK kernels with {want}, want at least {needed}"
        over = [k["name"] for k in kernels if k["lds"] > LDS_LIMIT.get(arch, 64 * 1024)]
        assert not over, f"{arch}: CK kernels over the LDS limit: {over}"
    helpers = [k for arch in CK_TARGETS for k in _ck_kernels(ck_table, arch) if k["name"] in CK_HELPER_KERNELS]
    assert all(k["instructions"] < 64 and not k["scratch"] for k in helpers), helpers
    _gap_check("scratch", scratch, ck=True)
    _gap_check("sgpr_spills", sgpr, ck=True)
    _gap_check("ck_empty", empty, ck=True)
