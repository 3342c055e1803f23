"""`python -m rocm_sd generate`'s arguments, readable without torch: its --help and argument errors import none. The
modes and the default timeout live here for mesh.py too."""
from __future__ import annotations

from .. import cli_args, models

MODES = ("data", "cfg", "seq", "cfg-seq", "patch", "cfg-patch")
# The VAE decode of an image split over the ranks that make it (vae_split.py): above its size threshold, always, never.
VAE_SPLITS = ("auto", "on", "off")
# How long a collective may wait for a slow or stuck rank before the job ends with an error. The first
# one waits for every rank to build its pipeline, which for SDXL on a busy host takes minutes.
DEFAULT_TIMEOUT_S = 600.0
# Patch mode's synchronous steps per image (parallel/patch.py says why one).
PATCH_WARMUP = 1


def add_arguments(parser) -> None:
    parser.add_argument("--prompts", type=cli_args.text_lines,
                        help="text file, one prompt per line (blank lines skipped)")
    parser.add_argument("--prompt", action="append", help="a prompt (repeatable; added before --prompts)")
    parser.add_argument("--negative", default="", help="negative prompt for every image")
    parser.add_argument("--out", required=True, type=cli_args.output_folder,
                        help="folder for <index>.png and run.json (written by rank 0)")
    parser.add_argument("--model", default=None, type=cli_args.pipeline_model,
                        help=f"architecture with random weights ({', '.join(sorted(models.ARCHITECTURES))}) or a local "
                             "diffusers model folder (default: sd15 on a GPU, tiny on a CPU; in seq mode flux, tiny-flux; "
                             "in cfg-seq mode sd35, tiny-sd3)")
    parser.add_argument("--mode", choices=MODES, default="data",
                        help="data: prompts over all GPUs; cfg: each image's guidance halves on a pair of GPUs; seq: "
                             "each step of a diffusion transformer (SD3 / SD3.5, Flux) split over all GPUs by image "
                             "tokens; cfg-seq: the guidance halves on two halves of the GPUs, each half's tokens split "
                             "over its GPUs; patch: each UNet step (SD1.5 / SDXL) split over all GPUs by bands of "
                             "rows, DistriFusion's displaced patch parallelism (approximate after its warm-up); "
                             "cfg-patch: the guidance halves on two halves of the GPUs, each half's rows split over "
                             "its GPUs")
    cli_args.add_height_and_width(parser)
    parser.add_argument("--steps", type=cli_args.positive_int, default=50, help="denoising steps per image")
    parser.add_argument("--guidance", type=cli_args.finite_float, default=7.5,
                        help="guidance scale (classifier-free guidance; Flux: its distilled guidance embedding)")
    parser.add_argument("--batch", type=cli_args.positive_int, default=1, help="prompts per pipeline call")
    parser.add_argument("--seed", type=int, default=0, help="image i uses seed + i")
    parser.add_argument("--dtype", choices=cli_args.DTYPES,
                        help="default: float16 on a GPU (bfloat16 for the diffusion transformers), float32 on a CPU")
    parser.add_argument("--no-optimize", action="store_true", help="plain diffusers (to compare)")
    parser.add_argument("--no-warmup", action="store_true", help="time the first calls too")
    parser.add_argument("--vae-split", choices=VAE_SPLITS, default="auto",
                        help="every mode but data: the final VAE decode of each image in bands of rows over the "
                             "ranks that make it, blended as a tiled decode (auto: for latents of 128x128 or more, "
                             "1024x1024 images; on: every latent taller than the bands' overlap; off: every rank "
                             "decodes the whole image)")
    parser.add_argument("--patch-warmup", type=cli_args.positive_int,
                        help="patch and cfg-patch modes: the first steps of each image whose boundary rows, keys and "
                             f"values and GroupNorm statistics are exchanged synchronously (exact; default "
                             f"{PATCH_WARMUP}); later steps use the previous step's, sent while the step computes")
    parser.add_argument("--timeout-s", type=cli_args.positive_float, default=DEFAULT_TIMEOUT_S,
                        help="longest wait for another rank before the job fails")
