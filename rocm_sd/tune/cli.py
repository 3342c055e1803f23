"""`python -m rocm_sd.tune`: tune every rocm_sd op call of a model on this GPU, once; later runs use it.

    python -m rocm_sd.tune --model sd15 --height 512 --width 512 --batch 1
    python -m rocm_sd.tune --model /path/to/model --ops group_norm,geglu --budget-s 300 --resume
    python -m rocm_sd.tune --model ComfyUI/models/checkpoints/sd_xl_base_1.0.safetensors   # its shapes
    python -m rocm_sd.tune --model sdxl --precision fp8 --ops linear_8bit,conv_8bit  # which layers fp8 speeds up
    torchrun --nproc-per-node 8 -m rocm_sd.tune --model sdxl      # ranks with the same GPU share the work

1. Harvest: the optimized pipeline runs once (2 steps) under a recording dispatch mode: every distinct
   op call, with its shapes, strides and dtypes (without a GPU, --list and --dry-run run it on the meta
   device in the GPU's dtype: the same calls, in seconds; tune/on_meta.py). The vendor tuners run on the same pass: PyTorch
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

from .. import cli_args, models
from ..op_names import CONV_8BIT, LINEAR_8BIT, OPS
from ..patch.flags import option

# The parser reads light modules only: --help and argument errors import no torch. run.py tunes.


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m rocm_sd.tune", description=__doc__)
    cli_args.command(parser, _tune)  # its help formatter: the description as written, each option's default
    parser.add_argument("--model", default="sd15", type=cli_args.tunable_model,
                        help=f"architecture with random weights ({', '.join(sorted(models.ARCHITECTURES))}), a local "
                             "diffusers model folder, or a .safetensors checkpoint as ComfyUI and A1111 load them "
                             "(its architecture's shapes are tuned)")
    cli_args.add_height_and_width(parser)
    parser.add_argument("--batch", type=cli_args.positive_int, default=1,
                        help="images per call (the UNet sees twice as many with CFG)")
    parser.add_argument("--dtype", choices=cli_args.DTYPES,
                        help="default: bfloat16 for the diffusion transformers (sd3, sd35*, flux*), else float16")
    parser.add_argument("--precision", default="fp16", choices=option("precision").values,
                        help="run the model with optimize(precision=...) and also time each 8-bit layer against fp16 "
                             "(the linear_8bit problems)")
    parser.add_argument("--attention-precision", default="fp16", choices=option("attention_precision").values,
                        help="run the model with optimize(attention_precision=...): with fp8 each attention shape is "
                             "also an attention_fp8 problem, the FP8 kernel timed against the fp16 attention")
    parser.add_argument("--ops", type=cli_args.subset_of(OPS + (LINEAR_8BIT, CONV_8BIT), "ops"),
                        help=f"comma-separated subset of {', '.join(OPS)}, {LINEAR_8BIT} (with --precision), "
                             f"{CONV_8BIT} (with --precision fp8)")
    parser.add_argument("--budget-s", type=cli_args.positive_float,
                        help="start no new problem after this many seconds")
    parser.add_argument("--resume", action="store_true", help="skip problems the database already holds")
    parser.add_argument("--db", help="database folder or .json file (default: ROCM_SD_TUNE_DB or the cache folder)")
    parser.add_argument("--list", action="store_true",
                        help="list the harvested problems and stop (no GPU needed: the GPU's problems, from a run on "
                             "the meta device)")
    parser.add_argument("--dry-run", action="store_true", help="list problems and candidates, measure nothing")
    return parser


def main(argv=None) -> int:
    """`python -m rocm_sd.tune` with `argv`: its exit status (2: a bad argument, 1: a failure), in-process too."""
    return cli_args.main(build_parser(), argv)


def _tune(args) -> int:
    from .run import tune

    return tune(args)
