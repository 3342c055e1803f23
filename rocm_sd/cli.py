"""`python -m rocm_sd {info,demo,bench,quality,generate,prepare}`."""
from __future__ import annotations

import argparse

from . import cli_args, engines, models
from .parallel import arguments as generate_arguments
from .patch.flags import FLAG_NAMES, OPTIONS
from .quality_prompts import PROMPTS

# The parser reads light modules only (no torch, no diffusers): --help and argument errors answer at once. Each command
# imports what it runs when it runs (tests/test_imports.py).


def _info(args) -> int:
    from . import info

    return info.run()


def _bench(args) -> int:
    from . import bench, platform
    from .quality import cache_mode_problem

    on_gpu = platform.gpu_available()
    model = args.model or ("sd15" if on_gpu else "tiny")
    all_engines = engines.TRANSFORMER_ENGINES if models.is_transformer(model) else engines.ENGINES
    chosen = args.engines or (all_engines if on_gpu else ("eager", "rocm_sd"))
    for engine in chosen:
        why = cache_mode_problem(engines.MODES.get(engine, {}).get("cache"), model)
        if why:
            raise cli_args.UsageError(f"argument --engines: {engine}: {why}")
    bench.run(model=model, size=args.size, steps=args.steps, batch=args.batch,
              repeats=args.repeats, warmup=args.warmup, engines=chosen, ablation=args.ablation, out_dir=args.out,
              profile=args.profile)
    return 0


def _demo(args) -> int:
    from . import demo

    demo.run(out_dir=args.out, arch=args.arch, steps=args.steps, size=args.size, repeats=args.repeats)
    return 0


def _quality(args) -> int:
    from . import quality

    quality.run(model=args.model, precision=args.precision, cache=args.cache, cache_interval=args.cache_interval,
                cache_threshold=args.cache_threshold, cache_branch=args.cache_branch,
                precision_layers=args.precision_layers, attention_precision=args.attention_precision,
                precision_convs=None if args.precision_convs is None else args.precision_convs == "on",
                prompts=args.prompts, steps=args.steps, size=args.size,
                seed=args.seed, device=args.device, out_dir=args.out)
    return 0


def _add_quality(sub) -> None:
    modes = {option.name: [v for v in option.values if v != option.default] for option in OPTIONS if option.values}
    parser = cli_args.command(sub.add_parser(
        "quality", help="images of an optimize() mode (fp8, int8, FP8 attention, step caching) against the fp16 reference: PSNR, "
                        "SSIM, time (docs/quality.md)"), _quality)
    parser.add_argument("--model", default=None, type=cli_args.pipeline_model,
                        help=f"architecture with random weights ({', '.join(sorted(models.ARCHITECTURES))}) or a local "
                             "diffusers model folder (default: sd15 on a GPU, tiny on a CPU)")
    parser.add_argument("--precision", choices=modes["precision"], help="the mode's number format")
    parser.add_argument("--precision-layers", choices=("measured", "all"),
                        help="with --precision: 'measured' (default) keeps layers in fp16 where the tuning database "
                             "measured them faster; 'all' makes every layer 8-bit (docs/precision.md)")
    parser.add_argument("--precision-convs", choices=("on", "off"),
                        help="with --precision fp8: 'on' (default) runs the resnets' 3x3 convolutions as FP8 GEMMs "
                             "where measured faster; 'off' keeps them in fp16, to see what they cost "
                             "(docs/precision.md)")
    parser.add_argument("--attention-precision", choices=modes["attention_precision"],
                        help="the number format of the UNet's attention products (FP8 where the tuning database "
                             "measured it faster; docs/precision.md)")
    parser.add_argument("--cache", choices=modes["cache"], help="the mode's step caching")
    parser.add_argument("--cache-interval", type=cli_args.positive_int,
                        help="with --cache deepcache: one full UNet call per this many steps (default 3)")
    parser.add_argument("--cache-threshold", type=cli_args.non_negative_float,
                        help="with --cache adaptive: the summed relative input change that triggers a full UNet call "
                             "(default 0.15); with fbcache / teacache (the diffusion transformers): the change of the "
                             "first block's residual / modulated input that does (default: the published value for "
                             "the model; docs/step_cache.md)")
    parser.add_argument("--cache-branch", type=cli_args.non_negative_int,
                        help="with --cache: how much of the outermost block the partial UNet calls run, as DeepCache's "
                             "cache_branch_id (default 0: its last up layer only; docs/step_cache.md)")
    parser.add_argument("--prompts", type=cli_args.positive_int, default=4,
                        help=f"how many images (prompts from a fixed list of {len(PROMPTS)}, in turn)")
    parser.add_argument("--steps", type=cli_args.positive_int, default=20, help="denoising steps")
    parser.add_argument("--size", type=cli_args.image_size,
                        help="image height and width in pixels (default: the model's)")
    parser.add_argument("--seed", type=int, default=0, help="image i uses seed + i")
    parser.add_argument("--device", type=cli_args.torch_device,
                        help="cpu, cuda or cuda:N (default: cuda where torch sees a GPU, else cpu)")
    parser.add_argument("--out", default="rocm_sd_quality", type=cli_args.output_folder,
                        help="folder for <model>-<mode>.json, .md and .png (the side-by-side grid)")


def _prepare(args) -> int:
    import torch

    from . import platform, prepare

    on_gpu = platform.gpu_available()
    model = cli_args.checkpoint_architecture(args.model or ("sd15" if on_gpu else "tiny"), "preparing")
    dtype = getattr(torch, args.dtype) if args.dtype and on_gpu else None
    flags = {} if args.vae_tiles is None else {"vae_tiles": args.vae_tiles == "on"}
    prepare.run(model, args.sizes, batch=args.batch, dtype=dtype, **flags)
    return 0


def _add_prepare(sub) -> None:
    parser = cli_args.command(sub.add_parser(
        "prepare", help="run every convolution and GEMM problem of a model at the given sizes once, so that MIOpen's "
                        "first-run search (find) is done before the first image (docs/amd.md)"), _prepare)
    parser.add_argument("--model", default=None, type=cli_args.tunable_model,
                        help=f"architecture with random weights ({', '.join(sorted(models.ARCHITECTURES))}), a local "
                             "diffusers model folder, or a .safetensors checkpoint (its architecture's shapes; "
                             "default: sd15 on a GPU, tiny on a CPU)")
    parser.add_argument("--sizes", type=cli_args.image_sizes,
                        help="comma-separated WIDTHxHEIGHT image sizes in pixels, e.g. 1024x1024,832x1216 (default: "
                             "the model's square size)")
    parser.add_argument("--batch", type=cli_args.positive_int, default=1,
                        help="images per call (the UNet sees twice as many with CFG)")
    parser.add_argument("--dtype", choices=cli_args.DTYPES,
                        help="on a GPU; default: bfloat16 for the diffusion transformers (sd3, sd35*, flux*), else "
                             "float16")
    parser.add_argument("--vae-tiles", choices=("on", "off"),
                        help="the VAE decode in fixed-shape tiles, as optimize(vae_tiles=...) (default: on with ROCm's "
                             "torch, off elsewhere); 'off' prepares the untiled decode at each size")


def _generate(args) -> int:
    from .parallel import generate

    return generate.main(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m rocm_sd", description=__doc__)
    cli_args.add_debug_flag(parser)
    sub = parser.add_subparsers(dest="command", required=True)
    cli_args.command(sub.add_parser("info", help="platform, GPU, kernel library and why any op would fall back"),
                     _info)
    demo = cli_args.command(sub.add_parser("demo", help="generate one image with and without rocm_sd and compare"),
                            _demo)
    demo.add_argument("--out", default="rocm_sd_demo", type=cli_args.output_folder, help="folder for the two PNGs")
    demo.add_argument("--arch", choices=sorted(models.ARCHITECTURES), help="default: sd15 on a GPU, tiny on a CPU")
    demo.add_argument("--steps", type=cli_args.positive_int,
                      help="denoising steps (default: 20 on a GPU, 4 on a CPU)")
    demo.add_argument("--size", type=cli_args.image_size,
                      help="image height and width in pixels (default: the model's)")
    demo.add_argument("--repeats", type=cli_args.positive_int, default=3, help="timed calls per pipeline (the median)")
    bench_parser = cli_args.command(sub.add_parser(
        "bench", help="eager, torch.compile and rocm_sd side by side (docs/performance.md protocol)"), _bench)
    bench_parser.add_argument("--model", default=None, choices=sorted(models.ARCHITECTURES),
                              help="architecture, random weights (default: sd15 on a GPU, tiny on a CPU)")
    bench_parser.add_argument("--size", type=cli_args.image_size,
                              help="image height and width in pixels (default: the model's)")
    bench_parser.add_argument("--steps", type=cli_args.positive_int,
                              help="denoising steps (default: 50 for the UNet models, the model card's for the "
                                   "diffusion transformers: 28; 40 for sd35m; 4 for sd35-turbo and flux-schnell)")
    bench_parser.add_argument("--batch", type=cli_args.positive_int, default=1,
                              help="images per prompt (the UNet sees 2x with CFG)")
    bench_parser.add_argument("--repeats", type=cli_args.positive_int, default=3,
                              help="timed calls per engine (the median is reported)")
    bench_parser.add_argument("--warmup", type=cli_args.non_negative_int, default=2,
                              help="untimed calls after the first")
    bench_parser.add_argument("--engines", type=cli_args.subset_of(engines.ENGINES + tuple(engines.MODES), "engines"),
                              help=f"comma-separated, from: {', '.join(engines.ENGINES)} (default: all on a GPU, "
                                   f"eager,rocm_sd on a CPU), and the modes {', '.join(engines.MODES)} (compared "
                                   "with rocm_sd, run after it)")
    bench_parser.add_argument("--ablation", nargs="?", const=True, default=False,
                              type=cli_args.subset_of(FLAG_NAMES, "flags"),
                              help="one more rocm_sd row per optimize() flag toggled (FLAG,FLAG: those flags only)")
    bench_parser.add_argument("--profile", action="store_true", help="add a per-op device-time table per engine")
    bench_parser.add_argument("--out", default=None, type=cli_args.optional_output_folder,
                              help="results folder: the run is appended to <out>/data/<model>-<device>.jsonl ('' to "
                                   f"skip; default: {engines.results_folder()}, a folder of yours; the repository's "
                                   "results: --out bench/results)")
    _add_quality(sub)
    _add_prepare(sub)
    generate_arguments.add_arguments(cli_args.command(sub.add_parser(
        "generate", help="many prompts over one or more GPUs (launch with torchrun --nproc-per-node N)"),
        _generate))
    return parser


def main(argv: list[str] | None = None) -> int:
    return cli_args.main(build_parser(), argv)
