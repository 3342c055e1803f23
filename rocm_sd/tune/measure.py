"""One problem, every candidate: reject the unsupported and the inaccurate, time the rest.

A candidate is checked against the float64 truth with the op's tolerance (OpSpec.within_tolerance: at most twice
PyTorch's own error at the same precision plus a rounding floor), so a fast wrong kernel is never chosen.
Timing replays a graph of calls cycling through input copies that together exceed the L2 cache
(rocm_sd/timing.py): device time, as the graph-captured pipeline sees it, not eager launch overhead.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .. import dispatch
from ..timing import graph_device_ms
from . import problems
from .harvest import OpCall

MAX_COPIES = 16


@dataclass
class Outcome:
    key: str
    times_ms: dict[str, float] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)

    @property
    def choice(self) -> str | None:
        return min(self.times_ms, key=self.times_ms.get) if self.times_ms else None

    def as_result(self, calls: int) -> dict:
        ranked = sorted(self.times_ms.items(), key=lambda kv: kv[1])
        torch_ms = self.times_ms.get(problems.TORCH)
        best = ranked[0][1]
        return {"choice": self.choice, "ms": round(best, 5), "torch_ms": None if torch_ms is None else round(torch_ms, 5),
                "speedup_vs_torch": None if torch_ms is None else round(torch_ms / best, 3),
                "runners_up": [[name, round(ms, 5)] for name, ms in ranked[1:]], "rejected": self.rejected,
                "calls_per_run": calls}


def _copies(args: tuple, l2_bytes: int) -> int:
    size = sum(a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor))
    return max(1, min(MAX_COPIES, -(-2 * l2_bytes // max(size, 1))))


def measure(call: OpCall, device: torch.device, l2_bytes: int, seed: int = 0) -> Outcome:
    gen = torch.Generator(device).manual_seed(seed)
    args = call.make_args(device, gen)
    spec = problems.OPS[call.op]
    outcome = Outcome(problems.key_of(call))
    truth = problems.truth(call.op, args)
    torch_out = spec.reference(*args)
    kernel_reasons = problems.candidate_reasons(call.op, args)
    candidates = spec.candidates(*args)
    inputs = [args] + [call.make_args(device, gen) for _ in range(_copies(args, l2_bytes) - 1)]
    for name, fn in candidates.items():
        if dispatch.torch_variant(name) is None and kernel_reasons:  # "torch:<variant>" is PyTorch too
            outcome.rejected[name] = "; ".join(kernel_reasons)
            continue
        try:
            out = fn(*args)
        except Exception as exc:  # noqa: BLE001 -- a variant that cannot take this shape says so by raising
            outcome.rejected[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
            continue
        ok, err, allowed = spec.within_tolerance(out, truth, torch_out)
        if not ok:
            outcome.rejected[name] = f"inaccurate: max error {err:.3g} > allowed {allowed:.3g}"
            continue
        try:
            outcome.times_ms[name] = graph_device_ms(fn, inputs)
        except RuntimeError as exc:  # the pipeline replays graphs: what cannot be captured cannot be chosen
            outcome.rejected[name] = f"graph capture failed: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
    return outcome
