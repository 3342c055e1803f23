"""What `python -m rocm_sd` and `python -m rocm_sd.tune` share: argument types that reject a bad value while
parsing, before any model is built, and the way a command ends when something goes wrong.

A bad argument is a usage error: argparse's usage, then one line naming the argument, the value and what is
accepted (`python -m rocm_sd bench: error: argument --steps: -3 is not a positive integer`), exit status 2.
A failure while running is one line and exit status 1; --debug lets its traceback through instead.
"""
from __future__ import annotations

import argparse
import copy
import math
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from . import checkpoints, models

USAGE_ERROR, FAILURE, INTERRUPTED = 2, 1, 130
DTYPES = ("float16", "bfloat16", "float32")  # --dtype's choices: torch's names (getattr(torch, name))


class UsageError(ValueError):
    """A bad argument that only the command can see (a combination of arguments, the number of processes):
    raised before anything is built, reported as argparse reports a bad value."""


# ---- argument types: each returns the value or raises ArgumentTypeError with what is accepted ----------

def _int_from(text: str, minimum: int, accepted: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise argparse.ArgumentTypeError(f"{text} is not {accepted}")
    return value


def positive_int(text: str) -> int:
    return _int_from(text, 1, "a positive integer")


def non_negative_int(text: str) -> int:
    return _int_from(text, 0, "a non-negative integer")


# diffusers' Stable Diffusion pipelines refuse other sizes (check_inputs): the VAE makes one latent of 8x8 pixels.
# The UNet needs no more: it resizes its upsampled features to the skip connections when the latents do not halve
# evenly (e.g. 520 pixels, 65 latents).
SIZE_MULTIPLE = 8


def image_size(text: str) -> int:
    """Image height or width in pixels."""
    accepted = (f"a positive multiple of {SIZE_MULTIPLE} (Stable Diffusion's VAE makes one latent per "
                f"{SIZE_MULTIPLE}x{SIZE_MULTIPLE} pixels; diffusers' pipelines take multiples of {SIZE_MULTIPLE} only)")
    value = _int_from(text, 1, accepted)
    if value % SIZE_MULTIPLE:
        raise argparse.ArgumentTypeError(f"{text} is not {accepted}")
    return value


def add_height_and_width(parser: argparse.ArgumentParser) -> None:
    """--height / --width for commands that run a pipeline at one size."""
    for side in ("height", "width"):
        parser.add_argument(f"--{side}", type=image_size, default=None,
                            help=f"image {side} in pixels, a multiple of {SIZE_MULTIPLE} (default: the model's own: "
                                 "512 for sd15, 768 for sd21, 1024 for sdxl, sd3, sd35* and flux*)")


def image_sizes(text: str) -> list[tuple[int, int]]:
    """Comma-separated WIDTHxHEIGHT image sizes in pixels (width first, as ComfyUI and A1111 give them)."""
    sizes = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        width, sep, height = item.lower().partition("x")
        if not sep:
            raise argparse.ArgumentTypeError(f"{item} is not WIDTHxHEIGHT (e.g. 1024x1024,832x1216)")
        try:
            sizes.append((image_size(width.strip()), image_size(height.strip())))
        except argparse.ArgumentTypeError as error:
            raise argparse.ArgumentTypeError(f"{item}: {error}") from None
    if not sizes:
        raise argparse.ArgumentTypeError("no sizes given; accepted: WIDTHxHEIGHT, comma-separated")
    return list(dict.fromkeys(sizes))


def finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):  # float() takes "nan" and "inf": a NaN guidance makes NaN images
        raise argparse.ArgumentTypeError(f"{text} is not a finite number")
    return value


def positive_float(text: str) -> float:
    value = finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value


def non_negative_float(text: str) -> float:
    value = finite_float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is not a non-negative number")
    return value


def torch_device(text: str) -> str:
    """'cpu', 'cuda' or 'cuda:N' (ROCm's torch calls its GPUs cuda too), one this process can use."""
    import torch

    try:
        device = torch.device(text)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"{text} is not a device; accepted: cpu, cuda or cuda:N")
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if not count:
            raise argparse.ArgumentTypeError(f"{text}: no GPU is visible to this torch ({torch.__version__})")
        if device.index is not None and device.index >= count:
            raise argparse.ArgumentTypeError(f"{text}: this torch sees {count} GPU{'s' * (count != 1)} "
                                             f"(cuda:0{f' to cuda:{count - 1}' if count > 1 else ''})")
    return text


def text_lines(path: str) -> list[str]:
    """A UTF-8 text file's non-blank lines, stripped: one item (a prompt) per line."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise argparse.ArgumentTypeError(f"{path} does not exist") from None
    except IsADirectoryError:
        raise argparse.ArgumentTypeError(f"{path} is a folder, not a text file") from None
    except UnicodeDecodeError as error:
        raise argparse.ArgumentTypeError(f"{path} is not UTF-8 text (byte {error.start} cannot be decoded)") from None
    except OSError as error:
        raise argparse.ArgumentTypeError(f"cannot read {path}: {error.strerror}") from None
    if "\0" in text:
        raise argparse.ArgumentTypeError(f"{path} is a binary file, not text (it holds NUL bytes)")
    lines = [line.strip() for line in text.split("\n") if line.strip()]
    if not lines:
        raise argparse.ArgumentTypeError(f"{path} holds no text, one item per line (blank lines are skipped)")
    return lines


def output_folder(path: str) -> str:
    """A folder this process can write in, existing or not. Nothing is created but a temporary file in the deepest
    folder that exists: writing one shows that the folder can be made and written where os.access can be wrong
    (root on sysfs or an NFS export with root_squash, SELinux)."""
    if not path:
        raise argparse.ArgumentTypeError("an empty path is not a folder")
    deepest = Path(path)
    try:
        while not deepest.exists():
            deepest = deepest.parent
    except OSError as error:
        raise argparse.ArgumentTypeError(f"cannot look at {path}: {error.strerror}") from None
    if not deepest.is_dir():
        where = "" if str(deepest) == os.path.normpath(path) else f"{path}: "
        raise argparse.ArgumentTypeError(f"{where}{deepest} is a file, not a folder")
    try:
        with tempfile.TemporaryFile(dir=deepest):
            pass
    except OSError as error:
        raise argparse.ArgumentTypeError(f"cannot write in {deepest}: {error.strerror}") from None
    return path


def optional_output_folder(path: str) -> str:
    """output_folder, or '' for none."""
    return path and output_folder(path)


def pipeline_model(model: str) -> str:
    """What builds a pipeline: an architecture name (random weights) or a local diffusers model folder."""
    problem = models.model_problem(model)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return model


def tunable_model(model: str) -> str:
    """pipeline_model, or a single-file checkpoint whose architecture's shapes are tuned."""
    problem = models.model_problem(model, checkpoint_files=True)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return model


def checkpoint_architecture(model: str, doing: str) -> str:
    """`model`, or for a single-file checkpoint the architecture its header names (random weights of its shapes do
    what `doing` needs: the weights' values change no problem); a UsageError where it names none rocm_sd knows."""
    if not checkpoints.is_checkpoint_file(model):
        return model
    try:
        arch = checkpoints.architecture_of(model)
    except ValueError as error:  # its header names no architecture rocm_sd knows: read before anything is built
        raise UsageError(f"argument --model: {error}") from None
    print(f"{model}: {arch} architecture; {doing} its shapes with random weights (the weights' values do not "
          "change which kernel is fastest)")
    return arch


def subset_of(choices, what: str) -> Callable[[str], tuple[str, ...]]:
    """A comma-separated list of some of `choices` (`what` names them in the message: 'ops', 'engines'); empty for
    none given, which the commands read as their default."""
    def parse(text: str) -> tuple[str, ...]:
        wanted = tuple(filter(None, (item.strip() for item in text.split(","))))
        unknown = sorted(set(wanted) - set(choices))
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {what} {unknown}; choose from {', '.join(choices)}")
        return wanted

    parse.__name__ = what  # argparse names the type in some messages
    return parse


# ---- how a command runs and ends ---------------------------------------------------------------------

def add_debug_flag(parser: argparse.ArgumentParser) -> None:
    # SUPPRESS: no default, so that `python -m rocm_sd --debug bench` is not undone by the bench parser's default.
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="let a failure's Python traceback through (by default it is one line)")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """argparse's help (the description as written) with each option's default: "(default: X)" after the help of
    an option whose default is a value (not None, not a flag's False, not "") and whose help does not say it."""

    def add_argument(self, action: argparse.Action) -> None:
        no_default = action.default is None or action.default is False or action.default in ("", argparse.SUPPRESS)
        if (action.option_strings and not no_default and action.help is not argparse.SUPPRESS
                and "default" not in (action.help or "")):
            action = copy.copy(action)
            action.help = f"{action.help} (default: %(default)s)" if action.help else "default: %(default)s"
        super().add_argument(action)


def command(parser: argparse.ArgumentParser, run: Callable[[argparse.Namespace], int]) -> argparse.ArgumentParser:
    """`parser` runs `run(args)`, and reports bad arguments found by it in its own name; its --help gives each
    option's default."""
    parser.set_defaults(run=run, command_parser=parser)
    parser.formatter_class = HelpFormatter
    add_debug_flag(parser)
    return parser


def main(parser: argparse.ArgumentParser, argv: list[str] | None) -> int:
    """Parse `argv` and run the command it names; its exit status, never an exception for what a user can get
    wrong. In-process callers (ComfyUI's tune node, tests) get the status as `python -m` would exit with it."""
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:  # argparse has printed the help (0) or a usage error (2)
        return stop.code
    command_parser, debug = args.command_parser, getattr(args, "debug", False)
    try:
        return args.run(args)
    except UsageError as error:
        command_parser.print_usage(sys.stderr)
        print(f"{command_parser.prog}: error: {error}", file=sys.stderr)
        return USAGE_ERROR
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"{command_parser.prog}: interrupted", file=sys.stderr)
        return INTERRUPTED
    except Exception as error:  # noqa: BLE001 - any failure: one line, the traceback under --debug
        if debug:
            raise
        print(f"{command_parser.prog}: error: {type(error).__name__}: {error} (--debug shows the traceback)",
              file=sys.stderr)
        return FAILURE
