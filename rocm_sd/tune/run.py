"""The tuning run behind `python -m rocm_sd.tune` (cli.py: its arguments and what it does): harvest the model's op
calls, measure every problem's candidates, write the database."""
from __future__ import annotations

import os
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch
from tqdm import tqdm

from .. import cli_args, config, models, patch, platform
from . import active, conv_8bit, linear_8bit, problems
from .db import TuningDB, default_location
from .device_keys import device_key, validators
from .harvest import harvest
from ..parallel.mesh import shutdown
from ..patch.pipeline import skipped_options
from .measure import measure
from .on_meta import ShapeOnlyScheduler, gpu_conv_layouts
from .vendor import vendor_tuning

HARVEST_STEPS = 2


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


def tune(args) -> int:
    args.model = cli_args.checkpoint_architecture(args.model, "tuning")
    measuring = not (args.list or args.dry_run)
    on_gpu = platform.gpu_available()
    if measuring and not on_gpu:
        raise cli_args.UsageError("tuning measures on a GPU and torch sees none; --list and --dry-run work without one")
    # Without a GPU (--list, --dry-run) the pipeline runs on the meta device in the GPU's dtype: the calls a GPU run
    # makes, in seconds, with no memory (on_meta.py)
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if on_gpu else torch.device("meta")
    if on_gpu:
        torch.cuda.set_device(device)
    dtype = getattr(torch, args.dtype) if args.dtype else models.gpu_dtype(args.model)
    wanted = set(args.ops or (*problems.OPS, linear_8bit.OP, conv_8bit.OP))
    if args.ops and linear_8bit.OP in wanted and args.precision == "fp16":
        raise cli_args.UsageError(f"argument --ops: {linear_8bit.OP} needs --precision fp8 or int8")
    if args.ops and conv_8bit.OP in wanted and args.precision != "fp8":
        raise cli_args.UsageError(f"argument --ops: {conv_8bit.OP} needs --precision fp8")

    if on_gpu:
        key = device_key(device)
        db = TuningDB(key, validators(device), location=default_location() if args.db is None else Path(args.db))
    # A meta run traces the calls a GPU run makes: no kernel runs on meta, so strict mode (ROCM_SD_STRICT=1, which
    # fails a GPU call that falls back) does not apply to it
    with nullcontext() if on_gpu else config.override(strict=False):
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
        if not on_gpu:
            pipe.scheduler = ShapeOnlyScheduler(pipe.scheduler)
        with vendor_tuning(db.path.parent, key.file_stem) if measuring else nullcontext([]) as notes, \
                linear_8bit.recording(models.denoiser(pipe)) as layer_calls, \
                conv_8bit.recording(models.denoiser(pipe)) as conv_calls, \
                nullcontext() if on_gpu else gpu_conv_layouts():
            calls = harvest(lambda: pipe(**conditioning, height=args.height, width=args.width,
                                         num_inference_steps=HARVEST_STEPS, output_type="np" if on_gpu else "pt"))
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
    where = (f"; database {db.path}" + ("" if measuring else " (not written by --list / --dry-run)") if on_gpu
             else f", {str(dtype).removeprefix('torch.')} on the meta device: no GPU here")
    print(f"{len(by_key)} problems from {sum(calls.values()) + sum(layer_calls.values())} op calls ({args.model}, "
          f"{HARVEST_STEPS} steps{where})")
    for note in (db.notes if on_gpu else _meta_notes()) + (notes or []):
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


def _meta_notes() -> list[str]:
    """What a listing without a GPU cannot know of the GPU that will tune."""
    if platform.torch_gpu_platform() == "hip":
        return []
    return ["with ROCm's torch, vae_tiles is on by default and the VAE decode's problems are those of its tiles "
            "(listed with this torch's default: off)"]


def _print_table(db: TuningDB, keys: list[str]) -> None:
    print("\n| op | dtype | layout | shape | choice | ms | torch ms | speed-up vs torch |\n"
          "|---|---|---|---|---|---:|---:|---:|")
    for k in keys:
        r = db.results[k]
        op, dtype, layout, shape = k.split("|", 3)
        torch_ms = f"{r['torch_ms']:.4f}" if r.get("torch_ms") is not None else "-"
        speedup = f"{r['speedup_vs_torch']:.2f}x" if r.get("speedup_vs_torch") is not None else "-"
        print(f"| {op} | {dtype} | {layout} | {shape} | {r['choice']} | {r['ms']:.4f} | {torch_ms} | {speedup} |")
