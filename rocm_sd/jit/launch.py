"""Loading compiled code and launching its kernels through the GPU runtime torch itself uses (the HIP runtime that
torch loaded, or the CUDA driver), on the stream torch hands out: a kernel launched here orders with torch's own
work and is captured into CUDA / HIP graphs like any other launch."""
from __future__ import annotations

import ctypes
import functools

from .rtc import loaded_library


class LaunchError(RuntimeError):
    """The runtime refused to load a module or launch a kernel; the message names the call and the error."""


class FastDiv(ctypes.Structure):
    """rsd::FastDiv (rocm_sd/common.h), passed by value: the divisor and the multiplier / shift of its division."""
    _fields_ = [("divisor", ctypes.c_uint32), ("multiplier", ctypes.c_uint32), ("shift", ctypes.c_uint32)]

    @classmethod
    @functools.lru_cache(maxsize=4096)  # launches reuse a few divisors; the structure is only read
    def of(cls, d: int) -> "FastDiv":
        shift = 0
        while (1 << shift) < d:
            shift += 1
        return cls(d, ((1 << 32) * ((1 << shift) - d) // d + 1) & 0xFFFFFFFF, shift)


class QuantizedOut(ctypes.Structure):
    """rsd::QuantizedOut (hip/layer_norm/layer_norm.hip), passed by value: where LayerNorm writes its row quantized
    (nullptrs when it does not), the format code and the bound (0: a scale per row)."""
    _fields_ = [("q", ctypes.c_void_p), ("scale", ctypes.c_void_p), ("format", ctypes.c_int32),
                ("bound", ctypes.c_float)]

    @classmethod
    def of(cls, fields: tuple) -> "QuantizedOut":
        return cls(*fields)


class AttentionParams(ctypes.Structure):
    """rsd::attn::Params<T> (rocm_sd/attention/impl.h), the attention kernels' one argument, passed by value."""
    _fields_ = [("q", ctypes.c_void_p), ("k", ctypes.c_void_p), ("v", ctypes.c_void_p), ("out", ctypes.c_void_p),
                ("q_stride", ctypes.c_int64 * 3), ("k_stride", ctypes.c_int64 * 3), ("v_stride", ctypes.c_int64 * 3),
                ("out_stride", ctypes.c_int64 * 3), ("q_len", ctypes.c_int), ("kv_len", ctypes.c_int),
                ("head_dim", ctypes.c_int), ("scale_log2", ctypes.c_float)]

    @classmethod
    def of(cls, fields: tuple) -> "AttentionParams":
        q, k, v, out, qs, ks, vs, os_, q_len, kv_len, head_dim, scale_log2 = fields
        triple = ctypes.c_int64 * 3
        return cls(q, k, v, out, triple(*qs), triple(*ks), triple(*vs), triple(*os_), q_len, kv_len, head_dim,
                   scale_log2)


class GroupNormWorkspace(ctypes.Structure):
    """gn::Workspace (hip/group_norm/group_norm_resident_nhwc.hip), passed by value: the ticket, arrival and ready
    counters, the partials and the (image, group) mean / rstd, all within the op's workspace."""
    _fields_ = [("ticket", ctypes.c_void_p), ("arrived", ctypes.c_void_p), ("ready", ctypes.c_void_p),
                ("partials", ctypes.c_void_p), ("mean_rstd", ctypes.c_void_p)]

    @classmethod
    def of(cls, fields: tuple) -> "GroupNormWorkspace":
        return cls(*fields)


# Kernel parameter types by the letters the launch plans use (plans.py): pointers, int64_t, int, uint32_t, bool,
# float, rsd::FastDiv built from its divisor, LayerNorm's QuantizedOut, the attention kernels' Params and the NHWC
# resident GroupNorm's Workspace.
CTYPES = {"p": ctypes.c_void_p, "q": ctypes.c_int64, "i": ctypes.c_int32, "u": ctypes.c_uint32, "b": ctypes.c_bool,
          "f": ctypes.c_float, "d": FastDiv.of, "o": QuantizedOut.of, "a": AttentionParams.of,
          "w": GroupNormWorkspace.of}


class Runtime:
    """Module load / function lookup / launch of the HIP runtime or the CUDA driver API (same signatures)."""

    def __init__(self, platform: str):
        self.platform = platform
        if platform == "hip":
            self.lib = ctypes.CDLL(loaded_library("libamdhip64.so") or "libamdhip64.so")
            prefix = {"load": "hipModuleLoadData", "get": "hipModuleGetFunction", "launch": "hipModuleLaunchKernel",
                      "driver": "hipDriverGetVersion", "memset": "hipMemsetAsync",
                      "occupancy": "hipModuleOccupancyMaxActiveBlocksPerMultiprocessor"}
            self.lib.hipGetErrorString.restype = ctypes.c_char_p
            # hipMemsetAsync(dst, value, bytes, stream)
            memset_args = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p]
        else:
            self.lib = ctypes.CDLL(loaded_library("libcuda.so") or "libcuda.so.1")
            prefix = {"load": "cuModuleLoadData", "get": "cuModuleGetFunction", "launch": "cuLaunchKernel",
                      "driver": "cuDriverGetVersion", "occupancy": "cuOccupancyMaxActiveBlocksPerMultiprocessor",
                      "memset": "cuMemsetD8Async"}
            # cuMemsetD8Async(CUdeviceptr, byte, count, stream)
            memset_args = [ctypes.c_uint64, ctypes.c_ubyte, ctypes.c_size_t, ctypes.c_void_p]
        self._load, self._get = getattr(self.lib, prefix["load"]), getattr(self.lib, prefix["get"])
        self._launch, self._driver = getattr(self.lib, prefix["launch"]), getattr(self.lib, prefix["driver"])
        self._launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 6 + [ctypes.c_uint, ctypes.c_void_p,
                                                                              ctypes.c_void_p, ctypes.c_void_p]
        self._occupancy, self._memset = getattr(self.lib, prefix["occupancy"]), getattr(self.lib, prefix["memset"])
        self._occupancy.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
        self._memset.argtypes = memset_args

    def _error(self, code: int) -> str:
        if self.platform == "hip":
            return (self.lib.hipGetErrorString(code) or b"").decode()
        text = ctypes.c_char_p()
        self.lib.cuGetErrorString(code, ctypes.byref(text))
        return (text.value or b"").decode()

    def check(self, code: int, what: str) -> None:
        if code != 0:
            raise LaunchError(f"{what} failed: {self._error(code)} ({code})")

    def driver_version(self) -> int:
        version = ctypes.c_int()
        self.check(self._driver(ctypes.byref(version)), "driver version")
        return version.value

    def load(self, code: bytes) -> ctypes.c_void_p:
        """A module from code; the caller makes the target device current (torch.cuda.device)."""
        if self.platform == "cuda":
            self._make_context_current()
        module = ctypes.c_void_p()
        self.check(self._load(ctypes.byref(module), code), "module load")
        return module

    def _make_context_current(self) -> None:
        """The driver API loads modules into the thread's current context, which torch creates lazily: a process
        that has not run CUDA work on this thread yet has none ("invalid device context"). The primary context
        of torch's current device is the one torch itself runs in (the HIP runtime needs no such step)."""
        context = ctypes.c_void_p()
        self.check(self.lib.cuCtxGetCurrent(ctypes.byref(context)), "current context")
        if context.value:
            return
        import torch

        device = ctypes.c_int()
        self.check(self.lib.cuDeviceGet(ctypes.byref(device), torch.cuda.current_device()), "device lookup")
        self.check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), "primary context")
        self.check(self.lib.cuCtxSetCurrent(context), "making the primary context current")

    def function(self, module: ctypes.c_void_p, symbol: str) -> ctypes.c_void_p:
        function = ctypes.c_void_p()
        self.check(self._get(ctypes.byref(function), module, symbol.encode()), f"function lookup of {symbol}")
        return function

    def occupancy(self, function, block: int, shared: int = 0) -> int:
        """Blocks of `block` threads of `function` that fit on one multiprocessor at once (the C++ launchers'
        hipOccupancyMaxActiveBlocksPerMultiprocessor, asked of the loaded kernel)."""
        blocks = ctypes.c_int()
        self.check(self._occupancy(ctypes.byref(blocks), function, block, shared), "occupancy query")
        return blocks.value

    def memset(self, pointer: int, nbytes: int, stream: int) -> None:
        """Zeroes `nbytes` at `pointer` on `stream` (hipMemsetAsync / cuMemsetD8Async)."""
        self.check(self._memset(pointer, 0, nbytes, stream), "memset")

    def launch(self, function, grid, block: int, shared: int, stream: int, signature: str, args) -> None:
        """One launch; `grid` is a block count or (x, y, z); `signature` gives each argument's type (CTYPES
        letters)."""
        gx, gy, gz = (grid, 1, 1) if isinstance(grid, int) else grid
        values = [CTYPES[kind](arg) for kind, arg in zip(signature, args, strict=True)]
        params = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
        self.check(self._launch(function, gx, gy, gz, block, 1, 1, shared, stream, params, None), "kernel launch")
