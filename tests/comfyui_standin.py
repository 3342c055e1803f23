"""Shared by the ComfyUI node tests (their fixtures `comfy` and `nodes` are in conftest.py): the node package
loaded as ComfyUI loads it, a small random model of the stand-in of ComfyUI's interfaces (tests/standins;
ComfyUI is not on PyPI) behind a ModelPatcher, inputs, one evaluation."""
from __future__ import annotations

import importlib.util
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STANDINS = os.path.join(ROOT, "tests", "standins")


def load_node_package(name: str = "rocm_sd_comfyui_under_test"):
    """As ComfyUI's loader does: the folder imported as a package from its path."""
    folder = os.path.join(ROOT, "integrations", "comfyui")
    spec = importlib.util.spec_from_file_location(name, os.path.join(folder, "__init__.py"),
                                                  submodule_search_locations=[folder])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module, sys.modules[f"{name}.nodes"]


def standin_model(comfy, device="cpu", dtype=torch.float32, **kw):
    torch.manual_seed(0)
    base = comfy["model_base"].BaseModel(**kw).to(device, dtype).eval()
    for p in base.parameters():  # ComfyUI skips init (weights come from files): random, never zeros
        p.data.normal_(0, 0.2)
    return comfy["ModelPatcher"](base, load_device=torch.device(device))  # as ComfyUI: where it samples


def run_model(patcher, x, ctx):
    with torch.inference_mode():
        return patcher.model.apply_model(x, None, ctx, transformer_options=patcher.model_options["transformer_options"])


def model_inputs(device="cpu", dtype=torch.float32, seed=1):
    g = torch.Generator(device).manual_seed(seed)
    return (torch.randn(2, 4, 8, 8, device=device, dtype=dtype, generator=g),
            torch.randn(2, 5, 24, device=device, dtype=dtype, generator=g))


def run_patched_with_stats(patcher, x, ctx):
    """One evaluation with the patcher's patches in place: (output, rocm_sd.stats() of that evaluation)."""
    import rocm_sd

    patcher.patch_model()
    try:
        rocm_sd.reset_stats()
        out = run_model(patcher, x, ctx)
        return out, rocm_sd.stats()
    finally:
        patcher.unpatch_model()


def sample_once(patcher, x, ctx):
    """One evaluation as a KSampler runs it: ComfyUI loads the MODEL (load_models_gpu), and it stays loaded after."""
    import comfy.model_management

    comfy.model_management.load_models_gpu([patcher])
    return run_model(patcher, x, ctx)
