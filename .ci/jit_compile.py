"""Compiles every runtime-compiled kernel source (rocm_sd/jit/sources.py) with hiprtc for the given AMD targets,
as the JIT backend does on a user's GPU, but on the CPU: no device is needed to compile. Runs inside the sid root
(.ci/rocm_toolchain.sh exec), whose Python has no torch, so the two torch-free modules are loaded by path.

    python3 .ci/jit_compile.py OUT_DIR gfx942 gfx1100 ...

Writes OUT_DIR/<unit>-<arch>.co (the code object), and OUT_DIR/compiled.json: per unit and arch the compile
seconds, code bytes and the lowered (mangled) name of every instance."""
import importlib.util
import json
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


def main(out: pathlib.Path, archs: list[str]) -> None:
    sources, rtc = load("sources"), load("rtc")
    root = sources.source_root()
    compiler = rtc.compiler("hip")
    report = {"compiler": compiler.version(), "units": {}}
    out.mkdir(parents=True, exist_ok=True)
    for arch in archs:
        options = rtc.options("hip", arch, root / "include")
        for unit in sources.UNITS.values():
            start = time.perf_counter()
            compiled = compiler.compile(sources.unit_source(unit, root), unit.path.rsplit("/", 1)[-1], options,
                                        list(unit.expressions))
            seconds = time.perf_counter() - start
            (out / f"{unit.name}-{arch}.co").write_bytes(compiled.code)
            report["units"][f"{unit.name}-{arch}"] = {"seconds": round(seconds, 2), "bytes": len(compiled.code),
                                                      "lowered": compiled.lowered}
            print(f"{arch} {unit.name}: {len(unit.expressions)} instances in {seconds:.1f} s", flush=True)
    (out / "compiled.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]), sys.argv[2:])
