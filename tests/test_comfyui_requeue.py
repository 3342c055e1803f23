"""The ComfyUI node run while another clone of the same model is ComfyUI's loaded model (issue 46, item 0): ComfyUI
executes the node before its KSampler loads anything, so the model then holds the other clone's weights and object
patches (a LoRA'd MODEL, the previous run's optimized MODEL on a re-queue). The optimized MODEL must sample as its
input does, whatever was loaded when the node ran. In the stand-in: ComfyUI's weight patching and load_models_gpu's
sequencing (tests/standins/comfy/model_patcher.py, model_management.py)."""
from __future__ import annotations

import collections

import pytest
import torch

from tests.comfyui_standin import model_inputs, sample_once, standin_model

# The stand-in's channels_last convolutions differ from NCHW ones by rounding (fp32, CPU).
TOLERANCE = 1e-4


@pytest.fixture
def loader(comfy):
    import comfy.model_management as model_management

    model_management.unload_all_models()
    yield model_management
    model_management.unload_all_models()


def lora(patcher, strength: float = 1.0, scale: float = 0.5, seed: int = 7):
    """A clone of `patcher` with a LoRA-style weight patch ("diff") on every convolution and GroupNorm weight, the
    modules the node copies."""
    g = torch.Generator().manual_seed(seed)
    state = patcher.model.state_dict()
    keys = [k for k, m in patcher.model.named_modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.GroupNorm))]
    diffs = {f"{k}.weight": (torch.randn(state[f"{k}.weight"].shape, generator=g) * scale,) for k in keys}
    clone = patcher.clone()
    assert len(clone.add_patches(diffs, strength)) == len(keys) > 10
    return clone


def error(got, reference) -> float:
    return ((got - reference).abs().max() / reference.abs().max()).item()


def references(loader, *patchers):
    """Each patcher's output without the node, as ComfyUI samples it, everything unloaded after."""
    x, ctx = model_inputs()
    outs = [sample_once(p, x, ctx) for p in patchers]
    loader.unload_all_models()
    return outs


@pytest.mark.parametrize("scale", [0.5, 0.01], ids=["lora", "one-percent-patch"])
def test_a_loaded_lorad_clone_is_not_baked_into_the_optimized_model(comfy, nodes, loader, scale):
    base = standin_model(comfy)
    lorad = lora(base, scale=scale)
    x, ctx = model_inputs()
    reference, with_lora = references(loader, base, lorad)
    assert error(with_lora, reference) > 100 * TOLERANCE  # the patch matters
    sample_once(lorad, x, ctx)  # the LoRA'd MODEL is the loaded one when the node runs
    (optimized,) = nodes.RocmSDOptimizeModel().optimize(base, cuda_graph=False)
    assert error(sample_once(optimized, x, ctx), reference) < TOLERANCE
    assert error(sample_once(lorad, x, ctx), with_lora) < TOLERANCE  # and the LoRA'd one is itself again


def test_a_requeue_after_a_lora_strength_change_takes_the_new_strength(comfy, nodes, loader):
    base = standin_model(comfy)
    full, half = lora(base, 1.0), lora(base, 0.5)
    x, ctx = model_inputs()
    with_full, with_half = references(loader, full, half)
    (first,) = nodes.RocmSDOptimizeModel().optimize(full, cuda_graph=False)
    assert error(sample_once(first, x, ctx), with_full) < TOLERANCE
    (second,) = nodes.RocmSDOptimizeModel().optimize(half, cuda_graph=False)  # the re-queue: `first` is loaded
    assert error(sample_once(second, x, ctx), with_half) < TOLERANCE


def test_a_requeue_with_an_option_changed_and_the_lora_removed(comfy, nodes, loader):
    base = standin_model(comfy)
    lorad = lora(base)
    x, ctx = model_inputs()
    (reference,) = references(loader, base)
    (first,) = nodes.RocmSDOptimizeModel().optimize(lorad, cuda_graph=False)
    sample_once(first, x, ctx)
    (second,) = nodes.RocmSDOptimizeModel().optimize(base, layer_norm=False, cuda_graph=False)
    assert error(sample_once(second, x, ctx), reference) < TOLERANCE


def test_the_optimized_model_with_and_without_a_lora_applied_after_it(comfy, nodes, loader):
    """Optimize -> KSampler, plain model -> KSampler, Optimize -> LoRA -> KSampler: the third loads the node's copies
    again after the plain model (same weights: ComfyUI does not unpatch them) and must patch its LoRA into them."""
    base = standin_model(comfy)
    x, ctx = model_inputs()
    reference, with_lora = references(loader, base, lora(base))
    (optimized,) = nodes.RocmSDOptimizeModel().optimize(base, cuda_graph=False)
    optimized_lora = lora(optimized)
    assert error(sample_once(optimized, x, ctx), reference) < TOLERANCE
    assert error(sample_once(base, x, ctx), reference) < TOLERANCE
    assert error(sample_once(optimized_lora, x, ctx), with_lora) < TOLERANCE
    assert error(sample_once(optimized, x, ctx), reference) < TOLERANCE


def test_a_chained_node_with_another_optimized_clone_loaded_keeps_the_silus(comfy, nodes, loader):
    base = standin_model(comfy)
    x, ctx = model_inputs()
    (reference,) = references(loader, base)
    (once,) = nodes.RocmSDOptimizeModel().optimize(base, cuda_graph=False)  # nothing loaded: it fuses
    (other,) = nodes.RocmSDOptimizeModel().optimize(base, cuda_graph=False)
    sample_once(other, x, ctx)  # its fused GroupNorm+SiLU copies (and Identities) are in the model now
    (twice,) = nodes.RocmSDOptimizeModel().optimize(once, channels_last=False, cuda_graph=False)
    patches = twice.object_patches
    fused = [k for k, m in patches.items() if getattr(m, "rocm_sd_act", None) == "silu"]
    assert fused and all(isinstance(patches[k[:-1] + "1"], torch.nn.Identity) for k in fused)
    assert error(sample_once(twice, x, ctx), reference) < TOLERANCE


def test_copies_are_made_of_the_models_own_modules(comfy, nodes, loader):
    """Built while another optimized clone is loaded, the copies still face the model's own modules (their
    parameters, whatever ComfyUI installs there later) and never a copy."""
    from rocm_sd.modules.host_copies import unpatched

    base = standin_model(comfy)
    x, ctx = model_inputs()
    (other,) = nodes.RocmSDOptimizeModel().optimize(base, cuda_graph=False)
    sample_once(other, x, ctx)
    (optimized,) = nodes.RocmSDOptimizeModel().optimize(base, cuda_graph=False)
    loader.unload_all_models()
    own = dict(base.model.named_modules())
    kinds = collections.Counter()
    for path, module in optimized.object_patches.items():
        source = unpatched(module)
        assert source is own[path] and type(source).__name__.startswith(("GroupNorm", "LayerNorm", "Conv2d", "SiLU"))
        kinds[type(source).__name__] += 1
        if isinstance(module, torch.nn.Conv2d):
            assert module.weight is own[path].weight
            own[path].weight = torch.nn.Parameter(own[path].weight * 2, requires_grad=False)
            assert module.weight is own[path].weight  # the slot is the module's: read when the copy runs
    assert kinds["GroupNorm"] and kinds["Conv2d"], f"the stand-in's UNet gave too few copies to check: {kinds}"


def test_a_deep_copy_of_a_copy_keeps_its_own_settings():
    """The copies' own settings live in slots (their dictionary is their module's): copy.deepcopy keeps them."""
    import copy

    from rocm_sd.modules.host_copies import fused_away, group_norm_copy, unpatched

    plain = torch.nn.Sequential(torch.nn.GroupNorm(2, 4), torch.nn.SiLU())
    fused = torch.nn.Sequential(group_norm_copy(plain[0], "silu"), fused_away(plain[1]))
    twin = copy.deepcopy(fused)
    x = torch.randn(2, 4, 3, 3)
    assert twin[0].rocm_sd_act == "silu" and isinstance(unpatched(twin[1]), torch.nn.SiLU)
    assert unpatched(twin[0]) is not plain[0] and twin[0].weight is not plain[0].weight
    torch.testing.assert_close(twin(x), plain(x))
