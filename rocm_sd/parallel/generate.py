"""`torchrun --nproc-per-node N -m rocm_sd generate`: many prompts over N GPUs, images gathered on rank 0.

    torchrun --nproc-per-node 4 -m rocm_sd generate --prompts prompts.txt --out images/
    torchrun --nproc-per-node 2 -m rocm_sd generate --mode cfg --prompt "a lighthouse at dawn" --out one/
    torchrun --nproc-per-node 4 -m rocm_sd generate --mode seq --model flux --prompt "a lighthouse at dawn" --out one/
    torchrun --nproc-per-node 4 -m rocm_sd generate --mode cfg-seq --model sd35 --prompt "a lighthouse" --out one/
    torchrun --nproc-per-node 2 -m rocm_sd generate --mode patch --model sdxl --prompt "a lighthouse" --out one/
    torchrun --nproc-per-node 4 -m rocm_sd generate --mode cfg-patch --model sdxl --prompt "a lighthouse" --out one/

Image i (prompt i of the list) is made from seed `--seed + i` with its own generator, in the same batch
of consecutive prompts whatever the number of GPUs: the images do not depend on how many GPUs made
them. Rank 0 writes `<out>/<i:05d>.png` as rounds finish and `<out>/run.json` (prompts, seeds, settings,
timings) at the end. Without torchrun it runs in one process.
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import torch
from tqdm import tqdm

from .. import cli_args, models, patch, platform
from ..files import write_atomically, write_json_atomically
from .arguments import PATCH_WARMUP
from .cfg import enable_cfg_parallel
from .lookout import Lookout
from .mesh import Mesh, init, shutdown
from .patch import architecture_rows_problem, enable_patch_parallel
from .rounds import JobFailed, all_gather, batches, checked, gather_to_root, run_rounds
from .seq import enable_sequence_parallel
from .vae_split import enable_vae_split

WARMUP_STEPS = 2   # a short call per batch shape before timing: graph capture and kernel choice happen there
PNG_THREADS = 4


@dataclass
class Job:
    prompts: list[str]
    negative: str = ""
    seed: int = 0
    batch: int = 1
    height: int | None = None
    width: int | None = None
    steps: int = 50
    guidance: float = 7.5


@dataclass
class Timings:
    setup_s: float = 0.0          # pipeline built, optimized, weights checked on every rank
    warmup_s: float = 0.0
    generate_s: float = 0.0       # the rounds, from the first call to the last image on rank 0's disk
    round_s: list[float] = field(default_factory=list)

    def summary(self, n_images: int) -> dict:
        return {**asdict(self), "images_per_s": n_images / self.generate_s if self.generate_s else None,
                "median_round_s": statistics.median(self.round_s) if self.round_s else None}


def to_uint8(images: np.ndarray) -> np.ndarray:
    """diffusers' float images in [0, 1] as PIL would store them."""
    return (images * 255).round().clip(0, 255).astype(np.uint8)


def call_pipeline(pipe, job: Job, indices: range, steps: int | None = None) -> np.ndarray:
    """Images for prompts `indices` of the job: [n, H, W, 3] uint8."""
    device = models.denoiser(pipe).device
    generators = [torch.Generator(device).manual_seed(job.seed + i) for i in indices]
    with torch.inference_mode():
        out = pipe(**models.conditioning(pipe, [job.prompts[i] for i in indices], job.negative),
                   height=job.height, width=job.width, num_inference_steps=steps or job.steps,
                   guidance_scale=job.guidance, generator=generators, output_type="np")
    return to_uint8(out.images)


def weights_fingerprint(pipe) -> float:
    """A sum over the UNet's weights: equal on every rank, or the ranks would make different pictures."""
    with torch.no_grad():
        return float(sum(p.detach().double().sum() for p in models.denoiser(pipe).parameters()))


def prepare(mesh: Mesh, model: str, dtype: torch.dtype, optimize: bool, vae_split: str = "auto",
            patch_warmup: int = PATCH_WARMUP):
    """The pipeline on this rank's device, optimized, split for cfg, seq or patch mode (patch mode: `patch_warmup`
    synchronous steps per image; patch.py) and its VAE decode over the ranks of an image (`vae_split`: auto, on or
    off; vae_split.py); checked against the other ranks."""
    def build():
        pipe = models.load_pipeline(model, mesh.device, dtype)
        if optimize:
            # Patch mode's exchanges change from step to step: a captured step would replay one step's (patch.py).
            patch.optimize(pipe, **({"cuda_graph": False} if mesh.patch_group is not None else {}))
        if mesh.cfg_group is not None:
            enable_cfg_parallel(pipe, mesh.cfg_group, mesh.lookout)
        if mesh.seq_group is not None:
            enable_sequence_parallel(pipe, mesh.seq_group, mesh.lookout)
        if mesh.patch_group is not None:
            enable_patch_parallel(pipe, mesh.patch_group, mesh.lookout, patch_warmup)
        if mesh.image_group is not None:
            enable_vae_split(pipe, mesh.image_group, mesh.lookout, vae_split)
        return pipe, weights_fingerprint(pipe)

    pipe, fingerprint = checked(mesh, "pipeline setup", build)
    fingerprints = all_gather(mesh, "weights check", fingerprint)
    if any(f != fingerprints[0] for f in fingerprints):  # the same list on every rank: all raise together
        raise JobFailed(f"the ranks hold different UNet weights (fingerprints {fingerprints}); every rank must "
                        "load the same model")
    return pipe


def run(mesh: Mesh, pipe, job: Job, out_dir: str | None = None, progress: bool = True,
        warmup: bool = True) -> tuple[list[np.ndarray] | None, Timings]:
    """Make every image of `job` over the mesh. Rank 0 gets them in prompt order (and in `out_dir` when
    given); other ranks get None. Timings are rank 0's."""
    timings = Timings()
    items = batches(len(job.prompts), job.batch)
    if warmup:
        start = time.perf_counter()
        shapes = {len(r): r for r in items}.values()  # one call per distinct batch size
        checked(mesh, "warm-up", lambda: [call_pipeline(pipe, job, r, steps=WARMUP_STEPS) for r in shapes])
        # NCCL sets up the point-to-point connections of a gather on its first use, which would otherwise land
        # in the first round's time.
        gather_to_root(mesh, "warm-up", None)
        timings.warmup_s = time.perf_counter() - start

    images: list[np.ndarray | None] = [None] * len(job.prompts)
    bar = tqdm(total=len(job.prompts), unit="img", disable=not (progress and mesh.rank == 0))
    # PNG encoding (~25 ms for 512x512) runs on threads (Pillow releases the GIL): on rank 0's main thread
    # it would hold up every round of every rank.
    writer = ThreadPoolExecutor(max_workers=PNG_THREADS) if out_dir and mesh.rank == 0 else None
    saved = []
    last = time.perf_counter()
    timings_start = last

    def collect(done: list[int], results: list[np.ndarray]) -> None:
        nonlocal last
        for item, result in zip(done, results):
            for i, image in zip(items[item], result):
                images[i] = image
                if writer is not None:
                    saved.append(writer.submit(_save_png, image, os.path.join(out_dir, f"{i:05d}.png")))
            bar.update(len(items[item]))
        now = time.perf_counter()
        timings.round_s.append(now - last)
        last = now

    if writer is not None:
        os.makedirs(out_dir, exist_ok=True)
    try:
        run_rounds(mesh, len(items), lambda item: call_pipeline(pipe, job, items[item]), collect)
    finally:
        if writer is not None:
            writer.shutdown(wait=True)
    for future in saved:
        future.result()  # a failed write (disk full, permissions) is an error, not a missing file
    timings.generate_s = time.perf_counter() - timings_start
    bar.close()
    return (images if mesh.rank == 0 else None), timings


def _save_png(image: np.ndarray, path: str) -> None:
    """Whole or not at all: the lookout may end rank 0 while a writer thread is in the middle of an image."""
    from PIL import Image

    write_atomically(path, lambda f: Image.fromarray(image).save(f, format="PNG"), durable=False)


def read_prompts(from_file: list[str] | None, inline: list[str] | None) -> list[str]:
    """The job's prompts: --prompt's, then the lines of the --prompts file (read and checked while parsing)."""
    prompts = list(inline or []) + list(from_file or [])
    if not prompts:
        raise cli_args.UsageError("no prompts: give --prompts FILE (one per line) or --prompt TEXT")
    return prompts


def report_failure(mesh: Mesh, message: str) -> None:
    print(f"rocm_sd generate failed on {mesh.world} ranks:\n{message}" if mesh.rank == 0
          else f"rank {mesh.rank}: stopping, the job failed ({message.splitlines()[0]})", file=sys.stderr)


def with_lookout(mesh: Mesh) -> Mesh:
    """The mesh with a lookout started on it: where no collective can bring this rank a failure (a CFG
    partner's, a lost rank), the lookout reports it with report_failure and ends the process (lookout.py)."""
    store = torch.distributed.distributed_c10d._get_default_store()
    lookout = Lookout(mesh.rank, mesh.world, store, lambda message: report_failure(mesh, message), mesh.timeout_s)
    return replace(mesh, lookout=lookout.start())


def main(args) -> int:
    start = time.perf_counter()
    job = Job(prompts=read_prompts(args.prompts, args.prompt), negative=args.negative, seed=args.seed,
              batch=args.batch, height=args.height, width=args.width, steps=args.steps, guidance=args.guidance)
    splits_tokens = args.mode in ("seq", "cfg-seq")
    if splits_tokens and args.model in models.ARCHITECTURES and not models.is_transformer(args.model):
        raise cli_args.UsageError(f"argument --mode: {args.mode} splits a diffusion transformer's tokens; {args.model} "
                                  "is a UNet model: give --model sd3 / sd35m / sd35 / flux / flux-schnell (or a model "
                                  "folder of one), or --mode cfg")
    splits_rows = args.mode in ("patch", "cfg-patch")
    if splits_rows and args.model in models.ARCHITECTURES and models.is_transformer(args.model):
        raise cli_args.UsageError(f"argument --mode: {args.mode} splits a UNet's rows (SD1.5 / SDXL); {args.model} is "
                                  "a diffusion transformer: use --mode seq (or cfg-seq for SD3 / SD3.5)")
    unet = args.model or ("sd15" if platform.gpu_available() else "tiny")  # the patch modes' default, as below
    if splits_rows and unet in models.ARCHITECTURES:  # a model folder's UNet says so at its first step
        bands = int(os.environ.get("WORLD_SIZE", "1")) // (2 if args.mode == "cfg-patch" else 1)
        problem = architecture_rows_problem(models.ARCHITECTURES[unet], args.height, max(bands, 1))
        if problem:
            raise cli_args.UsageError(f"argument --height: {problem}")
    if args.patch_warmup is not None and not splits_rows:
        raise cli_args.UsageError(f"argument --patch-warmup: only --mode patch and cfg-patch have warm-up steps, not "
                                  f"{args.mode}")
    patch_warmup = args.patch_warmup or PATCH_WARMUP
    if args.vae_split == "on" and args.mode == "data":
        raise cli_args.UsageError("argument --vae-split: on splits the decode of an image over the ranks that make it "
                                  "together (every --mode but data); in data mode each image is one rank's")
    try:
        mesh = init(args.mode, args.timeout_s)
    except ValueError as error:  # cfg mode on an odd number of processes (one without torchrun): init says so
        raise cli_args.UsageError(f"argument --mode: {error}") from None
    if mesh.distributed:
        mesh = with_lookout(mesh)
    on_gpu = mesh.device.type == "cuda"
    defaults = {"seq": ("flux", "tiny-flux"), "cfg-seq": ("sd35", "tiny-sd3")}.get(args.mode, ("sd15", "tiny"))
    model = args.model or defaults[0 if on_gpu else 1]
    dtype = getattr(torch, args.dtype) if args.dtype else models.gpu_dtype(model) if on_gpu else torch.float32
    try:
        pipe = prepare(mesh, model, dtype, optimize=not args.no_optimize, vae_split=args.vae_split,
                       patch_warmup=patch_warmup)
        setup_s = time.perf_counter() - start
        images, timings = run(mesh, pipe, job, out_dir=args.out, warmup=not args.no_warmup)
    except JobFailed as exc:
        # Every rank stops here together; rank 0 says what happened where. The process group is not torn
        # down: after a lost rank that can block, and the processes end now anyway. JobFailed comes only
        # from several ranks, which have a lookout: it reports, unless it is ending the process already.
        mesh.lookout.conclude(str(exc))
        return 1
    if mesh.lookout is not None:
        mesh.lookout.stop()
    timings.setup_s = setup_s
    if mesh.rank == 0:
        summary = timings.summary(len(job.prompts))
        write_json_atomically(os.path.join(args.out, "run.json"), {
            "model": model, "dtype": str(dtype).removeprefix("torch."), "mode": args.mode, "vae_split": args.vae_split,
            **({"patch_warmup": patch_warmup} if splits_rows else {}),
            "gpus": mesh.world,
            "device": torch.cuda.get_device_name(mesh.device) if on_gpu else "cpu",
            "arch": platform.device_arch(mesh.device) if on_gpu else "cpu", "optimized": not args.no_optimize,
            "job": asdict(job), "timings": summary, "images": [f"{i:05d}.png" for i in range(len(images))]})
        print(f"{len(images)} images on {mesh.world} process(es), mode {args.mode}: setup {summary['setup_s']:.1f} s, "
              f"warm-up {summary['warmup_s']:.1f} s, generation {summary['generate_s']:.2f} s "
              f"({summary['images_per_s']:.2f} images/s), median round {summary['median_round_s']:.3f} s -> {args.out}")
    shutdown(wait_s=min(60.0, mesh.timeout_s))
    return 0
