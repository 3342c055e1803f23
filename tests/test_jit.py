"""The runtime-compiled backend (rocm_sd/jit/) on the CPU: its disk cache (atomic entries, one compile under the
lock, damaged entries moved aside, keys), the kernel sources and the instances they provide, NVRTC compiling
every source for sm_80 / sm_90 (where libnvrtc is found), backend selection in _ext and its messages."""
import errno
import itertools
import multiprocessing
import os
import pathlib
import shutil
import subprocess
import sys
import time

import pytest
import torch

from rocm_sd import _ext, config
from rocm_sd.jit import cache as cache_module
from rocm_sd.jit import attention_plan, group_norm_plan, plans, rtc, sources
from rocm_sd.jit.backend import COVERED, JitBackend
from rocm_sd.jit.cache import KernelCache, entry_key

ROOT = pathlib.Path(__file__).resolve().parents[1]


def compiled(code: bytes = b"\x7fELF code") -> rtc.Compiled:
    return rtc.Compiled(code, {"rsd::k<float, 1>": "_Z1kIfLi1EEvv"}, compiler="test")


# ---- cache --------------------------------------------------------------------------------------------------------

def test_cache_builds_once_then_reads_from_disk(tmp_path):
    calls = []
    cache = KernelCache(tmp_path)
    first, from_disk = cache.get("unit-sm_90-abc", lambda: calls.append(1) or compiled())
    assert not from_disk and calls == [1]
    second, from_disk = KernelCache(tmp_path).get("unit-sm_90-abc", lambda: calls.append(2) or compiled(b"other"))
    assert from_disk and calls == [1]
    assert second.code == first.code and second.lowered == first.lowered


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "empty"])
def test_damaged_entry_is_moved_aside_and_compiled_again(tmp_path, damage, caplog):
    cache = KernelCache(tmp_path)
    cache.get("k", compiled)
    path = cache.path("k")
    data = path.read_bytes()
    path.write_bytes({"truncate": data[:-3], "flip": data[:-1] + bytes([data[-1] ^ 1]), "garbage": b"\x00" * 40,
                      "empty": b""}[damage])
    rebuilt, from_disk = cache.get("k", lambda: compiled(b"\x7fELF fresh"))
    assert not from_disk and rebuilt.code == b"\x7fELF fresh"
    assert [p.name for p in tmp_path.glob("k.bin.corrupt-*")], "the damaged entry was not kept aside"
    assert "damaged" in caplog.text
    assert KernelCache(tmp_path).get("k", lambda: pytest.fail("rebuilt twice"))[0].code == b"\x7fELF fresh"


def test_failed_compile_leaves_no_entry(tmp_path):
    cache = KernelCache(tmp_path)

    def broken():
        raise rtc.CompileError("syntax error")

    with pytest.raises(rtc.CompileError):
        cache.get("k", broken)
    assert not cache.path("k").exists() and not list(tmp_path.glob("*.tmp"))
    assert not cache.get("k", compiled)[1]


def entry_with_header(header: str, code: bytes = b"\x7fELF code") -> bytes:
    """An entry whose code verifies but whose header is `header` (JSON text)."""
    import hashlib
    import json

    fields = json.dumps({"code_sha256": hashlib.sha256(code).hexdigest(), "code_bytes": len(code)})[1:-1]
    return cache_module.MAGIC + header.replace("FIELDS", fields).encode() + b"\n" + code


@pytest.mark.parametrize("header", ['{"lowered": 5, FIELDS}', '{"lowered": null, FIELDS}',
                                    '{"lowered": {"k": 3}, FIELDS}', '[1, 2]', '"text"',
                                    "[" * 100_000 + "]" * 100_000],
                         ids=["lowered 5", "lowered null", "lowered symbol 3", "a list", "a string", "nested 100k"])
def test_a_malformed_header_is_damage_not_a_crash(tmp_path, header, caplog):
    """These raised TypeError / RecursionError into the op and were never set aside: every later process failed."""
    cache = KernelCache(tmp_path)
    cache.path("k").write_bytes(entry_with_header(header))
    rebuilt, from_disk = cache.get("k", lambda: compiled(b"\x7fELF fresh"))
    assert not from_disk and rebuilt.code == b"\x7fELF fresh" and "damaged" in caplog.text
    assert [p.name for p in tmp_path.glob("k.bin.corrupt-*")]
    assert KernelCache(tmp_path).get("k", lambda: pytest.fail("rebuilt twice"))[0].code == b"\x7fELF fresh"


def oserror(code):
    def fail(*args, **kwargs):
        raise OSError(code, os.strerror(code))
    return fail


def warnings_of(caplog):
    return [r.getMessage() for r in caplog.records if "compiling in memory" in r.getMessage()]


def test_a_read_only_cache_folder_compiles_in_memory_and_warns_once(tmp_path, monkeypatch, caplog):
    class ReadOnlyLock(cache_module.FileLock):
        acquire = oserror(errno.EROFS)

    monkeypatch.setattr(cache_module, "FileLock", ReadOnlyLock)
    cache = KernelCache(tmp_path)
    for key in ("a", "b", "a"):
        result, from_disk = cache.get(key, lambda: compiled(key.encode()))
        assert result.code == key.encode() and not from_disk
    [warning] = warnings_of(caplog)
    assert str(tmp_path) in warning and "Read-only file system" in warning
    assert not list(tmp_path.iterdir())


def test_a_damaged_entry_that_cannot_be_moved_aside_is_compiled_in_memory(tmp_path, monkeypatch, caplog):
    cache = KernelCache(tmp_path)
    cache.path("k").write_bytes(b"garbage")
    monkeypatch.setattr(os, "replace", oserror(errno.EROFS))  # a folder mounted read-only since the entry was written
    for _ in range(2):
        result, from_disk = cache.get("k", lambda: compiled(b"\x7fELF fresh"))
        assert result.code == b"\x7fELF fresh" and not from_disk
    assert len(warnings_of(caplog)) == 1 and "cannot be moved aside" in warnings_of(caplog)[0]
    assert cache.path("k").read_bytes() == b"garbage" and not list(tmp_path.glob("*.tmp"))


def test_a_full_disk_keeps_the_compiled_kernel(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(os, "fsync", oserror(errno.ENOSPC))
    cache = KernelCache(tmp_path)
    result, from_disk = cache.get("k", lambda: compiled(b"\x7fELF kept"))
    assert result.code == b"\x7fELF kept" and not from_disk
    [warning] = warnings_of(caplog)
    assert "No space left on device" in warning
    assert not cache.path("k").exists() and not list(tmp_path.glob("*.tmp"))
    monkeypatch.undo()
    assert not KernelCache(tmp_path).get("k", compiled)[1]  # nothing half-written was left to read


@pytest.mark.parametrize("obstacle", ["cache folder is a file", "entry is a folder", "lock is a folder"])
def test_a_path_of_the_wrong_kind_compiles_in_memory(tmp_path, obstacle, caplog):
    folder = tmp_path / "jit"
    if obstacle == "cache folder is a file":
        folder.write_text("not a folder")
    else:
        (folder / ("k.bin" if obstacle == "entry is a folder" else "k.bin.lock")).mkdir(parents=True)
    left_alone = sorted(tmp_path.rglob("*"))
    leftovers = lambda: sorted(p for p in tmp_path.rglob("*") if not (p.is_file() and p.name.endswith(".lock")))
    with config.override(jit_cache=str(folder)):
        cache = KernelCache()
    for _ in range(2):
        result, from_disk = cache.get("k", lambda: compiled(b"\x7fELF here"))
        assert result.code == b"\x7fELF here" and not from_disk
    assert len(warnings_of(caplog)) == 1, caplog.text
    assert leftovers() == left_alone  # nothing moved, nothing left behind (but the usual lock file)


def _slow_build(folder: str, marker: str) -> bytes:
    def build():
        with open(marker, "a") as f:
            f.write("built\n")
        time.sleep(1.0)
        return compiled(b"\x7fELF shared")

    return KernelCache(pathlib.Path(folder)).get("shared", build)[0].code


def test_processes_compiling_at_once_compile_once(tmp_path):
    marker = tmp_path / "builds.txt"
    with multiprocessing.get_context("spawn").Pool(3) as pool:
        codes = pool.starmap(_slow_build, [(str(tmp_path / "cache"), str(marker))] * 3)
    assert codes == [b"\x7fELF shared"] * 3
    assert marker.read_text().count("built") == 1


def test_key_changes_with_everything_that_changes_the_code():
    base = dict(unit="geglu", source_hash="s", options=["-O3"], arch="sm_90", compiler="nvrtc 13.0",
                runtime="CUDA 13.0")
    keys = {entry_key(**base)}
    for field, other in (("source_hash", "t"), ("options", ["-O2"]), ("arch", "sm_80"), ("compiler", "nvrtc 12.8"),
                         ("runtime", "CUDA 12.8"), ("unit", "layer_norm")):
        keys.add(entry_key(**{**base, field: other}))
    assert len(keys) == 7
    assert entry_key(**base) == entry_key(**base)


def test_cache_folder_follows_the_setting(tmp_path):
    with config.override(jit_cache=str(tmp_path / "jit")):
        assert KernelCache().folder == tmp_path / "jit"
    with config.override(jit_cache=None):
        assert KernelCache().folder.parts[-2:] == ("rocm_sd", "jit")


# ---- sources and instances ------------------------------------------------------------------------------------------

def test_sources_are_found_and_hashed(tmp_path):
    root = sources.source_root()
    assert root is not None and all((root / unit.path).is_file() for unit in sources.UNITS.values())
    copy = tmp_path / "hip"
    shutil.copytree(root, copy)
    before = sources.source_hash(copy)
    (copy / "include" / "rocm_sd" / "common.h").write_text((copy / "include" / "rocm_sd" / "common.h").read_text()
                                                          + "\n// changed\n")
    sources.source_hash.cache_clear()
    assert sources.source_hash(copy) != before


def test_every_planned_launch_names_a_compiled_instance():
    """The instance each plan picks is among its unit's name expressions, for every dtype, alignment, layout, size
    and wave size the plans can meet (else the first such call would find no kernel)."""
    provided = {name: set(unit.expressions) for name, unit in sources.UNITS.items()}
    pointers = (0x10000, 0x10002, 0x10004, 0x10008)
    seen = set()
    for dtype in (0, 1, 2):
        for p in pointers:
            for size in (1, 2, 3, 4, 8, 320, 1280):
                for layout in (0, 1):
                    seen.add(plans.bias_residual_plan(p, p, p, p, dtype, layout, 2, size, size, 1.0, 80))
                seen.add(plans.parity_shuffle_plan(p, 0, p, dtype, 1, 4, 4, size, 80))
                for q in pointers:
                    seen.add(plans.quantize_rows_plan(p, q, 0x1000, dtype, 0, 5, size, 32))
                    for wave in (32, 64):
                        seen.add(plans.geglu_plan(p, p, dtype, 3, size, 80, wave))
                        if not plans.geglu_check(p, p, dtype, 3, size, q, 0x1000, 0):
                            seen.add(plans.geglu_plan(p, p, dtype, 3, size, 80, wave, q, 0x1000, 0))
            for d, rope, wave in itertools.product((1, 2, 6, 40, 64, 128, 4096, 8192), (0, 0x40000), (32, 64)):
                for pdtype, lead in itertools.product({dtype, 0}, (0, p)):
                    args = (p, 0x50000, lead, 0x50000, rope, rope, p, dtype, pdtype, [2, 77, 5 if lead else 0, 3, d],
                            [77 * 3 * d, 3 * d, d], [5 * 3 * d, 3 * d, d] if lead else [0, 0, 0], 1e-6)
                    if not plans.rms_norm_check(*args):
                        seen.add(plans.rms_norm_plan(*args, wave))
            for c in (1, 8, 77, 320, 768, 1280, 2048, 4096, 8192):
                for wave in (32, 64):
                    for pdtype in {dtype, 0}:
                        for residual, q in itertools.product((0, 0x20000), (0, 0x30000)):
                            args = (p, p, 0, 0, dtype, pdtype, 4, c, 1e-5, wave, residual, residual, q, q, 2)
                            if not plans.layer_norm_check(*args):
                                seen.add(plans.layer_norm_plan(*args))
                    for gate, stride in itertools.product((0, p), ((6 * c, 1), (6 * c + 1, 1), (1, 4))):
                        args = (p, p, p, p, dtype, 2, 77, c, stride, stride, 1e-6, wave, gate, gate, stride, gate)
                        if not plans.ada_layer_norm_check(*args):
                            seen.add(plans.ada_layer_norm_plan(*args))
                        quantized = (p, 0, p, p, dtype, 2, 77, c, stride, stride, 1e-6, wave, gate, gate, stride, gate,
                                     0x30000, 0x30000, 0)
                        if not plans.ada_layer_norm_check(*quantized):
                            seen.add(plans.ada_layer_norm_plan(*quantized))
                    for bias, q in itertools.product((0, p), (0, 0x30000)):
                        args = (p, bias, 0 if q else p, dtype, 3, c, q, q, 0, 0.0, wave)
                        if not plans.gelu_tanh_check(*args):
                            seen.add(plans.gelu_tanh_plan(*args[:6], 80, wave, *args[6:10]))
    for platform_, arch in (("cuda", "sm_90"), ("hip", "gfx942"), ("hip", "gfx1100"), ("hip", "gfx1201")):
        for dtype in (1, 2):
            for head_dim in range(8, 513, 8):
                for q_len, kv_len in ((77, 77), (4096, 77), (4096, 4096), (1024, 1024)):
                    sizes = [1, 2, q_len, kv_len, head_dim]
                    strides = [[8 * 4096 * 1024, 1024, 512]] * 4
                    args = (0x1000, 0x2000, 0x3000, 0x4000, dtype, sizes, strides, 0.125, platform_, arch)
                    if not attention_plan.check(*args, 0):
                        seen.add(attention_plan.plan(*args, 64, "")[0])
            for inst in attention_plan.INSTANCES:  # every instance the tuner may name
                args = (0x1000, 0x2000, 0x3000, 0x4000, dtype, [1, 2, 64, 64, inst.padded_dim],
                        [[8 * 4096 * 1024, 1024, 512]] * 4, 0.125, platform_, arch)
                if not attention_plan.check(*args, 0, inst.name):
                    seen.add(attention_plan.plan(*args, 32, inst.name)[0])
    seen |= _group_norm_launches()
    missing = [f"{launch.unit}: {launch.expression}" for launch in seen if launch.expression not in provided[launch.unit]]
    assert not missing, "\n".join(sorted(missing))
    assert {launch.unit for launch in seen} == set(sources.UNITS)
    group_norm = {(launch.unit, launch.expression) for launch in seen if launch.unit.startswith("group_norm")}
    unplanned = [f"{name}: {e}" for name, unit in sources.UNITS.items() if name.startswith("group_norm")
                 for e in unit.expressions if (name, e) not in group_norm]
    assert not unplanned, "compiled but never launched:\n" + "\n".join(unplanned)


def _group_norm_launches() -> set:
    """GroupNorm's launches on each path, layout, dtype, alignment, params dtype and SiLU, at shapes reaching every
    instance: NHWC rows of more than 512 threads (the 1024-thread instances), vectors spanning two groups."""
    seen = set()
    facts = group_norm_plan.Facts(132, 50 << 20)
    shapes = ((1, 64, 16, 32), (2, 320, 4096, 32), (1, 128, 512 * 512, 32), (1, 1024, 4, 1024), (1, 1200, 4, 200),
              (1, 8192, 4, 32), (1, 2048, 4, 1024), (1, 64, 1, 32), (2, 7, 77, 7), (1, 4096, 4, 512))
    for dtype, p, layout, (n, c, hw, g), silu, path in itertools.product(
            (0, 1, 2), (0x10000, 0x10002, 0x10004, 0x10008), (0, 1), shapes, (False, True), (0, 1, 2)):
        for pdtype in {dtype, 0}:
            a = group_norm_plan.Args(p, p, 0, 0, dtype, pdtype, layout, n, c, hw, g, 1e-5, silu, 0x1000, path)
            capacity = lambda *_: 1 << 20  # noqa: E731
            if not group_norm_plan.check(a) and not group_norm_plan.choose(a, capacity)[0]:
                seen.update(w for w in group_norm_plan.launches(a, facts, capacity) if isinstance(w, plans.Launch))
    return seen


# ---- NVRTC on the CPU -----------------------------------------------------------------------------------------------

def _nvrtc():
    try:
        compiler = rtc.compiler("cuda")
        rtc.options("cuda", "sm_90", pathlib.Path("."))
    except rtc.RtcUnavailable as error:
        if os.environ.get("ROCM_SD_REQUIRE_BUILD_TOOLS"):
            pytest.fail(str(error))
        pytest.skip(f"{error} (pip install nvidia-cuda-nvrtc, a few hundred MB, needs no GPU)")
    return compiler


NVRTC_ARCHS = ("sm_80", "sm_90")


def _nvrtc_compile(job: tuple[str, str]):
    """One unit compiled by NVRTC for one arch, in a worker process: the compiles run on every core at once."""
    name, arch = job
    unit, root = sources.UNITS[name], sources.source_root()
    start = time.perf_counter()
    out = rtc.compiler("cuda").compile(sources.unit_source(unit, root), unit.path.rsplit("/", 1)[-1],
                                       rtc.options("cuda", arch, root / "include"), list(unit.expressions))
    return name, arch, time.perf_counter() - start, out.code, out.lowered


@pytest.mark.build
@pytest.mark.slow  # every unit for two archs: minutes of NVRTC on two cores, both busy
def test_nvrtc_compiles_every_source():
    _nvrtc()
    jobs = [(name, arch) for arch in NVRTC_ARCHS for name in sources.UNITS]
    with multiprocessing.get_context("fork").Pool(os.cpu_count() or 1) as pool:
        results = list(pool.imap_unordered(_nvrtc_compile, jobs))
    assert sorted((name, arch) for name, arch, *_ in results) == sorted(jobs)
    for name, arch, _, code, lowered in results:
        unit = sources.UNITS[name]
        assert code[:4] == b"\x7fELF", f"{name} {arch}: not a cubin"
        assert sorted(lowered) == sorted(unit.expressions), f"{name} {arch}"
        for symbol in lowered.values():  # every instance's entry is in the cubin under its lowered name
            assert symbol.encode() in code, f"{name} {arch}: {symbol} not in the cubin"
    print("NVRTC: " + ", ".join(f"{name} {arch} {seconds:.1f} s" for name, arch, seconds, *_ in sorted(results)))


def test_compile_errors_carry_the_log():
    compiler = _nvrtc()
    with pytest.raises(rtc.CompileError, match="broken.cu.*(error|expected)"):
        compiler.compile("__global__ void k() { this is not C++ }", "broken.cu", ["--gpu-architecture=sm_90"], [])


# ---- missing compilers: clear messages ----------------------------------------------------------------------------

def test_missing_nvrtc_says_what_to_install():
    with pytest.raises(rtc.RtcUnavailable, match="nvidia-cuda-nvrtc"):
        rtc.compiler("cuda", nvrtc_candidates=["/nonexistent/libnvrtc.so.13"])


def test_missing_hiprtc_names_hip_python(monkeypatch):
    monkeypatch.setattr(rtc, "loaded_library", lambda fragment: None)
    monkeypatch.setenv("ROCM_PATH", "/nonexistent")
    monkeypatch.setattr(rtc.ctypes, "CDLL", lambda *a, **k: (_ for _ in ()).throw(OSError("not found")))
    with pytest.raises(rtc.RtcUnavailable, match="hip-python"):
        rtc.compiler("hip")


def test_missing_cuda_headers_say_so():
    with pytest.raises(rtc.RtcUnavailable, match="cuda_fp16.h"):
        rtc.options("cuda", "sm_90", pathlib.Path("."), cuda_includes=[])


# ---- backend selection (_ext) -------------------------------------------------------------------------------------

@pytest.fixture
def fake_gpu(monkeypatch):
    """torch claims one CUDA GPU; _ext's choice is undone afterwards."""
    monkeypatch.setattr(_ext.platform, "torch_gpu_platform", lambda: "cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(_ext, "_C", _ext._C)
    monkeypatch.setattr(_ext, "_jit", None)
    _ext._device_reason.cache_clear()
    yield
    _ext._device_reason.cache_clear()


def test_without_c_the_jit_backend_takes_over(fake_gpu, monkeypatch):
    monkeypatch.setattr(JitBackend, "unavailable_reason", lambda self: None)
    monkeypatch.setattr(_ext, "BUILT", None)
    with config.override(kernels="auto"):
        assert _ext.unavailable_reason(torch.device("cuda", 0)) is None
    assert isinstance(_ext._C, JitBackend) and _ext.source() == "JIT"
    assert callable(_ext._C.geglu_forward) and _ext.build_info()["targets"].endswith("(JIT)")


def test_jit_forced_even_with_c(fake_gpu, monkeypatch):
    monkeypatch.setattr(JitBackend, "unavailable_reason", lambda self: None)
    monkeypatch.setattr(_ext, "BUILT", object())  # a built library that would have been taken otherwise
    with config.override(kernels="jit"):
        assert _ext.unavailable_reason(torch.device("cuda", 0)) is None
    assert _ext.source() == "JIT"


def test_built_only_never_compiles(fake_gpu, monkeypatch):
    monkeypatch.setattr(_ext, "BUILT", None)
    monkeypatch.setattr(JitBackend, "unavailable_reason", lambda self: pytest.fail("the JIT was consulted"))
    with config.override(kernels="built"):
        assert _ext.unavailable_reason(torch.device("cuda", 0)) == _ext.LOAD_ERROR


def test_both_reasons_when_neither_can_run(fake_gpu, monkeypatch):
    monkeypatch.setattr(_ext, "BUILT", None)
    monkeypatch.setattr(JitBackend, "unavailable_reason", lambda self: "jit: hiprtc not found (hip-python)")
    with config.override(kernels="auto"):
        why = _ext.unavailable_reason(torch.device("cuda", 0))
    assert why.startswith(_ext.LOAD_ERROR) and "runtime compilation is not possible either" in why
    assert "hip-python" in why and _ext.source() == "none"


def test_cpu_tensors_keep_the_old_reason():
    assert _ext.unavailable_reason(torch.device("cpu")) == (_ext.LOAD_ERROR if _ext.BUILT is None else
                                                           "device: tensors are on cpu, kernels run on the GPU")


def test_the_setting_is_checked(monkeypatch, caplog):
    monkeypatch.setenv("ROCM_SD_KERNELS", "compile")
    assert config.refresh().kernels == "auto" and "ROCM_SD_KERNELS" in caplog.text
    monkeypatch.setenv("ROCM_SD_KERNELS", "JIT")
    assert config.refresh().kernels == "jit"
    monkeypatch.delenv("ROCM_SD_KERNELS")
    config.refresh()


class _RecordingRuntime:
    """Records what the backend enqueues; occupancy answers `warps` blocks of 32-thread warps a multiprocessor."""

    def __init__(self, warps=64):
        self.calls, self.warps = [], warps

    def occupancy(self, function, block, shared=0):
        return self.warps // ((block + 31) // 32)

    def memset(self, pointer, nbytes, stream):
        self.calls.append(("memset", pointer, nbytes, stream))

    def launch(self, function, grid, block, shared, stream, signature, args):
        self.calls.append(("launch", function, grid, block, stream))


@pytest.fixture
def gn_backend(monkeypatch):
    """A JIT backend on a fake device 0 (132 multiprocessors, wave 32, 50 MiB L2) whose kernels are their name
    expressions and whose runtime records (nothing is compiled or launched)."""
    from rocm_sd.jit import backend as backend_module

    backend = JitBackend("cuda")
    backend._device_facts[0] = (132, 32)
    backend._l2[0] = 50 << 20
    backend._runtime = _RecordingRuntime()
    monkeypatch.setattr(backend, "_function", lambda device, unit, expression: expression)
    monkeypatch.setattr(backend_module, "_current_device", lambda: 0)
    return backend


def test_group_norm_is_covered_with_the_c_signatures(gn_backend):
    """group_norm's check, describe, workspace and forward take bindings.cpp's arguments (path and input_bias
    defaulted) and answer as group_norm.hip: one block a group (NCHW) or an image (NHWC) runs resident, else split;
    a forced resident path with an exchange asks the occupancy and zeroes the counters before its launch."""
    b = gn_backend
    assert "group_norm" in COVERED
    x, y = 0x100000, 0x200000
    assert b.group_norm_check(x, y, 0, 0, 1, 1, 0, 2, 320, 4096, 32, 1e-5, True, 0) == ""
    assert b.group_norm_check(x, y, 0, 0, 1, 1, 0, 2, 320, 4096, 33, 1e-5, True, 0) == \
        "channels must be divisible by groups"
    assert b.group_norm_describe(x, y, 1, 0, 2, 1280, 64, 32, 0) == "resident vec=8 blocks_per_group=1"
    assert b.group_norm_workspace_bytes(x, y, 1, 0, 2, 1280, 64, 32, 0) == 0
    assert b.group_norm_describe(x, y, 1, 1, 2, 64, 16, 32, 0) == "resident vec=2 blocks_per_image=1"
    assert b.group_norm_describe(x, y, 1, 0, 2, 320, 4096, 32, 0) == "split vec=8"
    assert b.group_norm_describe(x, y, 1, 0, 2, 320, 4096, 32, 0, path=1) == "resident vec=8 blocks_per_group=5"
    # counters (1 + n * groups, 256-byte rounded), then a partial per block
    assert b.group_norm_workspace_bytes(x, y, 1, 0, 2, 320, 4096, 32, 0, path=1) == 512 + 64 * 5 * 12
    b._runtime.warps, b._capacity = 0, {}  # the runtime cannot tell: refused, as in C++
    assert b.group_norm_describe(x, y, 1, 0, 2, 320, 4096, 32, 0, path=1) == \
        "error: the resident GroupNorm path cannot hold a group of this size and layout on this device"
    with pytest.raises(RuntimeError, match="resident GroupNorm path cannot hold"):
        b.group_norm_forward(x, y, 0, 0, 1, 1, 0, 2, 320, 4096, 32, 1e-5, True, 0x700000, 7, 0, 1)
    b._runtime.warps = 64
    b.group_norm_forward(x, y, 0, 0, 1, 1, 0, 2, 320, 4096, 32, 1e-5, True, 0x700000, 7, 0, 1)
    assert b._runtime.calls == [("memset", 0x700000, 512, 7),
                                ("launch", "rsd::gn::group_norm_resident_nchw<__half, __half, 8, true>", 320, 256, 7)]
    b._runtime.calls.clear()
    b.group_norm_forward(x, y, 0, 0, 1, 0, 1, 2, 320, 4096, 32, 1e-5, False, 0x700000, 7, 0, input_bias=0x300000)
    assert [c[1] for c in b._runtime.calls] == ["rsd::gn::group_norm_stats_nhwc<__half, 2, 1, 512>",
                                               "rsd::gn::group_norm_finalize",
                                               "rsd::gn::group_norm_apply_nhwc<__half, float, 2, false, 512>"]
    with pytest.raises(RuntimeError, match="misaligned"):
        b.group_norm_forward(x + 1, y, 0, 0, 1, 1, 0, 2, 320, 4096, 32, 1e-5, True, 0, 0, 0)
    assert set(COVERED) >= {"bias_residual", "parity_shuffle", "geglu", "quantize_rows", "layer_norm", "attention",
                            "rms_norm"}


def test_rms_norm_is_covered_with_the_c_signatures(gn_backend):
    """rms_norm's check and forward take bindings.cpp's arguments: Flux's joint Q (a fused QKV view, 512 text rows,
    rope) gets 16 lanes a row of 8-wide bf16 vectors, 16 rows a block; a misaligned cos table is refused."""
    b = gn_backend
    sizes, x_stride, lead_stride = [1, 4096, 512, 24, 128], [4096 * 9216, 9216, 128], [512 * 3072, 3072, 128]
    args = [0x100000, 0x300000, 0x400000, 0x300100, 0x500000, 0x600000, 0x200000, 2, 2, sizes, x_stride, lead_stride,
            1e-6]
    assert "rms_norm" in COVERED and b.rms_norm_check(*args, 0) == ""
    b.rms_norm_forward(*args, 7, 0)
    assert b._runtime.calls == [("launch", "rsd::rms_norm_rows<rsd::bf16, rsd::bf16, 8, 1, true>", 4608 * 24 // 16,
                                 256, 7)]
    args[4] = 0x500002
    assert b.rms_norm_check(*args, 0) == "misaligned data pointer"
    with pytest.raises(RuntimeError, match="misaligned"):
        b.rms_norm_forward(*args, 7, 0)


def test_attention_instances_and_refusals():
    backend = JitBackend("hip")
    names = backend.attention_instances()
    assert len(names) == len(set(names)) == 66 and "f16_d64_w4_r2_n64" in names and "bf16_d512_w4_r2_n16_wide" in names
    assert sum(name.endswith(("_kv1", "_kv2")) for name in names) == 16 and "bf16_d160_w4_r1_n64_kv1" in names
    assert backend.attention_refused_instances("gfx1100") == ["f16_d512_w4_r2_n16_wide", "bf16_d512_w4_r2_n16_wide"]
    assert backend.attention_refused_instances("gfx942:sramecc+:xnack-") == []
    assert backend.attention_refused_instances("gfx1201") == []  # gfx12 fits them (bench/results/amd-resources-*.md)
    backend._arches[0] = "gfx1100"
    backend._device_facts[0] = (64, 32)
    args = (0x1000, 0x2000, 0x3000, 0x4000, 1, [2, 8, 4096, 4096, 512], [[8 * 512 * 4096, 512, 512 * 0 + 64]] * 4,
            0.125, 0)
    assert "strides" not in backend.attention_check(*args)
    assert backend.attention_describe(*args).startswith("f16_d512_w4_r1_n16_wide grid=256x8x2")  # r2 spills on RDNA3


def test_forward_raises_the_check_before_anything_launches():
    backend = JitBackend("cuda")
    backend._device_facts[0] = (80, 32)
    with pytest.raises(RuntimeError, match="misaligned"):
        backend.geglu_forward(0x1001, 0x2000, 1, 4, 64, 0, 0)
    with pytest.raises(RuntimeError, match="empty tensor"):
        backend.layer_norm_forward(0x1000, 0x2000, 0, 0, 1, 1, 0, 64, 1e-5, 0, 0)


def test_info_names_the_jit_and_its_cache(fake_gpu, monkeypatch, tmp_path):
    from rocm_sd import info

    monkeypatch.setattr(JitBackend, "unavailable_reason", lambda self: None)
    monkeypatch.setattr(JitBackend, "compiler", lambda self: type("C", (), {"label": "NVRTC (test)"})())
    monkeypatch.setattr(_ext, "BUILT", None)
    with config.override(kernels="auto", jit_cache=str(tmp_path)):
        _ext.unavailable_reason(torch.device("cuda", 0))
        _ext._C.compiles[("geglu", "sm_90")] = (0.25, False)
        line = info._kernel_source()
    assert line.startswith("runtime-compiled (JIT) with NVRTC (test)") and str(tmp_path) in line
    assert "geglu sm_90 0.2" in line


def test_a_first_use_inside_graph_capture_says_so(monkeypatch, tmp_path):
    """Loading a module is refused while a graph is captured: the error says to run the model once first."""
    from rocm_sd.jit.launch import LaunchError

    class Refusing:
        def load(self, code):
            raise LaunchError("module load failed: operation not permitted when stream is capturing (900)")

    backend = JitBackend("cuda", KernelCache(tmp_path))
    backend._arches[0] = "sm_90"
    monkeypatch.setattr(backend, "compile_unit", lambda unit, arch: (compiled(), True))
    monkeypatch.setattr(backend, "runtime", lambda: Refusing())
    monkeypatch.setattr(torch.cuda, "device", lambda index: __import__("contextlib").nullcontext())
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(LaunchError, match="graph was being captured.*run the model once"):
        backend._load(0, "geglu")
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    with pytest.raises(LaunchError, match="^module load failed"):
        backend._load(0, "geglu")


@pytest.mark.gpu
def test_a_first_load_needs_no_earlier_gpu_work(tmp_path):
    """A process whose first GPU call is the JIT's module load (bench_jit, a warm-up compiling ahead of the model)
    has no current context yet: the backend makes torch's primary context current instead of failing."""
    code = ("import pathlib, sys, torch\n"
            "from rocm_sd.jit.backend import JitBackend\n"
            "from rocm_sd.jit.cache import KernelCache\n"
            "backend = JitBackend(cache=KernelCache(pathlib.Path(sys.argv[1])))\n"
            "why = backend.unavailable_reason()\n"
            "sys.exit(why) if why else backend._load(torch.cuda.current_device(), 'geglu')\n"
            "print('loaded', len(backend._functions))\n")
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.startswith("loaded"), result.stderr[-3000:]
