"""Checks the extension's Forge path on Forge's own Flux in a real Forge checkout, without its webui or any model file:

    python integrations/a1111/check_in_forge.py --forge /path/to/stable-diffusion-webui-forge [--device cpu|cuda]
                                                [--out DIR]

Imports the checkout's `backend` package only (Forge's webui, its `modules`, is not started: the extension's script
is not loaded, and rocm_sd.patch.comfy.patch_model_patcher is called with the arguments its Forge path,
RocmSdScript.process_before_every_sampling, passes, every checkbox on). The backend needs its own Python packages
(torch, einops, gguf, psutil, safetensors, and what its imports pull in: transformers, diffusers). Forge's
arguments are set as --always-cpu on the CPU, and --attention-pytorch.

A small random-weight Flux (IntegratedFluxTransformer2DModel, Forge's class) is made as backend/loader.py makes it:
built inside using_forge_operations, its state dict loaded through Forge's load_state_dict, behind a UnetPatcher
(KModel, PredictionFlux). Each evaluation goes the way Forge's sampler goes: memory_management.load_models_gpu (object
patches on, LoRA merged), then the patcher's model_function_wrapper (rocm_sd's graph wrapper: on the CPU it runs
eagerly) around KModel.apply_model, then unload_all_models (object patches off). Checked, against Forge's own
forward of the same weights:
- batch 1 (rope applied by rocm_sd::rms_norm) and batch 2 (Forge's apply_rope), and a model stored in fp8 with
  manual cast (Forge's --unet-in-fp8-e4m3fn path: its Linears cast per call);
- a LoRA (diff patches, offline and online) added to the patched clone after rocm_sd patched it;
- the model itself afterwards: its own modules back, its output bitwise the first one;
- the step cache (the extension's step cache setting: cache 'fbcache' / 'teacache', dit_cache_threshold) on sampling
  runs made by Forge's own sampling functions (sampling_prepare, sampling_function_inner per step: cond and uncond
  batched, the patcher's model_function_wrapper, CFG; sampling_cleanup) with an Euler step between, at CFG 3.5 and
  at CFG 1 (Forge drops the uncond call): threshold 0 computes every evaluation, each denoised result bitwise
  (CPU; GPU: within tolerance) the one rocm_sd computes without the cache and within tolerance of Forge's own; a
  threshold no change reaches caches every evaluation but each run's first, a second run (another seed) starting with
  a full one; Forge's own model afterwards computes what it did before, bitwise.
Fails unless each agrees (CPU fp32: max difference <= 1e-4 of the largest value; GPU fp16 / bf16: 2e-2 / 5e-2) and
rocm_sd's ops ran (on the GPU: its kernels). Prints the results; writes check.json to --out.
"""
import argparse
import json
import os
import sys

os.environ.setdefault("ROCM_SD_TUNE_DEFAULTS", "0")

BLOCKS = ["double_blocks.0", "double_blocks.1", "single_blocks.0", "single_blocks.1", "final_layer"]
CONFIG = dict(in_channels=4, vec_in_dim=8, context_in_dim=24, hidden_size=64, mlp_ratio=4.0, num_heads=2, depth=2,
              depth_single_blocks=2, axes_dim=[8, 12, 12], theta=10000, qkv_bias=True, guidance_embed=True)


def import_forge(root: str, device: str):
    sys.argv = [sys.argv[0], "--attention-pytorch"] + (["--always-cpu"] if device == "cpu" else [])
    sys.path.insert(0, os.path.abspath(root))
    from backend import memory_management
    from backend.modules.k_prediction import PredictionFlux
    from backend.nn import flux
    from backend.operations import using_forge_operations
    from backend.patcher.unet import UnetPatcher
    from backend.state_dict import load_state_dict

    return dict(memory_management=memory_management, PredictionFlux=PredictionFlux, flux=flux,
                using_forge_operations=using_forge_operations, UnetPatcher=UnetPatcher, load_state_dict=load_state_dict)


def forge_flux(forge, device, storage_dtype, computation_dtype):
    """A random-weight Flux, made and loaded as backend/loader.py makes and loads one."""
    import torch

    torch.manual_seed(0)
    shapes = forge["flux"].IntegratedFluxTransformer2DModel(**CONFIG).state_dict()  # plain torch: shapes only
    state = {k: (torch.randn(v.shape) * 0.2).to(storage_dtype) for k, v in shapes.items()}
    manual_cast = storage_dtype != computation_dtype
    with forge["using_forge_operations"](device=device, dtype=storage_dtype, manual_cast_enabled=manual_cast):
        model = forge["flux"].IntegratedFluxTransformer2DModel(**CONFIG).to(device=device, dtype=storage_dtype)
    forge["load_state_dict"](model, state)
    model.storage_dtype, model.computation_dtype = storage_dtype, computation_dtype
    model.load_device = model.offload_device = model.initial_device = torch.device(device)
    return forge["UnetPatcher"].from_model(model=model, diffusers_scheduler=None, k_predictor=flux_prediction(forge),
                                           config=None)


def flux_prediction(forge):
    """Forge's PredictionFlux (Flux schnell's mu). It tabulates its sigmas with diffusers' time_shift, which diffusers
    0.31 (Forge's pin) has as a plain formula and newer diffusers read from a scheduler's config; with a newer
    diffusers the 0.31 formula stands in while the table is made (the table only bounds the sampler's sigmas: one
    model evaluation does not read it)."""
    import math

    import inspect

    from backend.modules import k_prediction

    if "mu" not in inspect.signature(forge["PredictionFlux"]).parameters:  # Forge before 2025: a fixed shift
        return forge["PredictionFlux"]()
    try:
        return forge["PredictionFlux"](mu=1.0)
    except AttributeError:
        scheduler = k_prediction.FlowMatchEulerDiscreteScheduler

        class DiffusersPin:
            @staticmethod
            def time_shift(_self, mu, sigma, t):
                return math.exp(mu) / (math.exp(mu) + (1 / t - 1) ** sigma)
        k_prediction.FlowMatchEulerDiscreteScheduler = DiffusersPin
        try:
            return forge["PredictionFlux"](mu=1.0)
        finally:
            k_prediction.FlowMatchEulerDiscreteScheduler = scheduler


def sample(forge, patcher, device, dtype, batch):
    """One evaluation the way Forge's sampler runs one; the model unloaded after."""
    import torch

    g = torch.Generator().manual_seed(1)
    x = torch.randn(batch, CONFIG["in_channels"], 8, 8, generator=g).to(device)
    c = {"c_crossattn": torch.randn(batch, 5, 24, generator=g).to(device, dtype),
         "y": torch.randn(batch, 8, generator=g).to(device, dtype),
         "guidance": torch.full((batch,), 3.5, device=device),
         "transformer_options": patcher.model_options["transformer_options"]}
    sigma = torch.full((batch,), 0.6, device=device)
    forge["memory_management"].load_models_gpu([patcher])
    try:
        with torch.inference_mode():
            wrapper = patcher.model_options.get("model_function_wrapper")
            if wrapper is None:
                return patcher.model.apply_model(x, sigma, **c)
            return wrapper(patcher.model.apply_model,
                           {"input": x, "timestep": sigma, "c": c, "cond_or_uncond": [0] * batch})
    finally:
        forge["memory_management"].unload_all_models()


def rocm_sd_clone(patcher, cache=None, dit_cache_threshold=None):
    """What RocmSdScript.process_before_every_sampling does with Forge's UNet patcher (every checkbox on; the step
    cache setting as given)."""
    from rocm_sd.patch.comfy import patch_model_patcher

    clone = patcher.clone()
    notes = patch_model_patcher(clone, override_supported=False, cuda_graph=True, channels_last=True, group_norm=True,
                                layer_norm=True, attention=True, cache=cache, dit_cache_threshold=dit_cache_threshold)
    return clone, notes


SIGMAS = (1.0, 0.75, 0.5, 0.25, 0.0)   # four Euler steps
HUGE = 1e9                             # a step cache threshold no change reaches


def sampling_run(forge, patcher, device, dtype, cond_scale, seed=0):
    """One sampling run the way Forge's sampler makes it (backend/sampling/sampling_function.py: sampling_prepare, then
    per step sampling_function_inner, which batches cond and uncond as memory allows and calls the patcher's
    model_function_wrapper; sampling_cleanup), an Euler step between; the model unloaded after. Each step's denoised."""
    import torch

    from backend.sampling import sampling_function
    from backend.sampling.condition import Condition, ConditionCrossAttn

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, CONFIG["in_channels"], 8, 8, generator=g).to(device)

    def prompt():
        return [{"model_conds": {"c_crossattn": ConditionCrossAttn(torch.randn(1, 5, 24, generator=g).to(device, dtype)),
                                 "y": Condition(torch.randn(1, 8, generator=g).to(device, dtype)),
                                 "guidance": Condition(torch.full((1,), 3.5, device=device))}}]
    positive, negative = prompt(), prompt()
    sampling_function.sampling_prepare(patcher, x)
    denoised = []
    try:
        with torch.inference_mode():
            for sigma, following in zip(SIGMAS[:-1], SIGMAS[1:]):
                out = sampling_function.sampling_function_inner(patcher.model, x, torch.full((1,), sigma, device=device),
                                                                negative, positive, cond_scale, patcher.model_options,
                                                                seed)
                denoised.append(out)
                x = x + (following - sigma) * (x - out) / sigma
    finally:
        sampling_function.sampling_cleanup(patcher)
        forge["memory_management"].unload_all_models()
    return denoised


def check_step_cache(forge, device, dtype, tolerance, results, failures) -> None:
    """The step cache's cases (the module doc), appended to `results` / `failures`."""
    import torch

    from rocm_sd.patch.comfy_graph import graph_stats

    patcher = forge_flux(forge, device, dtype, dtype)
    originals = dict(patcher.model.named_modules())
    steps = len(SIGMAS) - 1

    def same(got, want) -> bool:
        if device == "cpu":
            return all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
        return max(relative_error(a, b) for a, b in zip(got, want, strict=True)) <= tolerance

    def report(name, ok, **extra):
        results.append({"case": name, "ok": ok, **extra})
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {extra}")
        if not ok:
            failures.append(name)

    first_reference = None
    for cond_scale in (3.5, 1.0):
        reference = sampling_run(forge, patcher, device, dtype, cond_scale)   # Forge's own
        first_reference = first_reference or reference
        fused = [sampling_run(forge, rocm_sd_clone(patcher)[0], device, dtype, cond_scale, seed) for seed in (0, 1)]
        for mode in ("fbcache", "teacache"):
            every, notes = rocm_sd_clone(patcher, mode, 0.0)
            got = sampling_run(forge, every, device, dtype, cond_scale)
            counts = {k: v for k, v in graph_stats(every).items() if k.startswith("step cache")}
            error = max(relative_error(a, b) for a, b in zip(got, reference))
            evaluations = counts.get("step cache: full calls", 0)
            report(f"step cache {mode}, threshold 0, CFG {cond_scale}",
                   not notes and same(got, fused[0]) and error <= tolerance and evaluations >= steps
                   and evaluations % steps == 0 and counts == {"step cache: full calls": evaluations},
                   relative_max_error_to_forge=error, counts=counts, notes=notes)

            skipping, notes = rocm_sd_clone(patcher, mode, HUGE)
            runs = [sampling_run(forge, skipping, device, dtype, cond_scale, seed) for seed in (0, 1)]
            counts = {k: v for k, v in graph_stats(skipping).items() if k.startswith("step cache")}
            per_step = evaluations // steps   # the evaluations of one step (one per batch of cond / uncond)
            report(f"step cache {mode}, threshold {HUGE:g}, CFG {cond_scale}, two runs",
                   not notes and counts == {"step cache: full calls": 2 * per_step,
                                            "step cache: cached calls": 2 * (steps - 1) * per_step}
                   and all(same(run[:1], want[:1]) for run, want in zip(runs, fused))
                   and all(torch.isfinite(out).all() for run in runs for out in run)
                   and not same(runs[0][1:], fused[0][1:]), counts=counts,
                   relative_change_from_uncached=max(relative_error(a, b) for a, b in zip(runs[0], fused[0])))
    again = sampling_run(forge, patcher, device, dtype, 3.5)
    report("step cache: Forge's own model afterwards", dict(patcher.model.named_modules()) == originals
           and all(torch.equal(a, b) for a, b in zip(again, first_reference, strict=True))
           and patcher.model_options.get("model_function_wrapper") is None)


def add_lora(patcher, lora: dict, online: bool) -> None:
    """The LoRA's diff patches on `patcher`, as Forge's LoRA extension adds them (Forge before 2024-08-19: the ComfyUI
    signature, merged only)."""
    import inspect

    if "filename" in inspect.signature(patcher.add_patches).parameters:
        patcher.add_patches(filename="check-lora", patches=lora, online_mode=online)
    else:
        assert not online
        patcher.add_patches(lora)


def online_lora(patcher) -> bool:
    import inspect

    return "online_mode" in inspect.signature(patcher.add_patches).parameters


def relative_error(got, reference) -> float:
    return (got.float() - reference.float()).abs().max().item() / reference.float().abs().max().item()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--forge", required=True, help="a stable-diffusion-webui-forge checkout (its backend/)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default=None,
                        help="computation dtype (default: float32 on the CPU, bfloat16 on the GPU)")
    parser.add_argument("--out", default=None, help="folder for check.json")
    args = parser.parse_args()
    forge = import_forge(args.forge, args.device)

    import torch

    import rocm_sd

    dtype = getattr(torch, args.dtype or ("float32" if args.device == "cpu" else "bfloat16"))
    tolerance = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 5e-2}[dtype]
    kernels = args.device == "cuda"
    results, failures = [], []

    def check(name, got, reference, stats, **extra):
        error = relative_error(got, reference)
        ran = {op: dict(stats.get(op, {})) for op in ("ada_layer_norm", "add_ada_layer_norm", "rms_norm")}
        ok = (error <= tolerance and all(ran.values())
              and (not kernels or all(set(v) == {"rocm_sd"} for v in ran.values())))
        results.append({"case": name, "relative max error": error, "ops": ran, "ok": ok, **extra})
        print(f"{'ok  ' if ok else 'FAIL'} {name}: relative max error {error:.2e}, ops {ran}")
        if not ok:
            failures.append(name)

    ropes = []  # Forge's apply_rope calls: none where rocm_sd::rms_norm applied the rope (one table: batch 1)
    apply_rope = forge["flux"].apply_rope

    def counted_apply_rope(xq, xk, freqs_cis):  # Forge's signature: the copies check it
        ropes.append(1)
        return apply_rope(xq, xk, freqs_cis)
    forge["flux"].apply_rope = counted_apply_rope

    def patched_run(patcher, batch, lora=None, online=False):
        clone, notes = rocm_sd_clone(patcher)
        wrong = sorted(clone.object_patches) != sorted(f"diffusion_model.{b}" for b in BLOCKS)
        if lora is not None:  # a LoRA added after rocm_sd patched the clone
            add_lora(clone, lora, online)
        rocm_sd.reset_stats()
        ropes.clear()
        got = sample(forge, clone, args.device, dtype, batch)
        if len(ropes) != (0 if batch == 1 else 4):
            failures.append(f"batch {batch}: {len(ropes)} calls of Forge's apply_rope")
        return got, rocm_sd.stats(), notes, wrong

    first = None
    for storage in (dtype, torch.float8_e4m3fn):
        patcher = forge_flux(forge, args.device, storage, dtype)
        originals = dict(patcher.model.named_modules())
        for batch in (1, 2) if storage == dtype else (1,):
            reference = sample(forge, patcher, args.device, dtype, batch)
            first = reference if batch == 1 else first
            got, stats, notes, wrong = patched_run(patcher, batch)
            name = f"batch {batch}, stored {str(storage).split('.')[-1]}"
            check(name, got, reference, stats, notes=notes)
            if wrong or notes:
                failures.append(f"{name}: object patches / notes")
            restored = dict(patcher.model.named_modules()) == originals
            again = sample(forge, patcher, args.device, dtype, batch)
            if not (restored and torch.equal(again, reference)):
                failures.append(f"{name}: not reverted exactly")
            print(f"{'ok  ' if restored and torch.equal(again, reference) else 'FAIL'} {name}: reverted exactly")
        if storage != dtype:
            continue
        state = patcher.model.state_dict()
        keys = [f"diffusion_model.{p}" for p in ("double_blocks.0.img_attn.qkv.weight",
                                                 "double_blocks.1.txt_mlp.0.weight", "single_blocks.0.linear2.weight",
                                                 "single_blocks.1.linear1.weight")]
        torch.manual_seed(3)
        lora = {k: ((torch.randn(state[k].shape) * 0.05).to(state[k]),) for k in keys}
        for online in (False, True) if online_lora(patcher) else (False,):
            with_lora = patcher.clone()
            add_lora(with_lora, lora, online)
            reference_lora = sample(forge, with_lora, args.device, dtype, 1)
            got, stats, _, _ = patched_run(patcher, 1, lora, online)
            name = f"LoRA added after patching ({'online' if online else 'merged'})"
            check(name, got, reference_lora, stats, lora_changes=relative_error(reference_lora, first))
            if relative_error(reference_lora, first) < 1e-2:
                failures.append(f"{name}: the LoRA does not change the model")
    check_step_cache(forge, args.device, dtype, tolerance, results, failures)
    summary = {"forge": os.path.abspath(args.forge), "device": args.device, "dtype": str(dtype),
               "results": results, "failures": failures}
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "check.json"), "w") as f:
            json.dump(summary, f, indent=1)
    print("PASS" if not failures else f"FAIL: {failures}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
