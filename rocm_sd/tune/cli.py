"""`python -m rocm_sd.tune`: tune every rocm_sd op call of a model on this GPU, once; later runs use it.

    python -m rocm_sd.tune --model sd15 --height 512 --width 512 --batch 1
    python -m rocm_sd.tune --model /path/to/model --ops group_norm,geglu --budget-s 300 --resume
    python -m rocm_sd.tune --model ComfyUI/models/checkpoints/sd_xl_base_1.0.safetensors   # its shapes
    python -m rocm_sd.tune --model sdxl --precision fp8 --ops linear_8bit,conv_8bit  # which layers fp8 speeds up
    torchrun --nproc-per-node 8 -m rocm_sd.tune --model sdxl      # ranks with the same GPU share the work

1. Harvest: the optimized pipeline runs once (2 steps) under a recording dispatch mode: every distinct
   op call, with its shapes, strides and dtypes. The vendor tuners run on the same pass: PyTorch
   TunableOp for the GEMMs and MIOpen find for the convolutions on ROCm (their files beside ours),
   cuDNN's benchmark mode on CUDA (which keeps nothing on disk).
2. Per problem, every candidate is checked against a float64 truth (a fast wrong kernel is never
   chosen), timed with device events on inputs cycling through more memory than the L2 cache, and the
   best is written to the database with its runners-up (saved every few seconds, and on Ctrl-C):
   killed halfway, --resume goes on.
3. A table: op, problem, the choice, its speed-up over PyTorch.

With --precision fp8 | int8 the pipeline runs with optimize(precision=...) and every layer made 8-bit is also a
`linear_8bit` problem: its 8-bit GEMM with its share of quantizing the input against the fp16 GEMM
(tune/linear_8bit.py), and with fp8 every FP8 convolution a `conv_8bit` problem (tune/conv_8bit.py);
optimize(precision=...) keeps fp16 where that measured faster. With --attention-precision fp8
every attention shape is also an `attention_fp8` problem (the FP8 attention kernel against the fp16 attention), which
optimize(attention_precision="fp8") follows.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch
from tqdm import tqdm

from .. import cli_args, models, patch, platform
from . import active, conv_8bit, linear_8bit, problems
from .db import TuningDB, default_location
from .device_key import device_key, validators
from .harvest import harvest
from ..parallel.mesh import shutdown
from ..patch.pipeline import skipped_options
from .measure import measure
from .vendor import vendor_tuning

HARVEST_STEPS = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m rocm_sd.tune", description=__doc__)
    cli_args.command(parser, tune)  # its help formatter: the description as written, each option's default
    parser.add_argument("--model", default="sd15", type=cli_args.tunable_model,
                        help=f"architecture with random weights ({', '.join(sorted(models.ARCHITECTURES))}), a local "
                             "diffusers model folder, or a .safetensors checkpoint as ComfyUI and A1111 load them "
                             "(its architecture's shapes are tuned)")
    parser.add_argument("--height", type=cli_args.image_size)
    parser.add_argument("--width", type=cli_args.image_size)
    parser.add_argument("--batch", type=cli_args.positive_int, default=1,
                        help="images per call (the UNet sees twice as many with CFG)")
    parser.add_argument("--dtype", choices=("float16", "bfloat16", "float32"),
                        help="default: bfloat16 for the diffusion transformers (sd3, sd35*, flux*), else float16")
    parser.add_argument("--precision", default="fp16", choices=("fp16", "fp8", "int8"),
                        help="run the model with optimize(precision=...) and also time each 8-bit layer against fp16 "
                             "(the linear_8bit problems)")
    parser.add_argument("--attention-precision", default="fp16", choices=("fp16", "fp8"),
                        help="run the model with optimize(attention_precision=...): with fp8 each attention shape is "
                             "also an attention_fp8 problem, the FP8 kernel timed against the fp16 attention")
    parser.add_argument("--ops", type=cli_args.subset_of(tuple(problems.OPS) + (linear_8bit.OP, conv_8bit.OP), "ops"),
                        help=f"comma-separated subset of {', '.join(problems.OPS)}, {linear_8bit.OP} (with "
                             f"--precision), {conv_8bit.OP} (with --precision fp8)")
    parser.add_argument("--budget-s", type=cli_args.positive_float,
                        help="start no new problem after this many seconds")
    parser.add_argument("--resume", action="store_true", help="skip problems the database already holds")
    parser.add_argument("--db", help="database folder or .json file (default: ROCM_SD_TUNE_DB or the cache folder)")
    parser.add_argument("--list", action="store_true", help="list the harvested problems and stop")
    parser.add_argument("--dry-run", action="store_true", help="list problems and candidates, measure nothing")
    return parser


def _rank_share(items: list, device) -> list:
    """Under torchrun, ranks with the same device key split the problems; others tune their own files."""
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return items
    from ..parallel.mesh import init
    from ..parallel.rounds import all_gather

    mesh = init("data")
    keys = all_gather(mesh, "device keys", device_key(mesh.device))
    same = [r for r, k in enumerate(keys) if k == keys[mesh.rank]]
    return items[same.index(mesh.rank)::len(same)]


def main(argv=None) -> int:
    """`python -m rocm_sd.tune` with `argv`: its exit status (2: a bad argument, 1: a failure), in-process too."""
    return cli_args.main(build_parser(), argv)


def tune(args) -> int:
    args.model = cli_args.checkpoint_architecture(args.model, "tuning")
    measuring = not (args.list or args.dry_run)
    on_gpu = platform.gpu_available()
    if measuring and not on_gpu:
        raise cli_args.UsageError("tuning measures on a GPU and torch sees none; --list and --dry-run work without one")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)
    gpu_dtype = getattr(torch, args.dtype) if args.dtype else models.gpu_dtype(args.model)
    dtype = gpu_dtype if on_gpu else torch.float32
    wanted = set(args.ops or (*problems.OPS, linear_8bit.OP, conv_8bit.OP))
    if args.ops and linear_8bit.OP in wanted and args.precision == "fp16":
        raise cli_args.UsageError(f"argument --ops: {linear_8bit.OP} needs --precision fp8 or int8")
    if args.ops and conv_8bit.OP in wanted and args.precision != "fp8":
        raise cli_args.UsageError(f"argument --ops: {conv_8bit.OP} needs --precision fp8")

    key = device_key(device if on_gpu else None)
    db = TuningDB(key, validators(device if on_gpu else None),
                  location=default_location() if args.db is None else Path(args.db))
    start = time.monotonic()
    # attention=True: the attention calls go through rocm_sd::attention, so the tuner sees and measures them
    # precision_layers="all": every 8-bit layer runs 8-bit and is recorded as such, whatever the database says now
    pipe = patch.optimize(models.load_pipeline(args.model, device, dtype), attention=True, precision=args.precision,
                          precision_layers="all", attention_precision=args.attention_precision)
    skipped = skipped_options(pipe, {"precision": args.precision})
    for why in skipped_options(pipe, {"attention_precision": args.attention_precision}):
        print(f"--attention-precision {args.attention_precision}: {why}; no attention_fp8 problems listed")
    if skipped and measuring:
        raise cli_args.UsageError(f"argument --precision: {'; '.join(skipped)}")
    for why in skipped:
        print(f"--precision {args.precision}: {why}; no {linear_8bit.OP} problems listed")
    conditioning = models.conditioning(pipe, ["a photograph of a lighthouse at dawn"] * args.batch)
    folder = db.path.parent
    with vendor_tuning(folder, key.file_stem) if measuring else nullcontext([]) as notes, \
            linear_8bit.recording(models.denoiser(pipe)) as layer_calls, \
            conv_8bit.recording(models.denoiser(pipe)) as conv_calls:
        calls = harvest(lambda: pipe(**conditioning, height=args.height, width=args.width,
                                     num_inference_steps=HARVEST_STEPS, output_type="np"))
    del pipe
    if on_gpu:
        torch.cuda.empty_cache()

    by_key: dict[str, tuple] = {}
    for call, count in calls.items():
        if call.op in wanted:
            k = problems.key_of(call)
            first, total = by_key.get(k, (call, 0))
            by_key[k] = (first, total + count // HARVEST_STEPS or 1)
    layer_calls = {**layer_calls, **conv_calls}
    if linear_8bit.OP in wanted or conv_8bit.OP in wanted:
        for layer_call, count in layer_calls.items():
            if (linear_8bit.OP if isinstance(layer_call, linear_8bit.Linear8bitCall) else conv_8bit.OP) not in wanted:
                continue
            first, total = by_key.get(layer_call.key, (layer_call, 0))
            by_key[layer_call.key] = (first, total + count // HARVEST_STEPS or 1)
    print(f"{len(by_key)} problems from {sum(calls.values()) + sum(layer_calls.values())} op calls ({args.model}, "
          f"{HARVEST_STEPS} steps); database {db.path}" + ("" if measuring else " (not written by --list / --dry-run)"))
    if not on_gpu:
        gpu = str(gpu_dtype).removeprefix("torch.")
        print(f"  on a CPU: the model ran in float32 on the CPU (--dtype {gpu} is the GPU's), so these are not "
              "the problems a GPU tunes (dtypes, the GPU-only paths and 8-bit layers differ); list on the GPU")
    for note in db.notes + (notes or []):
        print(f"  {note}")
    if not measuring:
        for k, (call, count) in by_key.items():
            line = f"  {k}  x{count}"
            if args.dry_run:
                names = (call.candidates if isinstance(call, (linear_8bit.Linear8bitCall, conv_8bit.Conv8bitCall))
                         else problems.OPS[call.op].candidates(*call.args))
                line += "  candidates: " + ", ".join(names)
            print(line)
        return 0

    todo = [(k, call, count) for k, (call, count) in by_key.items() if not (args.resume and k in db.results)]
    if len(todo) < len(by_key):
        print(f"  --resume: {len(by_key) - len(todo)} problems already tuned")
    todo = _rank_share(todo, device)
    l2_bytes = torch.cuda.get_device_properties(device).L2_cache_size
    done, stopped = [], 0
    layer_parts: dict = {}  # linear_8bit: each layer shape timed once, whatever its sharers
    with db.batched():  # saved every few seconds and at the end, Ctrl-C included
        for i, (k, call, count) in enumerate(tqdm(todo, unit="problem", disable=None)):
            if args.budget_s is not None and time.monotonic() - start > args.budget_s:
                stopped = len(todo) - i
                break
            if isinstance(call, linear_8bit.Linear8bitCall):
                db.record(k, linear_8bit.measure(call, device, l2_bytes, count, layer_parts))
                done.append(k)
                continue
            if isinstance(call, conv_8bit.Conv8bitCall):
                db.record(k, conv_8bit.measure(call, device, l2_bytes, count))
                done.append(k)
                continue
            outcome = measure(call, device, l2_bytes)
            if outcome.choice is None:
                print(f"  {k}: no candidate passed: {outcome.rejected}", file=sys.stderr)
                continue
            db.record(k, outcome.as_result(count))
            done.append(k)
    active.reload()
    shutdown()  # leaves the torchrun job cleanly when _rank_share joined one; nothing otherwise
    _print_table(db, done)
    if stopped:
        print(f"budget reached: {stopped} problems left; run again with --resume to go on")
    return 0


def _print_table(db: TuningDB, keys: list[str]) -> None:
    print("\n| op | dtype | layout | shape | choice | ms | torch ms | speed-up vs torch |\n"
          "|---|---|---|---|---|---:|---:|---:|")
    for k in keys:
        r = db.results[k]
        op, dtype, layout, shape = k.split("|", 3)
        torch_ms = f"{r['torch_ms']:.4f}" if r.get("torch_ms") is not None else "-"
        speedup = f"{r['speedup_vs_torch']:.2f}x" if r.get("speedup_vs_torch") is not None else "-"
        print(f"| {op} | {dtype} | {layout} | {shape} | {r['choice']} | {r['ms']:.4f} | {torch_ms} | {speedup} |")
