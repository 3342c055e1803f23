"""Compiles every runtime-compiled kernel source (rocm_sd/jit/sources.py) with hiprtc for the given AMD targets,
as the JIT backend does on a user's GPU, but on the CPU: no device is needed to compile. Runs inside the sid root
(.ci/rocm_toolchain.sh exec), whose Python has no torch, so the two torch-free modules are loaded by path.

    python3 .ci/jit_compile.py OUT_DIR gfx942 gfx1100 ...

Writes OUT_DIR/<unit>-<arch>.co (the code object), and OUT_DIR/compiled.json: per unit and arch the compile
seconds, code bytes and the lowered (mangled) name of every instance. The compiles run in one worker process per
core: each is single-threaded."""
import importlib.util
import json
import multiprocessing
import os
import pathlib
import sys
import time

JIT = pathlib.Path(__file__).resolve().parents[1] / "rocm_sd" / "jit"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"rocm_sd_jit_{name}", JIT / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def compile_unit(job: tuple[pathlib.Path, str, str]) -> tuple[str, dict]:
    """One unit for one arch: its code object written to `out`, (its report key, its report entry)."""
    out, arch, name = job
    sources, rtc = load("sources"), load("rtc")
    root, unit = sources.source_root(), sources.UNITS[name]
    start = time.perf_counter()
    compiled = rtc.compiler("hip").compile(sources.unit_source(unit, root), unit.path.rsplit("/", 1)[-1],
                                           rtc.options("hip", arch, root / "include"), list(unit.expressions))
    seconds = time.perf_counter() - start
    (out / f"{unit.name}-{arch}.co").write_bytes(compiled.code)
    print(f"{arch} {unit.name}: {len(unit.expressions)} instances in {seconds:.1f} s", flush=True)
    return f"{unit.name}-{arch}", {"seconds": round(seconds, 2), "bytes": len(compiled.code),
                                   "lowered": compiled.lowered}


def main(out: pathlib.Path, archs: list[str]) -> None:
    sources, rtc = load("sources"), load("rtc")
    report = {"compiler": rtc.compiler("hip").version(), "units": {}}
    out.mkdir(parents=True, exist_ok=True)
    jobs = [(out, arch, name) for arch in archs for name in sources.UNITS]
    with multiprocessing.Pool(os.cpu_count() or 1) as pool:
        report["units"] = dict(sorted(pool.imap_unordered(compile_unit, jobs)))
    (out / "compiled.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]), sys.argv[2:])
