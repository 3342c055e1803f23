"""`python -m rocm_sd prepare`: every convolution and GEMM problem a model issues at the given image sizes, run once
before the first image, so that the vendors' per-problem searches are done by then.

MIOpen searches its convolution algorithms at the first call of each problem (its "find", minutes for a VAE decode at
a new size) and keeps the result in its user database, which later processes read; PyTorch TunableOp does the same for
the GEMMs on ROCm. Both run here as the tuner's vendor pass runs them (tune/vendor.py: their files beside the tuning
database, which rocm_sd.optimize() points later processes at). cuDNN's benchmark mode is NVIDIA's equivalent, but
cuDNN keeps its choices in the process only: on NVIDIA this fills the searches of the process that calls run() (the
ComfyUI Tune node's), not of a later one.

run_sizes() is the machinery: per size a "run one size" callable under the vendors' searches and the problem recorder,
the time and new problems per size, the printed lines. run() gives it a diffusers pipeline; a host gives it its own
loaded model (the A1111 / Forge tab: a one-step txt2img of the webui's model, integrations/a1111), which is more exact
(the host's dtypes and layouts) and needs no diffusers: this module imports diffusers only inside run().

Per size, the pipeline as rocm_sd.optimize() runs it (graphs off: nothing is searched inside a capture) makes one
call of one step: the text encoders, the UNet or transformer step at the pipeline's batch (twice the images with
CFG), and the VAE decode, in fixed-shape tiles where optimize()'s vae_tiles is on (the default on ROCm), so that any
later size reuses the tiles' problems. Random weights of the architecture's shapes are enough: a problem is its
shapes, layouts and dtypes, not its values.
"""
from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from tqdm import tqdm

from . import platform
from .tune.harvest import _spec

# aten ops that are a convolution library's or a GEMM library's problem (linear layers decompose into mm / addmm).
VENDOR_OPS = {"convolution": "convolution", "mm": "GEMM", "addmm": "GEMM", "bmm": "GEMM", "baddbmm": "GEMM",
              "_addmm_activation": "GEMM", "_scaled_mm": "GEMM"}
PROMPT = "a photograph of a lighthouse at dawn"


def _hashable(value):
    return tuple(map(_hashable, value)) if isinstance(value, (list, tuple)) else _spec(value)


class VendorProblems(TorchDispatchMode):
    """The distinct convolution and GEMM problems run under it: {(op, argument specs): 'convolution' | 'GEMM'} in
    first-seen order, a problem being its shapes, strides, dtypes and other arguments (what a search is keyed by)."""

    def __init__(self):
        super().__init__()
        self.problems: dict[tuple, str] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kind = VENDOR_OPS.get(func.overloadpacket.__name__)
        if kind is not None:
            key = (func.overloadpacket.__name__, tuple(_hashable(a) for a in args),
                   tuple(sorted((k, _hashable(v)) for k, v in (kwargs or {}).items())))
            self.problems.setdefault(key, kind)
        return func(*args, **(kwargs or {}))

    def count(self, kind: str) -> int:
        return sum(1 for k in self.problems.values() if k == kind)


@dataclass
class Prepared:
    """What run() did: per size (width, height), its seconds and the problems new at that size; the totals."""
    model: str
    seconds: float = 0.0
    sizes: dict = field(default_factory=dict)     # (width, height) -> {"seconds", "convolution", "GEMM"}
    problems: dict = field(default_factory=dict)  # VendorProblems.problems over all sizes
    searched: str = ""                            # what filled which search, or why nothing did
    lines: list = field(default_factory=list)     # what run() printed: for hosts that show it elsewhere (a UI)

    def count(self, kind: str) -> int:
        return sum(1 for k in self.problems.values() if k == kind)


def _searches(device: torch.device) -> str:
    if device.type != "cuda":
        return ("on a CPU: no convolution or GEMM search to fill (MIOpen's find and cuDNN's benchmark are GPU "
                "libraries'); the model ran once per size")
    if platform.torch_gpu_platform() == "hip":
        return "MIOpen find and PyTorch TunableOp, kept for later processes"
    return ("cuDNN benchmark mode: its choices last for this process only (cuDNN keeps no file), so a later process "
            "searches again; call rocm_sd.prepare.run() in the process that generates")


def _vendor_searches(device: torch.device):
    """The tuner's vendor pass (MIOpen find and TunableOp into the tuning database's folder on ROCm, cuDNN benchmark
    mode on CUDA); nothing on a CPU."""
    if device.type != "cuda":
        return nullcontext([])
    from .tune import TuningDB, device_key, validators
    from .tune.vendor import vendor_tuning

    key = device_key(device)
    return vendor_tuning(TuningDB(key, validators(device)).path.parent, key.file_stem)


def _default_size(pipe) -> int:
    """A model folder's pipeline's own image size: its denoiser's sample size in latents (SDXL, SD3 and Flux
    pipelines keep it as default_sample_size), times the VAE's scale."""
    from . import models

    latents = getattr(pipe, "default_sample_size", None) or models.denoiser(pipe).config.sample_size
    return latents * pipe.vae_scale_factor


def run_sizes(name: str, run_size, sizes, device: str | torch.device, describe: str = "",
              progress: bool = True) -> Prepared:
    """Calls `run_size(width, height)` once per (width, height) of `sizes`, under the vendors' searches and the
    problem recorder, and returns what ran as a Prepared named `name`. `describe`: what runs, for the first printed
    line (dtype, batch, how it decodes). Prints a line per size and the total."""
    device = torch.device(device)
    result = Prepared(name, searched=_searches(device))
    sizes = list(sizes)
    recorder = VendorProblems()
    with _vendor_searches(device) as notes, torch.no_grad():
        for width, height in tqdm(sizes, unit="size", disable=not progress or None, desc="prepare"):
            before, start = set(recorder.problems), time.perf_counter()
            with recorder:
                run_size(width, height)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            new = [kind for key, kind in recorder.problems.items() if key not in before]
            result.sizes[(width, height)] = {"seconds": time.perf_counter() - start, "convolution": new.count(
                "convolution"), "GEMM": new.count("GEMM")}
    result.problems = recorder.problems
    result.seconds = sum(row["seconds"] for row in result.sizes.values())
    result.lines = [f"rocm_sd prepare: {name}{', ' * bool(describe)}{describe}"]
    result.lines += [f"  {width}x{height}: {row['seconds']:.1f} s, {row['convolution']} new convolution and "
                     f"{row['GEMM']} new GEMM problems" for (width, height), row in result.sizes.items()]
    result.lines += [f"  {note}" for note in notes or []]
    result.lines.append(f"prepared {len(sizes)} size{'s' * (len(sizes) != 1)} in {result.seconds:.1f} s: "
                        f"{result.count('convolution')} convolution and {result.count('GEMM')} GEMM problems; "
                        f"{result.searched}")
    print("\n".join(result.lines))
    return result


def run(model: str = "sd15", sizes=None, batch: int = 1, dtype: torch.dtype | None = None,
        device: str | torch.device | None = None, progress: bool = True, **flags) -> Prepared:
    """Runs every convolution and GEMM problem of `model` (an architecture name, random weights, or a local diffusers
    folder) at each (width, height) of `sizes` (default: the model's own square size), `batch` images per
    call, once, with the vendors' searches on. `flags`: optimize() flags, as the later runs will use them (e.g.
    vae_tiles=False where the host decodes the VAE itself). Prints a line per size and the total."""
    from . import models, patch

    device = torch.device(device or ("cuda" if platform.gpu_available() else "cpu"))
    if device.type == "cuda":
        if device.index is None:  # torch.cuda.set_device takes only a numbered device
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    dtype = dtype or (models.gpu_dtype(model) if device.type == "cuda" else torch.float32)
    built = time.perf_counter()
    pipe = patch.optimize(models.load_pipeline(model, device, dtype), **{"cuda_graph": False, **flags})
    tiles = ("VAE decode in fixed-shape tiles" if "decode in fixed-shape tiles" in patch.report(pipe).get("vae", {})
             else "VAE decode untiled")
    conditioning = models.conditioning(pipe, [PROMPT] * batch)
    sizes = list(sizes or [(models.default_size(model) if model in models.ARCHITECTURES else _default_size(pipe),) * 2])
    built = time.perf_counter() - built

    def run_size(width: int, height: int) -> None:
        pipe(**conditioning, height=height, width=width, num_inference_steps=1, output_type="np")

    try:
        return run_sizes(model, run_size, sizes, device, progress=progress, describe=(
            f"{str(dtype).removeprefix('torch.')}, batch {batch}, on {device} (built in {built:.1f} s); {tiles}"))
    finally:
        del pipe, run_size
        if device.type == "cuda":
            torch.cuda.empty_cache()
