"""The runtime-compiled backend: an object with _C's functions (the same names and arguments, bindings.cpp's
convention) for every op of rocm_sd's own kernels, whose launchers plans.py, attention_plan.py and
group_norm_plan.py mirror, so ops/ and dispatch.py do not change. Each source file is compiled on first use for
exactly the device's arch, cached on disk (cache.py), loaded into the device's context and launched on torch's
current stream. The Composable Kernel instances (ck_*) are _C's only: without their listing functions the ops see
none under the JIT."""
from __future__ import annotations

import logging
import threading
import time

import torch

from .. import platform
from . import attention_plan, group_norm_plan, plans, rtc, sources
from .cache import KernelCache, entry_key
from .launch import LaunchError, Runtime

log = logging.getLogger("rocm_sd")
_current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device

# The ops whose launch decisions plans.py / attention_plan.py / group_norm_plan.py hold; add_layer_norm is
# layer_norm's residual form. (The Composable Kernel instances, ck_*, are _C's only: the ops list none under the JIT.)
COVERED = ("bias_residual", "parity_shuffle", "geglu", "quantize_rows", "layer_norm", "add_layer_norm", "attention",
           "layer_norm_quantize_rows", "add_layer_norm_quantize_rows", "geglu_quantize_rows", "group_norm", "rms_norm")
COVERED += ("ada_layer_norm", "add_ada_layer_norm")  # add_ada_layer_norm: ada_layer_norm's gated-residual form
COVERED += ("ada_layer_norm_quantized", "add_ada_layer_norm_quantized", "gelu_tanh", "gelu_tanh_quantized")


class JitBackend:
    def __init__(self, gpu_platform: str | None = None, cache: KernelCache | None = None):
        self.platform = gpu_platform or platform.torch_gpu_platform()
        self.root = sources.source_root()
        self.cache = cache or KernelCache()
        self._compiler = None
        self._runtime: Runtime | None = None
        self._functions: dict[tuple[int, str], object] = {}  # (device, name expression) -> kernel handle
        self._modules: dict[tuple[int, str], dict[str, str]] = {}  # (device, unit) -> lowered names
        self._device_facts: dict[int, tuple[int, int]] = {}
        self._l2: dict[int, int] = {}
        self._capacity: dict[tuple, int] = {}  # (device, layout, dtype, vec, threads) -> resident GroupNorm blocks
        self._arches: dict[int, str] = {}
        self._lock = threading.Lock()
        self.compiles: dict[tuple[str, str], tuple[float, bool]] = {}  # (unit, arch) -> (seconds, from cache)

    # ---- availability ---------------------------------------------------------------------------------------------
    def unavailable_reason(self) -> str | None:
        """Why nothing can be compiled here (no sources shipped, no compiler), else None. Loads the compiler."""
        if self.platform not in ("hip", "cuda"):
            return "no GPU: torch is a CPU-only build"
        if self.root is None:
            return "jit: the kernel sources are not installed (rocm_sd/_hip); reinstall rocm_sd"
        try:
            self.compiler()
        except rtc.RtcUnavailable as error:
            return f"jit: {error}"
        return None

    def compiler(self):
        if self._compiler is None:
            self._compiler = rtc.compiler(self.platform)
        return self._compiler

    def runtime(self) -> Runtime:
        if self._runtime is None:
            self._runtime = Runtime(self.platform)
        return self._runtime

    # ---- what _C's runtime functions answer -----------------------------------------------------------------------
    def build_info(self) -> dict:
        return {"platform": self.platform, "targets": "compiled at run time for each GPU (JIT)",
                "runtime_version": platform.runtime_version(),
                "source_hash": sources.source_hash(self.root)[:16] if self.root else "none"}

    def check_kernel_image(self, device: int) -> str:
        return self.unavailable_reason() or ""

    def device_info(self, device: int) -> dict:
        props = torch.cuda.get_device_properties(device)
        multiprocessors, wave = self._facts(device)
        return {"name": props.name, "arch": platform.device_arch(device), "multiprocessors": multiprocessors,
                "wave_size": wave, "l2_bytes": getattr(props, "L2_cache_size", 0),
                "driver_version": self.runtime().driver_version()}

    def _facts(self, device: int) -> tuple[int, int]:
        """(multiprocessors, wave size) of `device`: what rsd::device_attribute gives the C++ launchers."""
        facts = self._device_facts.get(device)
        if facts is None:
            props = torch.cuda.get_device_properties(device)
            wave = getattr(props, "warp_size", 0) or (64 if platform.device_arch(device).startswith("gfx9") else 32)
            facts = self._device_facts[device] = (props.multi_processor_count, wave)
        return facts

    def _l2_bytes(self, device: int) -> int:
        """The L2 size of `device`, or rsd::device_attribute's fallback of 32 MiB where the runtime gives none."""
        l2 = self._l2.get(device)
        if l2 is None:
            l2 = self._l2[device] = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 32 << 20
        return l2

    # ---- compile, load, launch ------------------------------------------------------------------------------------
    def compile_unit(self, unit_name: str, arch: str) -> tuple[rtc.Compiled, bool]:
        """The unit's code for `arch`, from the cache or compiled now (with a notice and its time)."""
        unit = sources.UNITS[unit_name]
        compiler = self.compiler()
        options = rtc.options(self.platform, arch, self.root / "include")
        key = entry_key(unit.name, sources.source_hash(self.root), options, arch, compiler.version(),
                        platform.runtime_version())

        def build() -> rtc.Compiled:
            log.warning("rocm_sd: compiling the %s kernels for %s (%d instances; first use, cached in %s)",
                        unit.name, arch, len(unit.expressions), self.cache.folder)
            start = time.perf_counter()
            compiled = compiler.compile(sources.unit_source(unit, self.root), unit.path.rsplit("/", 1)[-1], options,
                                        list(unit.expressions))
            compiled.seconds = time.perf_counter() - start
            log.warning("rocm_sd: compiled the %s kernels for %s in %.1f s", unit.name, arch, compiled.seconds)
            return compiled

        start = time.perf_counter()
        compiled, cached = self.cache.get(key, build)
        self.compiles[(unit.name, arch)] = (time.perf_counter() - start, cached)
        return compiled, cached

    def _load(self, device: int, unit_name: str) -> None:
        with self._lock:
            if (device, unit_name) in self._modules:
                return
            compiled, _ = self.compile_unit(unit_name, self._arch(device))
            runtime = self.runtime()
            with torch.cuda.device(device):
                try:
                    module = runtime.load(compiled.code)
                except LaunchError as error:
                    if torch.cuda.is_current_stream_capturing():  # loading a module is no stream work
                        raise LaunchError(f"rocm_sd: the {unit_name} kernels were first needed while a CUDA / HIP "
                                          f"graph was being captured, when they cannot be loaded ({error}); run the "
                                          "model once before capturing (rocm_sd's own graphs do)") from error
                    raise
                for expression, symbol in compiled.lowered.items():
                    self._functions[(device, expression)] = runtime.function(module, symbol)
            self._modules[(device, unit_name)] = compiled.lowered

    def _function(self, device: int, unit: str, expression: str):
        function = self._functions.get((device, expression))
        if function is None:
            self._load(device, unit)
            function = self._functions[(device, expression)]
        return function

    def _run(self, device: int, launch: plans.Launch | list, stream: int) -> None:
        """Enqueues a launch, or a list of launches and memsets in order, on `stream` of `device`."""
        work = launch if isinstance(launch, list) else [launch]
        functions = [None if isinstance(w, plans.Memset) else self._function(device, w.unit, w.expression)
                     for w in work]
        runtime = self.runtime()

        def enqueue():
            for w, function in zip(work, functions):
                if function is None:
                    runtime.memset(w.pointer, w.nbytes, stream)
                else:
                    runtime.launch(function, w.grid, w.block, 0, stream, w.signature, w.args)

        if _current_device() == device:
            enqueue()
        else:  # a function belongs to its device's context, as the C++ launchers' DeviceGuard knows
            with torch.cuda.device(device):
                enqueue()

    @staticmethod
    def _raise_if(why: str) -> None:
        if why:
            raise RuntimeError(why)

    # ---- the ops, as bindings.cpp names them -----------------------------------------------------------------------
    def bias_residual_check(self, x, residual, bias, y, dtype, layout, n, c, hw, scale, device):
        return plans.bias_residual_check(x, residual, bias, y, dtype, layout, n, c, hw, scale)

    def bias_residual_forward(self, x, residual, bias, y, dtype, layout, n, c, hw, scale, stream, device):
        self._raise_if(plans.bias_residual_check(x, residual, bias, y, dtype, layout, n, c, hw, scale))
        self._run(device, plans.bias_residual_plan(x, residual, bias, y, dtype, layout, n, c, hw, scale,
                                                   self._facts(device)[0]), stream)

    def parity_shuffle_check(self, parities, bias, out, dtype, n, h, w, c, device):
        return plans.parity_shuffle_check(parities, bias, out, dtype, n, h, w, c)

    def parity_shuffle_forward(self, parities, bias, out, dtype, n, h, w, c, stream, device):
        self._raise_if(plans.parity_shuffle_check(parities, bias, out, dtype, n, h, w, c))
        self._run(device, plans.parity_shuffle_plan(parities, bias, out, dtype, n, h, w, c, self._facts(device)[0]),
                  stream)

    def geglu_check(self, x, y, dtype, rows, d, device, q=0, scale=0, format=0, bound=0.0):
        return plans.geglu_check(x, y, dtype, rows, d, q, scale, format, bound, self._facts(device)[1])

    def geglu_forward(self, x, y, dtype, rows, d, stream, device, q=0, scale=0, format=0, bound=0.0):
        self._raise_if(plans.geglu_check(x, y, dtype, rows, d, q, scale, format, bound, self._facts(device)[1]))
        self._run(device, plans.geglu_plan(x, y, dtype, rows, d, *self._facts(device), q, scale, format, bound),
                  stream)

    def gelu_tanh_check(self, x, bias, y, dtype, rows, d, device, q=0, scale=0, format=0, bound=0.0):
        return plans.gelu_tanh_check(x, bias, y, dtype, rows, d, q, scale, format, bound, self._facts(device)[1])

    def gelu_tanh_forward(self, x, bias, y, dtype, rows, d, stream, device, q=0, scale=0, format=0, bound=0.0):
        self._raise_if(plans.gelu_tanh_check(x, bias, y, dtype, rows, d, q, scale, format, bound,
                                             self._facts(device)[1]))
        self._run(device, plans.gelu_tanh_plan(x, bias, y, dtype, rows, d, *self._facts(device), q, scale, format,
                                               bound), stream)

    def quantize_rows_check(self, x, q, scale, dtype, format, rows, k, device, rows_per_batch=0, batch_stride=0):
        return plans.quantize_rows_check(x, q, scale, dtype, format, rows, k, rows_per_batch, batch_stride)

    def quantize_rows_forward(self, x, q, scale, dtype, format, rows, k, stream, device, rows_per_batch=0,
                              batch_stride=0):
        self._raise_if(plans.quantize_rows_check(x, q, scale, dtype, format, rows, k, rows_per_batch, batch_stride))
        self._run(device, plans.quantize_rows_plan(x, q, scale, dtype, format, rows, k, self._facts(device)[1],
                                                   rows_per_batch, batch_stride),
                  stream)

    def layer_norm_check(self, x, y, gamma, beta, dtype, param_dtype, rows, c, eps, device, residual=0, sum=0, q=0,
                         scale=0, format=0, bound=0.0):
        return plans.layer_norm_check(x, y, gamma, beta, dtype, param_dtype, rows, c, eps, self._facts(device)[1],
                                      residual, sum, q, scale, format, bound)

    def layer_norm_forward(self, x, y, gamma, beta, dtype, param_dtype, rows, c, eps, stream, device, residual=0,
                           sum=0, q=0, scale=0, format=0, bound=0.0):
        wave = self._facts(device)[1]
        quantized = (residual, sum, q, scale, format, bound)
        self._raise_if(plans.layer_norm_check(x, y, gamma, beta, dtype, param_dtype, rows, c, eps, wave, *quantized))
        self._run(device, plans.layer_norm_plan(x, y, gamma, beta, dtype, param_dtype, rows, c, eps, wave,
                                                *quantized), stream)

    def ada_layer_norm_check(self, x, out, scale, shift, dtype, batch, tokens, c, scale_stride, shift_stride, eps,
                             device, y=0, gate=0, gate_stride=(0, 0), h=0, q=0, q_scale=0, format=0, bound=0.0):
        return plans.ada_layer_norm_check(x, out, scale, shift, dtype, batch, tokens, c, scale_stride, shift_stride,
                                          eps, self._facts(device)[1], y, gate, gate_stride, h, q, q_scale, format,
                                          bound)

    def ada_layer_norm_forward(self, x, out, scale, shift, dtype, batch, tokens, c, scale_stride, shift_stride, eps,
                               stream, device, y=0, gate=0, gate_stride=(0, 0), h=0, q=0, q_scale=0, format=0,
                               bound=0.0):
        args = (x, out, scale, shift, dtype, batch, tokens, c, scale_stride, shift_stride, eps, self._facts(device)[1],
                y, gate, gate_stride, h, q, q_scale, format, bound)
        self._raise_if(plans.ada_layer_norm_check(*args))
        self._run(device, plans.ada_layer_norm_plan(*args), stream)

    def rms_norm_check(self, x, weight, lead, lead_weight, cos, sin, y, dtype, param_dtype, sizes, x_stride,
                       lead_stride, eps, device):
        return plans.rms_norm_check(x, weight, lead, lead_weight, cos, sin, y, dtype, param_dtype, sizes, x_stride,
                                    lead_stride, eps)

    def rms_norm_forward(self, x, weight, lead, lead_weight, cos, sin, y, dtype, param_dtype, sizes, x_stride,
                         lead_stride, eps, stream, device):
        args = (x, weight, lead, lead_weight, cos, sin, y, dtype, param_dtype, sizes, x_stride, lead_stride, eps)
        self._raise_if(plans.rms_norm_check(*args))
        self._run(device, plans.rms_norm_plan(*args, self._facts(device)[1]), stream)

    # ---- attention (hip/attention/attention.hip's launcher: attention_plan.py) ------------------------------------
    def _arch(self, device: int) -> str:
        arch = self._arches.get(device)
        if arch is None:
            arch = self._arches[device] = platform.device_arch(device)
        return arch

    def attention_instances(self):
        return [inst.name for inst in attention_plan.INSTANCES]

    def attention_refused_instances(self, arch):
        units = attention_plan.matrix_units(self.platform, arch.split(":")[0])
        return [inst.name for inst in attention_plan.INSTANCES if attention_plan.spills_on(units, inst)]

    def attention_check(self, q, k, v, out, dtype, sizes, strides, scale, device, instance=""):
        return attention_plan.check(q, k, v, out, dtype, sizes, strides, scale, self.platform, self._arch(device),
                                    device, instance)

    def attention_describe(self, q, k, v, out, dtype, sizes, strides, scale, device, instance=""):
        why = self.attention_check(q, k, v, out, dtype, sizes, strides, scale, device, instance)
        if why:
            return "error: " + why
        return attention_plan.describe(*attention_plan.plan(q, k, v, out, dtype, sizes, strides, scale, self.platform,
                                                            self._arch(device), self._facts(device)[1], instance))

    def attention_forward(self, q, k, v, out, dtype, sizes, strides, scale, stream, device, instance=""):
        self._raise_if(self.attention_check(q, k, v, out, dtype, sizes, strides, scale, device, instance))
        launch, _ = attention_plan.plan(q, k, v, out, dtype, sizes, strides, scale, self.platform, self._arch(device),
                                        self._facts(device)[1], instance)
        self._run(device, launch, stream)

    # ---- group_norm (hip/group_norm/'s launcher: group_norm_plan.py) ---------------------------------------------
    def _gn_args(self, x, y, gamma, beta, dtype, param_dtype, layout, n, c, hw, groups, eps, silu, workspace=0,
                 path=0, input_bias=0) -> group_norm_plan.Args:
        return group_norm_plan.Args(int(x), int(y), int(gamma), int(beta), int(dtype), int(param_dtype), int(layout),
                                    int(n), int(c), int(hw), int(groups), float(eps), bool(silu), int(workspace),
                                    int(path), int(input_bias))

    def _gn_facts(self, device: int) -> group_norm_plan.Facts:
        return group_norm_plan.Facts(self._facts(device)[0], self._l2_bytes(device))

    def _gn_capacity(self, device: int):
        """least_resident_blocks for the resident GroupNorm kernels of `device`: the least occupancy of the instances
        one launch may pick among (params of the input's type or float32, SiLU or not), asked of the loaded kernels,
        times the multiprocessors; 0 when the runtime cannot tell (the path is then refused, as in C++)."""
        def capacity(layout, dtype, vec, threads) -> int:
            key = (device, layout, dtype, vec, threads)
            cached = self._capacity.get(key)
            if cached:
                return cached
            unit, expressions = group_norm_plan.resident_kernels(layout, dtype, vec)
            functions = [self._function(device, unit, e) for e in expressions]
            try:
                if _current_device() == device:
                    least = min(self.runtime().occupancy(f, threads) for f in functions)
                else:
                    with torch.cuda.device(device):
                        least = min(self.runtime().occupancy(f, threads) for f in functions)
            except LaunchError as error:
                log.warning("rocm_sd: occupancy of the resident GroupNorm kernels unknown (%s)", error)
                return 0
            blocks = least * self._facts(device)[0]
            if blocks:  # 0 (unknown) is asked again next time, as in C++
                self._capacity[key] = blocks
            return blocks

        return capacity

    def group_norm_check(self, x, y, gamma, beta, dtype, param_dtype, layout, n, c, hw, groups, eps, silu, device):
        return group_norm_plan.check(self._gn_args(x, y, gamma, beta, dtype, param_dtype, layout, n, c, hw, groups,
                                                   eps, silu))

    def group_norm_workspace_bytes(self, x, y, dtype, layout, n, c, hw, groups, device, path=0):
        a = self._gn_args(x, y, 0, 0, dtype, dtype, layout, n, c, hw, groups, 1e-5, False, 0, path)
        return group_norm_plan.workspace_bytes(a, self._gn_facts(device), self._gn_capacity(device))

    def group_norm_describe(self, x, y, dtype, layout, n, c, hw, groups, device, path=0):
        a = self._gn_args(x, y, 0, 0, dtype, dtype, layout, n, c, hw, groups, 1e-5, False, 0, path)
        return group_norm_plan.describe(a, self._gn_facts(device), self._gn_capacity(device))

    def group_norm_forward(self, x, y, gamma, beta, dtype, param_dtype, layout, n, c, hw, groups, eps, silu, workspace,
                           stream, device, path=0, input_bias=0):
        a = self._gn_args(x, y, gamma, beta, dtype, param_dtype, layout, n, c, hw, groups, eps, silu, workspace, path,
                          input_bias)
        self._raise_if(group_norm_plan.check(a))
        self._run(device, group_norm_plan.launches(a, self._gn_facts(device), self._gn_capacity(device)), stream)
