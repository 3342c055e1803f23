"""`python -m rocm_sd {info,demo,bench,quality,generate,prepare}`."""
from __future__ import annotations

import argparse
import importlib.metadata

import torch

from . import _ext, cli_args, models, platform
from .version import __version__
from .ops import REGISTRY


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _sample_call_reasons(device: torch.device) -> dict[str, list[str] | None]:
    """Why each op's kernel could not run its first sample call (OpSpec.samples) on `device`: [] where it can;
    None for the ops hosting CK fusions, which have no kernel of their own (their default path is composed)."""
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    return {name: spec.supports(*spec.samples(device, dtype)[0]) if spec.kernel is not None else None
            for name, spec in REGISTRY.items()}


def _tuning_summary(device: torch.device) -> str:
    from .tune import TuningDB, device_key, validators

    if device.type != "cuda":
        return "not used on a CPU"
    db = TuningDB(device_key(device), validators(device))
    state = f"{len(db.results)} tuned problems" if db.results else "none yet (python -m rocm_sd.tune)"
    if db.defaults:
        state += f", under {len(db.defaults)} shipped defaults for this device"
    return f"{db.path}: {state}" + "".join(f"; {note}" for note in db.notes)


def info() -> int:
    mismatch = platform.torch_mismatch()
    rows = [("rocm_sd", __version__), ("torch", f"{torch.__version__} ({platform.runtime_version()})"
                                                + (f"; WARNING: {mismatch}" if mismatch else "")),
            ("diffusers", _version("diffusers")), ("transformers", _version("transformers"))]
    if platform.gpu_available():
        for i in range(torch.cuda.device_count()):
            arch = platform.device_arch(i)
            props = torch.cuda.get_device_properties(i)
            rows.append((f"GPU {i}", f"{props.name}, {arch}, {props.multi_processor_count} CUs/SMs"))
    else:
        rows.append(("GPU", "none visible to torch"))
    device = torch.device("cuda") if platform.gpu_available() else torch.device("cpu")
    _ext.unavailable_reason(device)  # settles where kernels come from (_C or the JIT) on a GPU
    build = _ext.built_info()
    if build:
        rows.append(("_C", f"loaded, built for {build['platform']} targets {build['targets']} "
                           f"(runtime {build['runtime_version']}, kernel sources {build.get('source_hash', 'unknown')})"))
        counts = {name: len(spec.ck_instances()) for name, spec in REGISTRY.items() if spec.ck_instances is not None}
        rows.append(("CK instances", ", ".join(f"{n} {name}" for name, n in counts.items()) if any(counts.values())
                     else "none (built on ROCm when Composable Kernel headers are found)"))
    else:
        rows.append(("_C", _ext.LOAD_ERROR))
    rows.append(("kernels from", _kernel_source()))
    source = {"_C": "_C", "JIT": "JIT, compiled at first use"}.get(_ext.source(), "")
    for op, reasons in _sample_call_reasons(device).items():
        if reasons is None:
            state = "vendor GEMM / convolution, then its rocm_sd epilogue op (a CK instance where tuned faster)"
        else:
            state = f"rocm_sd kernel ({source})" if not reasons else "PyTorch fallback: " + "; ".join(reasons)
        rows.append((f"op {op}", state))
    rows.extend(_untuned_attention(device))
    rows.append(("ops registered", ", ".join(f"rocm_sd::{name}" for name in REGISTRY)))
    rows.append(("precision='fp8'", _eight_bit(device, "fp8")))
    rows.append(("precision='int8'", _eight_bit(device, "int8")))
    rows.append(("tuning database", _tuning_summary(device)))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    return 0


# Head dims of the models rocm_sd runs: SD1.5 / SD2 (40, 80, 160, 64), SDXL and the transformers (64, 128), the VAE's
# mid-block (512), and 256, the largest AOTriton's fused kernels take on some GPUs.
ATTENTION_HEAD_DIMS = (40, 64, 80, 128, 160, 256, 512)


def _untuned_attention(device: torch.device) -> list[tuple[str, str]]:
    """Per head dim, the path an untuned, unmasked fp16 attention call takes on this GPU, and why."""
    if device.type != "cuda":
        return [("untuned attention", "not applicable on a CPU (SDPA's CPU kernels run every call)")]
    from .ops.attention import untuned_path

    return [(f"attention d={dim} fp16", untuned_path(device, dim)) for dim in ATTENTION_HEAD_DIMS]


def _kernel_source() -> str:
    """Where the ops' kernels come from, and for the JIT its compiler, cache folder and what it compiled so far."""
    from . import config

    setting = f"ROCM_SD_KERNELS={config.current.kernels}"
    if _ext.source() == "_C":
        return f"_C ({setting})"
    if _ext.source() == "none":
        return f"none ({setting})"
    jit = _ext._C
    entries = len(list(jit.cache.folder.glob("*.bin"))) if jit.cache.folder.is_dir() else 0
    compiled = ", ".join(f"{unit} {arch} {seconds:.1f} s{' (cached)' if cached else ''}"
                         for (unit, arch), (seconds, cached) in jit.compiles.items())
    return (f"runtime-compiled (JIT) with {jit.compiler().label} ({setting}); cache {jit.cache.folder} ({entries} "
            f"entries)" + (f"; this run: {compiled}" if compiled else ""))


def _eight_bit(device: torch.device, precision: str) -> str:
    """The format optimize(precision=...) would use here, or why it would keep the model's dtype."""
    from .patch.precision import number_format

    fmt, why = number_format(device, precision)
    return f"{fmt} GEMMs" if fmt else f"not available: {why}"


def _bench(args) -> int:
    from . import bench
    from .quality import cache_mode_problem

    on_gpu = platform.gpu_available()
    model = args.model or ("sd15" if on_gpu else "tiny")
    all_engines = bench.TRANSFORMER_ENGINES if models.is_transformer(model) else bench.ENGINES
    engines = args.engines or (all_engines if on_gpu else ("eager", "rocm_sd"))
    for engine in engines:
        why = cache_mode_problem(bench.MODES.get(engine, {}).get("cache"), model)
        if why:
            raise cli_args.UsageError(f"argument --engines: {engine}: {why}")
    bench.run(model=model, size=args.size, steps=args.steps, batch=args.batch,
              repeats=args.repeats, warmup=args.warmup, engines=engines, ablation=args.ablation, out_dir=args.out,
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
    from .patch.pipeline import OPTIONS
    from .quality import PROMPTS

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
    from . import prepare

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
    parser.add_argument("--dtype", choices=("float16", "bfloat16", "float32"),
                        help="on a GPU; default: bfloat16 for the diffusion transformers (sd3, sd35*, flux*), else "
                             "float16")
    parser.add_argument("--vae-tiles", choices=("on", "off"),
                        help="the VAE decode in fixed-shape tiles, as optimize(vae_tiles=...) (default: on with ROCm's "
                             "torch, off elsewhere); 'off' prepares the untiled decode at each size")


def build_parser() -> argparse.ArgumentParser:
    from .patch.pipeline import FLAG_NAMES

    from . import bench
    from .parallel import generate

    parser = argparse.ArgumentParser(prog="python -m rocm_sd", description=__doc__)
    cli_args.add_debug_flag(parser)
    sub = parser.add_subparsers(dest="command", required=True)
    cli_args.command(sub.add_parser("info", help="platform, GPU, kernel library and why any op would fall back"),
                     lambda args: info())
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
    bench_parser.add_argument("--engines", type=cli_args.subset_of(bench.ENGINES + tuple(bench.MODES), "engines"),
                              help=f"comma-separated, from: {', '.join(bench.ENGINES)} (default: all on a GPU, "
                                   f"eager,rocm_sd on a CPU), and the modes {', '.join(bench.MODES)} (compared "
                                   "with rocm_sd, run after it)")
    bench_parser.add_argument("--ablation", nargs="?", const=True, default=False,
                              type=cli_args.subset_of(FLAG_NAMES, "flags"),
                              help="one more rocm_sd row per optimize() flag toggled (FLAG,FLAG: those flags only)")
    bench_parser.add_argument("--profile", action="store_true", help="add a per-op device-time table per engine")
    bench_parser.add_argument("--out", default=None, type=cli_args.optional_output_folder,
                              help="results folder: the run is appended to <out>/data/<model>-<device>.jsonl ('' to "
                                   f"skip; default: {bench.results_folder()}, a folder of yours; the repository's "
                                   "results: --out bench/results)")
    _add_quality(sub)
    _add_prepare(sub)
    generate.add_arguments(cli_args.command(sub.add_parser(
        "generate", help="many prompts over one or more GPUs (launch with torchrun --nproc-per-node N)"),
        generate.main))
    return parser


def main(argv: list[str] | None = None) -> int:
    return cli_args.main(build_parser(), argv)
