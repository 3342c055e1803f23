"""OpSpec: everything about one op in one object, and the one body every op runs.

Each rocm_sd/ops/<op>.py declares one OpSpec (its reference, argument checks, reasons against the kernel,
kernel launch, tuning problem key and candidates, sample arguments) and defines its torch op with
`SPEC.define`. The registry below lists them: the tuner, `info`, opcheck and the fake-kernel fuzzing iterate it.

Per call (`run`): the plan for the argument shapes (checked arguments, reasons against the kernel, the tuned
choice; computed once per shape and cached), then dispatch.choose, then the kernel or the PyTorch path. A call
that needs gradients takes the PyTorch path (differentiable); through torch's dispatcher the op's registered
backward differentiates the same PyTorch path. So callers never check for gradients themselves.
"""
from __future__ import annotations

import inspect
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from .. import _ext, dispatch
from ..op_names import OPS
from ._common import ERROR_FACTOR, NHWC, layout_of, within_tolerance

REGISTRY: dict[str, "OpSpec"] = {}


# ---- tuning problem keys: what the tuner records and the database is looked up by ----------------------------

def problem_key(op: str, dtype: str, layout: str, **shape) -> str:
    """'group_norm|float16|nhwc|N=2,C=320,HW=4096,G=32,act=silu': the parameters in the order given."""
    return f"{op}|{dtype}|{layout}|" + ",".join(f"{k}={v}" for k, v in shape.items())


def as_meta(arg):
    """A tensor to ask shapes, strides and layout of: a real argument, or a meta tensor for a recorded one (the
    tuner's harvest records shape, stride and dtype)."""
    if arg is None or isinstance(arg, torch.Tensor):
        return arg
    return torch.empty_strided(arg.shape, arg.stride, dtype=arg.dtype, device="meta")


def device_of(arg) -> torch.device | None:
    """A real argument's device (the CK instances offered are those with code for its GPU); None when recorded."""
    return arg.device if isinstance(arg, torch.Tensor) else None


def dtype_name(t) -> str:
    return str(t.dtype).removeprefix("torch.")


def layout_name(t) -> str:
    return {NHWC: "nhwc", None: "strided"}.get(layout_of(t), "nchw")


def spatial_size(x) -> int:
    return x.numel() // (x.shape[0] * x.shape[1]) if x.dim() >= 2 and x.shape[0] * x.shape[1] else 0


# ---- per-shape plans, kernel reasons, and when torch's dispatcher is needed ------------------------------------

def tensor_key(t: torch.Tensor | None):
    """What decides whether and how a kernel runs on `t`, except its values: for per-call caches."""
    if t is None:
        return None
    return (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16)


class PlanCache(dict):
    """Per-op cache of what the checks decided (fallback reasons, workspace bytes, the tuned choice) by
    argument key, so that they run once per shape rather than once per call. Bounded: cleared past
    `limit` entries."""

    _all: "weakref.WeakSet[PlanCache]" = weakref.WeakSet()

    def __init__(self, limit: int = 4096):
        super().__init__()
        self.limit = limit
        PlanCache._all.add(self)

    __hash__ = object.__hash__  # dicts are unhashable; a cache is kept in a WeakSet by identity

    @classmethod
    def clear_all(cls) -> None:
        """Forget every op's plans (the tuning database changed)."""
        for cache in list(cls._all):
            cache.clear()

    def get_or_compute(self, key, compute):
        value = self.get(key)
        if value is None:
            if len(self) >= self.limit:
                self.clear()
            value = self[key] = compute()
        return value


dispatch.on_tuning_changed(PlanCache.clear_all)  # a new database may choose differently for every shape


def kernel_reasons(device: torch.device, input_reasons: list[str], check) -> list[str]:
    """Every op's supports() rule: why _C cannot run on `device` (with the argument reasons, so the user
    sees all of them), else the argument reasons, else what the kernel's own check() says (C++ shape and
    occupancy limits, asked only for arguments that passed the Python checks)."""
    unavailable = _ext.unavailable_reason(device)
    if unavailable:
        return [unavailable] + input_reasons
    if input_reasons:
        return input_reasons
    why = check()
    return [why] if why else []


_profiler_enabled = torch._C._autograd._profiler_enabled


def dispatcher_needed() -> bool:
    """Whether a call must go through torch's dispatcher: torch.compile is tracing (fake kernels), a dispatch mode
    is active (the tuner's recorder, FakeTensorMode, export), or the profiler is on (its tables name the op)."""
    return torch.compiler.is_compiling() or _get_current_dispatch_mode() is not None or _profiler_enabled()


@dataclass
class Plan:
    """What an op decided for one argument shape: reasons against the kernel (empty: it can run), the tuning
    database's choice, and what the op's launch or PyTorch path needs (a kernel path or instance, workspace
    bytes)."""
    reasons: list[str]
    tuned: str | None = None
    detail: Any = None
    counted_as: str = dispatch.KERNEL  # what a kernel-path call counts as (ops hosting CK fusions: "composed")


def ck_hosted_plan(spec: "OpSpec", args: tuple, instances, ck_reasons: Callable[[], list[str]]) -> Plan:
    """The plan of the ops that host a CK fusion (linear_geglu, conv_bias_residual): no reasons against their
    default path, the vendor GEMM / convolution then a rocm_sd epilogue op (counted as composed), and as detail
    the CK instance to run instead: the tuned one, only where this build has it and the call fits it (a database
    made on another build never names an instance that would fail here)."""
    tuned = spec.tuned_choice(*args)
    ck = dispatch.ck_instance(tuned)
    device = next(a.device for a in args if isinstance(a, torch.Tensor))
    runs = ck is not None and ck in instances and device.type == "cuda" and not ck_reasons()
    return Plan([], tuned, ck if runs else None, dispatch.KERNEL if runs else dispatch.COMPOSED)


def _no_candidates(*args) -> dict:
    return {}


@dataclass(eq=False)
class OpSpec:
    name: str
    reference: Callable                 # PyTorch's computation, differentiable; on float64 inputs, the truth
    check_args: Callable                # raises what PyTorch would for these arguments
    fake: Callable                      # the outputs' shapes, dtypes and layouts (the op's fake kernel)
    supports: Callable                  # reasons the kernel cannot run these arguments ([] when it can)
    launch: Callable                    # (plan, *args) -> the kernel path's outputs
    torch_path: Callable                # (*args) -> the PyTorch path's outputs, laid out as the kernel's; differentiable
    plan_key: Callable                  # (*args) -> what decides the plan except values (tensor_key and scalars)
    key: Callable                       # (*args, real or recorded) -> the tuning problem key
    samples: Callable                   # (device, dtype) -> [args, ...]: small calls covering each layout
    candidates: Callable = _no_candidates  # (*args) -> {choice: fn(*args)}: what the tuner times
    plan: Callable | None = None        # (*args) -> Plan, for ops that decide more than reasons and tuned choice
    tuned_torch_path: Callable | None = None  # (plan, *args) -> outputs, where a tuned "torch:<variant>" matters
    kernel: Callable | None = None      # the HIP kernel itself, no dispatch (tests, tuner, sanitizer)
    ck_instances: Callable | None = None  # (device=None) -> the Composable Kernel instances in this build
    error_factor: float = ERROR_FACTOR  # tolerance: times PyTorch's own error against the float64 truth
    error_floor: float = 0.0            # and at least this part of the truth's largest magnitude (ops that approximate)
    op: Any = field(default=None, repr=False)
    plans: PlanCache = field(default_factory=PlanCache, repr=False)
    _defaults: tuple = field(default=(), repr=False)
    _arity: int = field(default=0, repr=False)

    # ---- one call --------------------------------------------------------------------------------------

    def make_plan(self, *args) -> Plan:
        """Checks the arguments (raising as PyTorch would), then the op's own plan, or the common one: the
        reasons against the kernel and, if none, the tuned choice for the call's problem."""
        self.check_args(*args)
        return self.plan(*args) if self.plan is not None else self.default_plan(*args)

    def default_plan(self, *args) -> Plan:
        reasons = self.supports(*args)
        return Plan(reasons, None if reasons else self.tuned_choice(*args))

    def tuned_choice(self, *args) -> str | None:
        device = next(a.device for a in args if isinstance(a, torch.Tensor))
        return dispatch.tuned_choice(device, lambda: self.key(*args))

    def run(self, *args):
        """The op's body: plan (cached per shape), choose, then the kernel or the PyTorch path."""
        if len(args) < self._arity:
            args = args + self._defaults[len(args) - self._arity:]
        plan = self.plans.get_or_compute(self.plan_key(*args), lambda: self.make_plan(*args))
        if dispatch.choose(self.name, plan.reasons, plan.tuned, plan.counted_as) == dispatch.KERNEL:
            return self.launch(plan, *args)
        if self.tuned_torch_path is not None:
            return self.tuned_torch_path(plan, *args)
        return self.torch_path(*args)

    def call(self, *args):
        """The op without torch's dispatcher where nothing needs it (`op.call`): a custom op written in Python
        costs ~16 us of host time per call through the dispatcher, and eager hosts make ~140 calls per UNet
        evaluation. torch.compile tracing, dispatch modes (the tuner's recorder, FakeTensorMode) and the
        profiler get the op itself; a call that needs gradients gets the differentiable PyTorch path."""
        if dispatcher_needed():
            return self.op(*args)
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            dispatch.count(self.name, dispatch.TORCH)
            return self.torch_path(*args)
        return self.run(*args)

    def within_tolerance(self, out, truth, torch_out) -> tuple[bool, float, float]:
        """(ok, error, allowed): `out` against the float64 truth, allowed error_factor x PyTorch's own error, or
        error_floor x the truth's largest magnitude where that is more (a NaN where the truth has none never is)."""
        ok, err, allowed = within_tolerance(out, truth, torch_out, self.error_factor)
        if self.error_floor and err == err:
            allowed = max(allowed, self.error_floor * truth.double().nan_to_num().abs().max().item())
            ok = err <= allowed
        return ok, err, allowed

    # ---- definition --------------------------------------------------------------------------------------

    def define(self, signature: Callable):
        """Registers torch.ops.rocm_sd.<name> with `signature`'s parameters and docstring (its body is not used:
        every op runs `run`), its fake kernel and its backward; returns the op, with `.call`."""
        if self.name not in OPS:
            raise ValueError(f"op {self.name!r} is not listed in rocm_sd/op_names.py's OPS (the commands list the ops "
                             "from there without importing torch)")
        params = list(inspect.signature(signature).parameters.values())
        self._arity = len(params)
        self._defaults = tuple(p.default for p in params if p.default is not inspect.Parameter.empty)

        def body(*args):
            return self.run(*args)

        body.__name__, body.__qualname__, body.__doc__ = signature.__name__, signature.__qualname__, signature.__doc__
        body.__signature__ = inspect.signature(signature)
        body.__annotations__ = signature.__annotations__
        body.__module__ = signature.__module__
        op = torch.library.custom_op(f"rocm_sd::{self.name}", mutates_args=())(body)
        op.register_fake(self.fake)
        op.register_autograd(self._backward, setup_context=self._setup_backward)
        op.call = self.call
        self.op = op
        REGISTRY[self.name] = self
        return op

    def _setup_backward(self, ctx, inputs, output) -> None:
        ctx.tensor_slots = [i for i, a in enumerate(inputs) if isinstance(a, torch.Tensor)]
        ctx.inputs = [None if isinstance(a, torch.Tensor) else a for a in inputs]
        ctx.save_for_backward(*(inputs[i] for i in ctx.tensor_slots))

    def _backward(self, ctx, *grads):
        """Differentiates the op's PyTorch path at the saved inputs (the kernels are forward-only)."""
        inputs = list(ctx.inputs)
        wanted = []
        for slot, tensor in zip(ctx.tensor_slots, ctx.saved_tensors):
            inputs[slot] = tensor.detach().requires_grad_(ctx.needs_input_grad[slot])
            if ctx.needs_input_grad[slot]:
                wanted.append(slot)
        with torch.enable_grad():
            outputs = self.torch_path(*inputs)
            outputs = outputs if isinstance(outputs, tuple) else (outputs,)
            pairs = [(o, g) for o, g in zip(outputs, grads) if g is not None and o.requires_grad]
            found = torch.autograd.grad([o for o, _ in pairs], [inputs[s] for s in wanted],
                                        [g for _, g in pairs], allow_unused=True) if pairs else [None] * len(wanted)
        result = [None] * len(inputs)
        for slot, grad in zip(wanted, found):
            result[slot] = grad
        return tuple(result)
