"""What `python -m rocm_sd bench` offers, readable without torch (its --help and argument checks list them): the
engines, the modes, and where runs are written unless a folder is named. bench.py runs them."""
from __future__ import annotations

from pathlib import Path

from .files import user_cache_dir

ENGINES = ("eager", "compile", "compile-reduce-overhead", "rocm_sd", "rocm_sd+compile", "onnxruntime")
# The engines that exist for the diffusion transformers (diffusers' compile recipe is the one compile engine there).
TRANSFORMER_ENGINES = ("eager", "compile", "rocm_sd", "rocm_sd+compile")
# Engines that change the images (a number format) or skip work (step caching): each compares against the rocm_sd
# row of the same run. Not in the default set: the default bench compares engines that make the same fp16 image.
MODES = {
    "rocm_sd-fp8": {"precision": "fp8"},
    "rocm_sd-int8": {"precision": "int8"},
    "rocm_sd-deepcache": {"cache": "deepcache", "cache_interval": 3, "cache_branch": 0},
    "rocm_sd-adaptive": {"cache": "adaptive"},
    "rocm_sd-fbcache": {"cache": "fbcache"},
    "rocm_sd-teacache": {"cache": "teacache"},
    "rocm_sd-fp8-fbcache": {"precision": "fp8", "cache": "fbcache"},
    "rocm_sd-fp8-teacache": {"precision": "fp8", "cache": "teacache"},
    "rocm_sd-attnfp8": {"attention_precision": "fp8"},
}


def results_folder() -> Path:
    """Where runs are appended unless the caller names a folder: the user's cache folder, not the current one (run
    inside a clone, a relative bench/results would add files the repository's tests reject as not rendered)."""
    return user_cache_dir() / "bench"
