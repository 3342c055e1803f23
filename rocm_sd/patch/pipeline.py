"""optimize(pipe) / revert(pipe): apply rocm_sd to a diffusers pipeline, or to one model."""
from __future__ import annotations

import inspect
import logging

from torch import nn

from ..graphs import GraphPool
from ..modules.fusing import accelerate_hooked
from .core import RECORD_ATTR, PatchRecord
from .flags import FLAG_NAMES, FLAGS, OPTION_NAMES, OPTIONS, patcher

log = logging.getLogger("rocm_sd")

# Pipeline attributes that hold models rocm_sd knows how to patch, and the model classes it accepts.
COMPONENTS = ("unet", "transformer", "vae", "controlnet", "text_encoder", "text_encoder_2", "text_encoder_3")
DIFFUSION_MODELS = {"UNet2DConditionModel", "UNet2DModel", "AutoencoderKL", "ControlNetModel",
                    "SD3Transformer2DModel", "FluxTransformer2DModel"}
# transformers' CLIP encoders (SD1.x/2.x, both of SDXL's and SD3's) and T5's encoder (SD3, Flux): their norms and a
# graphed forward. Encoding a prompt is a few hundred small launches, host-bound like a UNet step, once per prompt.
TEXT_ENCODERS = {"CLIPTextModel", "CLIPTextModelWithProjection", "T5EncoderModel"}
KNOWN_MODELS = DIFFUSION_MODELS | TEXT_ENCODERS


def _models(target) -> dict[str, nn.Module]:
    if isinstance(target, nn.Module):
        return {type(target).__name__: target}
    found = {}
    for name in COMPONENTS:
        model = getattr(target, name, None)
        if isinstance(model, nn.Module):
            found[name] = model
    return found


OFFLOAD_FIRST = ("skipped: accelerate hooks on its modules (sequential CPU offload); call rocm_sd.optimize() "
                 "before enable_sequential_cpu_offload()")


def _untouched(target) -> dict[str, nn.Module]:
    """A pipeline's models that optimize() does not patch (safety checker, image encoder, ...)."""
    components = getattr(target, "components", None)
    if isinstance(target, nn.Module) or not isinstance(components, dict):
        return {}
    return {name: model for name, model in components.items()
            if isinstance(model, nn.Module) and name not in COMPONENTS}


def _flags_doc() -> str:
    flags = [f"      {flag.name}{'' if flag.default_text() == 'on' else ' (' + flag.default_text() + ' by default)'}: "
             f"{flag.doc}" for flag in FLAGS]
    options = [f"      {option.name}={option.default!r}: {option.doc}" for option in OPTIONS]
    return "\n".join(flags + ["", "    Options (the diffusion models they name; applied after the flags, before "
                                   "cuda_graph):"] + options)


def optimize(target, **keywords):
    """Make a diffusers pipeline (or one of its models) use rocm_sd kernels; returns `target`.

    Keyword flags, one per optimization, each True / False (FLAGS, in the order applied; a flag whose default
    depends on the precision also takes None, that default):
{flags}

    Ops fall back to PyTorch per call where a kernel cannot run (CPU tensors, unsupported dtype...);
    `rocm_sd.stats()` counts which backend ran. `report(target)` says what was replaced.
    Unknown components (a safety checker, an image encoder, a model class rocm_sd does not know) are
    left untouched and listed as such in the report.
    """
    unknown = sorted(set(keywords) - set(FLAG_NAMES) - set(OPTION_NAMES))
    if unknown:
        raise TypeError(f"optimize() got unknown keywords {', '.join(unknown)}; the flags are {', '.join(FLAG_NAMES)} "
                        f"and the options {', '.join(OPTION_NAMES)}")
    options = {option.name: option.check(keywords.get(option.name, option.default)) for option in OPTIONS}
    flags = {flag.name: flag.value(keywords, options) for flag in FLAGS}  # every flag, as applied
    models = _models(target)
    if not models:
        log.warning("rocm_sd.optimize: nothing to optimize in %s", type(target).__name__)
    pool = GraphPool()  # the models of one pipeline run one after another: one memory pool
    for name, model in models.items():
        existing = getattr(model, RECORD_ATTR, None)
        if existing is not None:
            _say_already_optimized(name, existing.flags, {**flags, **options})
            continue
        record = PatchRecord(flags={**flags, **options}, graph_pool=pool)
        text_encoder = type(model).__name__ in TEXT_ENCODERS
        if type(model).__name__ not in KNOWN_MODELS:
            record.counts["skipped: unknown model class " + type(model).__name__] += 1
        elif any(accelerate_hooked(m) for m in model.modules() if m is not model):
            # Sequential CPU offload already installed: accelerate's hooks wrap the modules' own forwards, which
            # the swapped modules would no longer reach (their weights stay on the meta device).
            record.counts[OFFLOAD_FIRST] += 1
            log.warning("rocm_sd.optimize: %s left untouched: %s", name, OFFLOAD_FIRST)
        elif text_encoder and not flags["text_encoder"]:
            record.counts["skipped: text_encoder=False"] += 1
        else:
            for flag in FLAGS:
                if flag.name == "cuda_graph":
                    for option in OPTIONS:
                        if option.patch is not None and type(model).__name__ in option.models:
                            patcher(option.patch)(model, record, options)
                if (flag.patch is not None and flags[flag.name] and (flag.needs is None or flags[flag.needs])
                        and (flag.text_encoders or not text_encoder)):
                    patcher(flag.patch)(model, record)
        setattr(model, RECORD_ATTR, record)
        _load_tuning(model)
    for name, model in _untouched(target).items():
        log.info("rocm_sd.optimize: %s (%s) left untouched", name, type(model).__name__)
    return target


optimize.__doc__ = optimize.__doc__.format(flags=_flags_doc())
optimize.__signature__ = inspect.Signature(
    [inspect.Parameter("target", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    + [inspect.Parameter(flag.name, inspect.Parameter.KEYWORD_ONLY,
                         default=None if flag.default_varies else flag.default,  # None: precision / platform decide
                         annotation=bool | None if flag.default_varies else bool) for flag in FLAGS]
    + [inspect.Parameter(option.name, inspect.Parameter.KEYWORD_ONLY, default=option.default,
                         annotation=option.number or object) for option in OPTIONS])


def _say_already_optimized(name: str, applied: dict, asked: dict) -> None:
    changed = {flag: value for flag, value in asked.items() if applied.get(flag) != value}
    if not changed:
        log.info("rocm_sd.optimize: %s is already optimized", name)
        return
    # Patches stack in one order (graphs capture what the others left): a flag cannot be taken out alone.
    log.warning("rocm_sd.optimize: %s is already optimized with %s; %s not applied. Call rocm_sd.revert() on it "
                "first, then optimize() with the new flags", name,
                ", ".join(f"{flag}={applied.get(flag)}" for flag in changed),
                ", ".join(f"{flag}={value}" for flag, value in changed.items()))


def _load_tuning(model) -> None:
    """Reads the model's GPU's tuning database now, before the first convolution: on ROCm that also points
    MIOpen at the tuner's find database, which MIOpen reads only when it starts (tune/vendor.py)."""
    device = next((p.device for p in model.parameters()), None)
    if device is not None and device.type == "cuda":
        from ..tune import active

        active.load(device)


def revert(target):
    """Undo optimize(): the original modules come back, so outputs equal the untouched model's bit for bit."""
    for model in _models(target).values():
        record = getattr(model, RECORD_ATTR, None)
        if record is not None:
            record.revert()
            delattr(model, RECORD_ATTR)
    return target


def report(target) -> dict[str, dict[str, int]]:
    """What optimize() replaced, per component, and how graphed calls ran so far:
    {'unet': {'group_norm+silu': 45, 'group_norm': 16, 'graphed: forward': 1,
              'forward: graph replays': 20, 'forward: graph captures': 1}, ...,
     'safety_checker': {'left untouched: StableDiffusionSafetyChecker': 1}}."""
    out = {}
    for name, model in _models(target).items():
        record = getattr(model, RECORD_ATTR, None)
        counts = dict(record.counts) if record is not None else {}
        for method, call in (record.graphed.items() if record is not None else ()):
            counts.update({f"{method}: {what}": n for what, n in call.stats.items()})
        out[name] = counts
    for name, model in _untouched(target).items():
        out[name] = {f"left untouched: {type(model).__name__}": 1}
    return out


def skipped_options(target, options: dict) -> list[str]:
    """Why `options` (optimize()'s, as given to it) left `target` as the default optimize() would: one
    '<component>: <why>' per model whose patcher skipped one, or per option no model of `target` takes; [] when all
    took effect."""
    models = _models(target)
    reasons = []
    for option in OPTIONS:
        if option.patch is None or options.get(option.name, option.default) == option.default:
            continue
        takers = {name: m for name, m in models.items() if type(m).__name__ in option.models}
        if not takers:
            reasons.append(f"{option.name}: no {' / '.join(sorted(option.models))} in {type(target).__name__}")
        for name, model in takers.items():
            record = getattr(model, RECORD_ATTR, None)
            why = record.skipped_options.get(option.name) if record is not None else "not optimized"
            if why:
                reasons.append(f"{name}: {why}")
    return reasons


def invalidate_graphs(target):
    """Drop the captured graphs of `target`'s models, the text keys and values kept (text_kv) and the step cache's
    cached features (the next call is a full one); the next calls capture and compute again."""
    for model in _models(target).values():
        record = getattr(model, RECORD_ATTR, None)
        if record is not None:
            record.invalidate()
    return target
