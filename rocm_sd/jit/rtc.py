"""Runtime compilers behind one call, compile(source, name, options, expressions) -> Compiled:
  - hiprtc through hip-python (`hip.hiprtc`) on ROCm, the binding the project's design names;
  - the same C API through ctypes: hiprtc when hip-python is missing (PyTorch's ROCm wheels ship libhiprtc), and
    NVRTC on NVIDIA (PyTorch's CUDA wheels ship libnvrtc), so no Python binding is required there.
NVRTC and hiprtc share their C API (hiprtc copies NVRTC's), so one ctypes class serves both; only the prefix and the
name of the code getter differ."""
from __future__ import annotations

import ctypes
import glob
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path


class RtcUnavailable(RuntimeError):
    """No runtime compiler could be loaded; the message says what to install."""


class CompileError(RuntimeError):
    """The compiler rejected a source; the message holds its log."""


@dataclass
class Compiled:
    code: bytes                  # a code object (hiprtc) or a cubin (NVRTC)
    lowered: dict[str, str]      # name expression -> mangled symbol in `code`
    log: str = ""
    compiler: str = ""
    seconds: float = field(default=0.0)


def loaded_library(fragment: str) -> str | None:
    """Path of a shared library this process has already loaded whose file name contains `fragment` (the HIP
    runtime or hiprtc that torch brought): opening that exact file reuses it instead of loading a second copy."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rstrip("\n").split(" ")[-1]
                if path.startswith("/") and fragment in os.path.basename(path):
                    return path
    except OSError:
        pass
    return None


class CtypesRtc:
    """NVRTC or hiprtc through its C API (the two are the same API under two prefixes)."""

    def __init__(self, lib: ctypes.CDLL, prefix: str, label: str):
        self.lib, self.prefix, self.label = lib, prefix, label
        self.code_call = "GetCUBIN" if prefix == "nvrtc" else "GetCode"
        for name, restype in (("GetErrorString", ctypes.c_char_p),):
            getattr(lib, prefix + name).restype = restype

    def _fn(self, name: str):
        return getattr(self.lib, self.prefix + name)

    def _check(self, result: int, what: str) -> None:
        if result != 0:
            message = self._fn("GetErrorString")(result)
            raise CompileError(f"{self.label}: {what} failed: {message.decode() if message else result}")

    def version(self) -> str:
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._check(self._fn("Version")(ctypes.byref(major), ctypes.byref(minor)), "Version")
        return f"{self.prefix} {major.value}.{minor.value}"

    def compile(self, source: str, name: str, options: list[str], expressions: list[str]) -> Compiled:
        prog = ctypes.c_void_p()
        self._check(self._fn("CreateProgram")(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None),
                    "CreateProgram")
        try:
            for expression in expressions:
                self._check(self._fn("AddNameExpression")(prog, expression.encode()), f"AddNameExpression({expression})")
            opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
            result = self._fn("CompileProgram")(prog, len(options), opts)
            size = ctypes.c_size_t()
            self._fn("GetProgramLogSize")(prog, ctypes.byref(size))
            log_buffer = ctypes.create_string_buffer(size.value + 1)
            self._fn("GetProgramLog")(prog, log_buffer)
            log = log_buffer.value.decode(errors="replace")
            if result != 0:
                raise CompileError(f"{self.label} could not compile {name}:\n{log}")
            self._check(self._fn(self.code_call + "Size")(prog, ctypes.byref(size)), self.code_call + "Size")
            code = ctypes.create_string_buffer(size.value)
            self._check(self._fn(self.code_call)(prog, code), self.code_call)
            lowered = {}
            for expression in expressions:
                symbol = ctypes.c_char_p()
                self._check(self._fn("GetLoweredName")(prog, expression.encode(), ctypes.byref(symbol)),
                            f"GetLoweredName({expression})")
                lowered[expression] = symbol.value.decode()
            return Compiled(code.raw, lowered, log, self.label)
        finally:
            self._fn("DestroyProgram")(ctypes.byref(prog))


class HipPythonRtc:
    """hiprtc through hip-python (`pip install hip-python` of the ROCm version torch was built with)."""

    def __init__(self, hiprtc_module):
        self.hiprtc = hiprtc_module
        self.label = "hiprtc (hip-python)"

    def _check(self, result, what: str):
        err, *rest = result if isinstance(result, tuple) else (result,)
        if err != self.hiprtc.hiprtcResult.HIPRTC_SUCCESS:
            raise CompileError(f"{self.label}: {what} failed: {err}")
        return rest[0] if len(rest) == 1 else rest

    def version(self) -> str:
        major, minor = self._check(self.hiprtc.hiprtcVersion(), "hiprtcVersion")
        return f"hiprtc {major}.{minor}"

    def compile(self, source: str, name: str, options: list[str], expressions: list[str]) -> Compiled:
        h = self.hiprtc
        prog = self._check(h.hiprtcCreateProgram(source.encode(), name.encode(), 0, [], []), "hiprtcCreateProgram")
        try:
            for expression in expressions:
                self._check(h.hiprtcAddNameExpression(prog, expression.encode()), f"AddNameExpression({expression})")
            opts = [o.encode() for o in options]
            err, = h.hiprtcCompileProgram(prog, len(opts), opts)
            log_size = self._check(h.hiprtcGetProgramLogSize(prog), "hiprtcGetProgramLogSize")
            log = bytearray(log_size)
            self._check(h.hiprtcGetProgramLog(prog, log), "hiprtcGetProgramLog")
            log_text = bytes(log).rstrip(b"\0").decode(errors="replace")
            if err != h.hiprtcResult.HIPRTC_SUCCESS:
                raise CompileError(f"{self.label} could not compile {name}:\n{log_text}")
            code = bytearray(self._check(h.hiprtcGetCodeSize(prog), "hiprtcGetCodeSize"))
            self._check(h.hiprtcGetCode(prog, code), "hiprtcGetCode")
            lowered = {}
            for expression in expressions:
                symbol = self._check(h.hiprtcGetLoweredName(prog, expression.encode()), "hiprtcGetLoweredName")
                lowered[expression] = symbol.decode() if isinstance(symbol, bytes) else str(symbol)
            return Compiled(bytes(code), lowered, log_text, self.label)
        finally:
            h.hiprtcDestroyProgram(prog)


def _nvrtc_candidates() -> list[str]:
    """libnvrtc files to try: one already loaded, the NVIDIA wheels next to torch (nvidia/cu13, nvidia/cuda_nvrtc
    for CUDA 12), then the system's."""
    found = [p for p in (loaded_library("libnvrtc.so"),) if p]
    for base in sys.path:
        for pattern in ("nvidia/cu1*/lib/libnvrtc.so.*", "nvidia/cuda_nvrtc/lib/libnvrtc.so.*"):
            found += sorted(p for p in glob.glob(os.path.join(base, pattern)) if "builtins" not in p and ".alt." not in p)
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if cuda_home:
        found += sorted(glob.glob(os.path.join(cuda_home, "lib64", "libnvrtc.so.*")))
    return found + ["libnvrtc.so"]


def _load_nvrtc(candidates: list[str]) -> CtypesRtc:
    errors = []
    for candidate in candidates:
        try:
            # libnvrtc opens libnvrtc-builtins by name at compile time; load the one beside it first so a wheel's
            # copy (not on the loader's path) is found.
            for builtins in sorted(glob.glob(os.path.join(os.path.dirname(candidate), "libnvrtc-builtins.so.*"))):
                if ".alt." not in builtins:
                    ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
            return CtypesRtc(ctypes.CDLL(candidate), "nvrtc", f"NVRTC ({candidate})")
        except OSError as error:
            errors.append(str(error))
    raise RtcUnavailable("NVRTC not found: PyTorch's CUDA wheels bring it (nvidia-cuda-nvrtc); install that wheel "
                         "or a CUDA toolkit (CUDA_HOME). Tried: " + "; ".join(errors[-3:]))


def _load_hiprtc() -> HipPythonRtc | CtypesRtc:
    try:
        from hip import hiprtc  # hip-python

        binding = HipPythonRtc(hiprtc)
        binding.version()  # hip-python opens libhiprtc on first use: a missing library shows here, not mid-op
        return binding
    except Exception as error:  # ImportError, or hip-python's own error when it cannot open libhiprtc
        missing_binding = f"hip-python: {error}"
    candidates = [p for p in (loaded_library("libhiprtc.so"),) if p]
    rocm = os.environ.get("ROCM_PATH", "/opt/rocm")
    for base in [rocm + "/lib", *(os.path.join(p, "torch", "lib") for p in sys.path)]:  # torch's ROCm wheel has one
        candidates += sorted(glob.glob(os.path.join(base, "libhiprtc.so*")))
    candidates.append("libhiprtc.so")
    for candidate in candidates:
        try:
            return CtypesRtc(ctypes.CDLL(candidate), "hiprtc", f"hiprtc ({candidate})")
        except OSError:
            continue
    raise RtcUnavailable(f"hiprtc not found ({missing_binding}): install hip-python for your ROCm version "
                         "(pip install hip-python), or a ROCm runtime that provides libhiprtc.so (ROCM_PATH)")


def compiler(platform: str, nvrtc_candidates: list[str] | None = None):
    """The runtime compiler for `platform` ("hip" or "cuda"); raises RtcUnavailable saying what is missing."""
    if platform == "hip":
        return _load_hiprtc()
    if platform == "cuda":
        return _load_nvrtc(nvrtc_candidates if nvrtc_candidates is not None else _nvrtc_candidates())
    raise RtcUnavailable(f"no runtime compiler for platform {platform!r}")


def cuda_include_dirs() -> list[str]:
    """Folders holding cuda_fp16.h for NVRTC (it has no built-in copy): the nvidia-cuda-runtime wheel that CUDA
    torch depends on, else CUDA_HOME / the default toolkit."""
    dirs = []
    for base in sys.path:
        dirs += sorted(glob.glob(os.path.join(base, "nvidia", "cu1*", "include")))
        dirs += sorted(glob.glob(os.path.join(base, "nvidia", "cuda_runtime", "include")))
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            dirs.append(os.path.join(home, "include"))
    return [d for d in dict.fromkeys(dirs) if Path(d, "cuda_fp16.h").is_file()]


def options(platform: str, arch: str, include_dir: Path, cuda_includes: list[str] | None = None) -> list[str]:
    """Compile options: C++17 at -O3 as the CMake build (Release), for exactly `arch` (gfx942 / sm_90)."""
    common = ["-std=c++17", "-DNDEBUG", f"-I{include_dir}"]
    if platform == "hip":
        return [f"--offload-arch={arch}", "-O3", *common]
    includes = cuda_include_dirs() if cuda_includes is None else cuda_includes
    if not includes:
        raise RtcUnavailable("cuda_fp16.h not found for NVRTC: install nvidia-cuda-runtime (PyTorch's CUDA wheels "
                             "depend on it) or set CUDA_HOME")
    return [f"--gpu-architecture={arch}", *common, *(f"-I{d}" for d in includes[:1])]
