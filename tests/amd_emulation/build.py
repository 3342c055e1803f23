"""Builds rocm_sd's kernel sources as host C++ for the CPU emulation of one AMD architecture.

The .hip files (and the emulation's entry_*.cpp) are compiled unchanged except for two textual rewrites: no C++
compiler parses a triple-chevron launch, so `kernel<<<grid, block, shmem, stream>>>(args)` becomes
`::rsd_emu::launch(kernel, grid, block, shmem, stream)(args)`; and each `__shared__` declaration is followed by a
call that poisons the variable for the running block (rewrite_shared). The architecture is chosen the way the real
compiler announces it, by the target macros (__GFX9__, __gfx942__, __gfx1100__...), and the code is compiled as
hipcc's device pass (__HIP_DEVICE_COMPILE__), so compat.h, common.h and wave_mma.h select the branches the GPU
runs and the wave size by their own rules. Builds are cached by a hash of every input under ROCM_SD_EMU_CACHE
(default ~/.cache/rocm_sd/amd_emulation), outside the clone.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
HIP = ROOT / "hip"
INCLUDE = HERE / "include"

# Emulated architectures: the macros clang defines for the target, and the wave size compat.h derives from them.
# gfx950 is there for the FP8 kernels (its MFMA reads OCP e4m3fn bytes where gfx942's read e4m3fnuz); for the 16-bit
# kernels it would only repeat gfx942's code paths, so their tests list the other three (tests/test_amd_emulation.py
# ARCHS) rather than iterate over this table.
ARCHS = {
    "gfx942": {"defines": ["__GFX9__", "__gfx942__"], "wave": 64},  # CDNA3: wave64, MFMA, FP8 e4m3fnuz
    "gfx950": {"defines": ["__GFX9__", "__gfx950__"], "wave": 64},  # CDNA4: wave64, MFMA, FP8 OCP e4m3fn
    "gfx1100": {"defines": ["__GFX11__", "__gfx1100__"], "wave": 32},  # RDNA3: wave32, WMMA (replicated operands)
    "gfx1201": {"defines": ["__GFX12__", "__gfx1201__"], "wave": 32},  # RDNA4: wave32, WMMA (gfx12 layout), FP8 e4m3fn
}

CHEVRON = re.compile(r"<<<(.*?)>>>\s*\(", re.S)
# `__shared__ [attributes] type name[dims]...;` on one line (HIP allows no initializer): the declared name.
SHARED = re.compile(r"\b__shared__\b(?P<declaration>[^;{}\n]*?\b(?P<name>[A-Za-z_]\w*)\s*(?:\[[^;\]\n]*\]\s*)*);")


def compiler() -> str | None:
    """clang++ (the kernels use clang vector extensions and _Float16); the newest one installed."""
    for name in ("clang++", "clang++-19", "clang++-18", "clang++-17", "clang++-16", "clang++-15"):
        if shutil.which(name):
            return name
    return None


def _kernel_expression_start(text: str, end: int) -> int:
    """Start of the kernel expression that ends at `end` (just before <<<): an identifier with optional
    template arguments and call parentheses, e.g. `kernel_of<T, P>()` or `ns::kernel<T, 4>`."""
    i = end
    while i > 0 and text[i - 1].isspace():
        i -= 1
    while True:
        if text[i - 1] in ">)":
            close, open_ = text[i - 1], "<" if text[i - 1] == ">" else "("
            depth = 0
            while True:
                i -= 1
                depth += text[i] == close
                depth -= text[i] == open_
                if depth == 0:
                    break
            continue
        j = i
        while j > 0 and (text[j - 1].isalnum() or text[j - 1] in "_:"):
            j -= 1
        if j == i:
            raise ValueError(f"cannot find the kernel before <<< at offset {end}")
        return j


def rewrite_launches(text: str) -> str:
    out, pos = [], 0
    for m in CHEVRON.finditer(text):
        start = _kernel_expression_start(text, m.start())
        if start < pos:
            raise ValueError("overlapping launches")
        kernel = text[start:m.start()].strip()
        out.append(text[pos:start])
        out.append(f"::rsd_emu::launch({kernel}, {m.group(1).strip()})(")
        pos = m.end()
    out.append(text[pos:])
    return "".join(out)


def rewrite_shared(text: str) -> str:
    """Each `__shared__ T name[N];` becomes a thread_local (a block runs on one OS thread: one copy per running
    block) followed by ::rsd_emu::declare_shared, which fills it with 0xff bytes (NaN in every float format) the
    first time a lane of the running block declares it. A read of a slot no lane of the block wrote then gives NaN,
    as stale LDS on the GPU may. The call makes a declaration at namespace scope fail to compile, and an
    unrewritten `__shared__` (in a header) is an error of rsd_emu's hip_runtime.h: neither escapes the poisoning."""
    return SHARED.sub(lambda m: f"thread_local{m['declaration']}; "
                                f"::rsd_emu::declare_shared(&{m['name']}, sizeof({m['name']}));", text)


def rewrite(text: str) -> str:
    return rewrite_shared(rewrite_launches(text))


def _digest(arch: str, sources: list[Path], cxx: str) -> str:
    h = hashlib.sha256(f"{arch} {cxx}".encode())
    for path in sorted(HERE.rglob("*")) + sorted((HIP / "include").rglob("*")) + sources:
        if path.is_file() and path.suffix in {".h", ".cpp", ".hip", ".py"}:
            h.update(str(path.relative_to(ROOT)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def cache_root() -> Path:
    return Path(os.environ.get("ROCM_SD_EMU_CACHE", Path.home() / ".cache" / "rocm_sd" / "amd_emulation"))


def source(stem: str) -> Path:
    """hip/<family>/<stem>.hip (or hip/<stem>.hip): the one kernel source of that name."""
    (path,) = HIP.rglob(f"{stem}.hip")
    return path


def _sources(families: list[str]) -> list[Path]:
    return [HIP / "runtime.hip"] + [source(f) for f in families]


def _compiler() -> str:
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("no clang++ found")
    return cxx


def library_path(arch: str, families: list[str]) -> Path:
    """Where the library of `families` for `arch` is cached for the current sources (there or not yet)."""
    cxx = _compiler()
    return cache_root() / f"{arch}-{families[0]}-{_digest(arch, _sources(families), cxx)}" / "kernels.so"


def is_built(arch: str, families: list[str]) -> bool:
    return compiler() is not None and library_path(arch, families).exists()


def build(arch: str, families: list[str]) -> Path:
    """The shared library of the emulated kernels `families` (the sources hip/<family>/<name>.hip, by name) for
    `arch`; built once."""
    cxx = _compiler()
    library = library_path(arch, families)
    if library.exists():
        return library
    out_dir = library.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    # The device pass of hipcc (__HIP_DEVICE_COMPILE__): the kernels' device-only branches are what the GPU runs.
    # The host launchers are compiled in the same pass, as they share the source.
    flags = [cxx, "-std=c++17", "-O1", "-g0", "-fPIC", "-pthread", "-w", f"-I{INCLUDE}", f"-I{HIP / 'include'}",
             "-D__HIP_PLATFORM_AMD__", "-D__HIP_DEVICE_COMPILE__=1", f'-DRSD_EMU_ARCH="{arch}"'] + [
                 f"-D{d}" for d in ARCHS[arch]["defines"]]
    entries = [HERE / f"entry_{f}.cpp" for f in families if (HERE / f"entry_{f}.cpp").exists()]
    units = [HERE / "runtime.cpp"]
    for src in entries + _sources(families):
        rewritten = out_dir / (src.name if src.suffix == ".cpp" else f"hip_{src.stem}.cpp")
        rewritten.write_text(f'#line 1 "{src}"\n' + rewrite(src.read_text()))
        units.append(rewritten)
    objects = []
    for unit in units:
        obj = out_dir / f"{unit.stem}.o"
        subprocess.run([*flags, "-c", str(unit), "-o", str(obj)], check=True, capture_output=True, text=True)
        objects.append(str(obj))
    tmp = out_dir / f"kernels.{os.getpid()}.so"
    subprocess.run([*flags, "-shared", *objects, "-o", str(tmp)], check=True, capture_output=True, text=True)
    tmp.replace(library)
    _prune(arch, families[0], keep=out_dir)
    return library


def build_all(libraries: list[tuple[str, list[str]]], jobs: int, say) -> None:
    """Builds the libraries (arch, families) not built yet, `jobs` at a time, and says (through `say`, one line
    each) what it compiles, where it caches it, and how each build ended. A failed build is only reported: the test
    that loads the library builds it again and fails with the compiler's message."""
    cold = [(arch, families) for arch, families in libraries if not is_built(arch, families)]
    if not cold:
        return
    say(f"AMD emulation: compiling {len(cold)} host libraries ({', '.join(f'{a} {f[0]}' for a, f in cold)}), "
        f"{jobs} at a time, into {cache_root()} (once per source state; the tests that use them wait)")
    started = time.monotonic()

    def one(arch, families):
        t = time.monotonic()
        build(arch, families)
        return time.monotonic() - t

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {pool.submit(one, arch, families): (arch, families) for arch, families in cold}
        for done, future in enumerate(as_completed(futures), 1):
            arch, families = futures[future]
            try:
                outcome = f"built in {future.result():.0f} s"
            except (subprocess.CalledProcessError, OSError, RuntimeError) as e:
                outcome = f"FAILED ({type(e).__name__}; the test reports the compiler's message)"
            say(f"AMD emulation [{done}/{len(cold)}] {arch} {'+'.join(families)}: {outcome}")
    say(f"AMD emulation: {len(cold)} libraries in {time.monotonic() - started:.0f} s")


def _prune(arch: str, family: str, keep: Path, newest: int = 6) -> None:
    """Removes all but the `newest` builds of the library named by `family` (its first) for `arch` (each source
    state makes one; worktrees share the cache, so a few stay). Per library, not per architecture: one test run
    builds a library per kernel family, more than `newest`. A library another process has loaded stays mapped
    after its file is gone."""
    builds = sorted(cache_root().glob(f"{arch}-{family}-*"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in builds[newest:]:
        if old != keep:
            shutil.rmtree(old, ignore_errors=True)
