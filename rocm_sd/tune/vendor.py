"""The vendors' own tuners, run on the tuner's harvest pass, and their results used by every later run.

On ROCm the harvest runs PyTorch TunableOp (rocBLAS / hipBLASLt solutions for each GEMM) and MIOpen's find
(convolution algorithms) on the model's real calls; their files sit beside rocm_sd's database
(`tunableop_<device>.csv`, `miopen/`). Later processes read them when they first look up a tuned choice
(active.py), unless the user configured TunableOp or MIOpen's database themselves. On CUDA, TunableOp has
no algorithm list to search (it only times cuBLAS's default: bench/results/notes/2026-11-22-tunableop-599964b-h200.md),
so only cuDNN's benchmark mode runs there, in the tuning process.
"""
from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from pathlib import Path

import torch

from .. import platform

log = logging.getLogger("rocm_sd")

_MIOPEN_ENV = "MIOPEN_USER_DB_PATH"
_miopen_set_here: str | None = None  # the value use_vendor_results gave MIOPEN_USER_DB_PATH (not the user's)


def tunableop_file(folder: Path, stem: str) -> Path:
    return Path(folder) / f"tunableop_{stem}.csv"


def miopen_folder(folder: Path) -> Path:
    return Path(folder) / "miopen"


def save_tunableop_results(tunable, path: Path) -> None:
    """Writes what TunableOp tuned so far to `path`, where later runs read it (set_filename / read_file).
    Older PyTorch has tunable.write_file(); newer PyTorch only writes at process exit while tuning is on,
    and the tuner turns tuning off after the harvest (so that nothing tunes inside a graph capture): there
    the file is written here, in TunableOp's own format (its validators, then one line per tuned GEMM)."""
    write = getattr(tunable, "write_file", None)
    if write is not None:
        write(str(path))
        return
    lines = [",".join(["Validator", *map(str, validator)]) for validator in tunable.get_validators()]
    lines += [",".join(map(str, row)) for row in tunable.get_results()]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, path)


@contextmanager
def vendor_tuning(folder, stem: str):
    """The vendors' own tuners on the harvest pass, their results kept beside rocm_sd's database."""
    notes = []
    tunable = getattr(torch.cuda, "tunable", None)
    if platform.torch_gpu_platform() == "hip" and tunable is not None:
        tunable.enable(True)
        tunable.tuning_enable(True)
        tunable.set_filename(str(tunableop_file(folder, stem)))
        notes.append(f"PyTorch TunableOp (GEMMs) -> {tunableop_file(folder, stem)}")
        # MIOpen reads its user database location when it starts: set before the first convolution (a value the
        # user set wins; one rocm_sd set for another database folder does not).
        if _MIOPEN_ENV not in os.environ or os.environ[_MIOPEN_ENV] == _miopen_set_here:
            os.environ[_MIOPEN_ENV] = str(miopen_folder(folder))
        notes.append(f"MIOpen find (convolutions) -> {os.environ[_MIOPEN_ENV]}")
    benchmark = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    if platform.torch_gpu_platform() == "cuda":
        notes.append("cuDNN benchmark mode (this process only: cuDNN keeps no file)")
    try:
        yield notes
    finally:
        torch.backends.cudnn.benchmark = benchmark
        if tunable is not None and platform.torch_gpu_platform() == "hip":
            save_tunableop_results(tunable, tunableop_file(folder, stem))
            tunable.tuning_enable(False)


def use_vendor_results(folder: Path, stem: str) -> list[str]:
    """On ROCm, has this process use what the tuner's vendor pass found for this device: TunableOp in use-only
    mode on its file, MIOpen's user database in its folder (read when MIOpen starts, i.e. at the first
    convolution). A user's own TunableOp or MIOpen settings (their environment variables) are left alone.
    Returns what was turned on, for the log."""
    if platform.torch_gpu_platform() != "hip":
        return []
    used = []
    tunable = getattr(torch.cuda, "tunable", None)
    results = tunableop_file(folder, stem)
    if tunable is not None and results.is_file() and "PYTORCH_TUNABLEOP_ENABLED" not in os.environ:
        tunable.enable(True)
        tunable.tuning_enable(False)  # use-only: never tune inside a user's run (or a graph capture)
        tunable.set_filename(str(results))
        tunable.read_file(str(results))
        used.append(f"PyTorch TunableOp results {results}")
    global _miopen_set_here
    miopen = miopen_folder(folder)
    if miopen.is_dir() and _MIOPEN_ENV not in os.environ:
        os.environ[_MIOPEN_ENV] = _miopen_set_here = str(miopen)
        used.append(f"MIOpen user database {miopen}")
    for what in used:
        log.info("rocm_sd: using %s", what)
    return used
