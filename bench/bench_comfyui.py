"""The rocm_sd ComfyUI nodes inside a real ComfyUI checkout, at full model size: wall ms per model call.

    python bench/bench_comfyui.py /path/to/ComfyUI [--model sd15|sdxl] [--out-dir bench/results] [--sizes 512,1024]

ComfyUI's own SD1.5 or SDXL UNet (its model_detection config) and SD VAE, random weights, loaded through its
ModelPatcher and model management as a workflow would. Rows: a 20-step KSampler run at the model's native
size (SD1.5 512x512, SDXL 1024x1024; euler, CFG 7.5: one CFG batch of 2 per step) through `comfy.sample.sample`, as the KSampler node calls it, in ms per
step (sampler included: what a ComfyUI user waits for per step), and one VAE decode through
`comfy.sd.VAE.decode` (which loads the VAE itself, every call), each for the untouched model and for the
output of "rocm_sd Optimize Model" (with and without its graph capture) / "rocm_sd Optimize VAE". Median of
synchronized calls after warm-up (KSampler: the median of 6 alternating rounds of 2 runs per model;
`--ablation` adds one row per node option alone); relative difference of the outputs (the final latents,
the decoded images) against the untouched model's. The "kernel ms"
column is the summed time of one call's GPU kernels (torch.profiler): where it is far below the wall
time, the call is host-bound. `--profile DIR` also writes each row's per-op table there.

    python bench/bench_comfyui.py /path/to/ComfyUI --model sd35|flux [--precision fp8]

ComfyUI's own SD3.5 Large MMDiT or FLUX.1-dev (bf16, random weights drawn on the GPU), 1024x1024, a 28-step KSampler
run (SD3.5: CFG 4.5; Flux: CFG 1, guidance 3.5) untouched and through the node: fused, without graph capture, with
each step cache at its published threshold, and with each --precision. The median of two timed runs after a warm-up (a
step of these models is 50-190 ms: a run is seconds).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

# ComfyUI's SD1.5 UNet, as comfy/model_detection.py detects it from a checkpoint.
SD15_UNET = {"use_checkpoint": False, "image_size": 32, "out_channels": 4, "use_spatial_transformer": True,
             "legacy": False, "adm_in_channels": None, "in_channels": 4, "model_channels": 320,
             "num_res_blocks": [2, 2, 2, 2], "transformer_depth": [1, 1, 1, 1, 1, 1, 0, 0],
             "channel_mult": [1, 2, 4, 4], "transformer_depth_middle": 1, "use_linear_in_transformer": False,
             "context_dim": 768, "num_heads": 8, "transformer_depth_output": [1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0],
             "use_temporal_attention": False, "use_temporal_resblock": False}
# ComfyUI's SDXL base UNet (comfy/model_detection.py).
SDXL_UNET = {"use_checkpoint": False, "image_size": 32, "out_channels": 4, "use_spatial_transformer": True,
             "legacy": False, "num_classes": "sequential", "adm_in_channels": 2816, "in_channels": 4,
             "model_channels": 320, "num_res_blocks": [2, 2, 2], "transformer_depth": [0, 0, 2, 2, 10, 10],
             "channel_mult": [1, 2, 4], "transformer_depth_middle": 10, "use_linear_in_transformer": True,
             "context_dim": 2048, "num_head_channels": 64, "transformer_depth_output": [0, 0, 0, 2, 2, 2, 10, 10, 10],
             "use_temporal_attention": False, "use_temporal_resblock": False}
# --model: (ComfyUI's model class, its UNet config, latent side at the model's native size, text context
# width, pooled text embedding width or None)
MODELS = {"sd15": ("SD15", SD15_UNET, 64, 768, None), "sdxl": ("SDXL", SDXL_UNET, 128, 2048, 1280)}
# ComfyUI's SD3.5 Large MMDiT and FLUX.1-dev, as comfy/model_detection.py detects them from a checkpoint.
SD35_LARGE_MMDIT = {"in_channels": 16, "out_channels": 16, "patch_size": 2, "depth": 38, "input_size": None,
                    "adm_in_channels": 2048, "pos_embed_scaling_factor": None, "num_patches": 36864,
                    "pos_embed_max_size": 192, "qk_norm": "rms", "x_block_self_attn_layers": [],
                    "context_embedder_config": {"target": "torch.nn.Linear",
                                                "params": {"in_features": 4096, "out_features": 2432}}}
FLUX_DEV = {"image_model": "flux", "in_channels": 16, "out_channels": 16, "patch_size": 2, "vec_in_dim": 768,
            "context_in_dim": 4096, "hidden_size": 3072, "mlp_ratio": 4.0, "num_heads": 24, "depth": 19,
            "depth_single_blocks": 38, "axes_dim": [16, 56, 56], "theta": 10000, "qkv_bias": True,
            "guidance_embed": True}
# --model for the diffusion transformers: (ComfyUI's model class, its config, latent side at 1024x1024, text tokens
# (ComfyUI's own SD3 conditioning: 77 CLIP + 77 T5 tokens; Flux: 256 T5 tokens), their width, pooled width,
# KSampler's CFG and steps (the model cards': SD3.5 Large 28 at CFG 4.5, one CFG batch of 2 a step; FLUX.1-dev 28 at CFG 1 with its
# distilled guidance 3.5)
TRANSFORMERS = {"sd35": ("SD3", SD35_LARGE_MMDIT, 128, 154, 4096, 2048, 4.5, 28),
                "flux": ("Flux", FLUX_DEV, 128, 256, 4096, 768, 1.0, 28)}
SD_VAE = {"double_z": True, "z_channels": 4, "resolution": 256, "in_channels": 3, "out_ch": 3, "ch": 128,
          "ch_mult": [1, 2, 4, 4], "num_res_blocks": 2, "attn_resolutions": [], "dropout": 0.0}


def check_script():
    path = os.path.join(HERE, "..", "integrations", "comfyui", "check_in_comfyui.py")
    spec = importlib.util.spec_from_file_location("check_in_comfyui", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def random_weights(torch, named_tensors, in_place: bool = False) -> dict:
    """Weights that keep activations O(1) through the network (fan-in scaled; norm scales around 1), so fp16
    runs stay finite: ComfyUI builds its models uninitialised, and plain N(0, 0.05) overflows at full size.
    in_place: drawn into the tensors themselves (no second copy of a 12 B parameter model); returns them."""
    generators, out = {}, {}
    for name, t in named_tensors:  # drawn where the tensor lives (SDXL's 2.6 B weights: on the GPU)
        g = generators.setdefault(t.device, torch.Generator(t.device).manual_seed(0))
        target = t if in_place else torch.empty(t.shape, device=t.device)
        target.normal_(generator=g)
        if t.dim() > 1:
            target.mul_(t[0].numel() ** -0.5)
        else:
            norm_weight = "norm" in name and name.endswith(("weight", "scale"))  # Flux's RMSNorms: `scale`
            target.mul_(0.02).add_(1.0 if norm_weight else 0.0)
        out[name] = target
    return out


ROUNDS = 6  # alternating timing rounds of the KSampler rows


def kernel_ms(torch, fn, table_path: str | None = None) -> float:
    """Summed device time of one call's kernels; with table_path, its per-op table (by device time) written there."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    averages = prof.key_averages()
    if table_path:
        import cProfile
        import io
        import pstats

        host = cProfile.Profile()
        host.runcall(fn)
        torch.cuda.synchronize()
        text = io.StringIO()
        pstats.Stats(host, stream=text).sort_stats("tottime").print_stats(25)
        with open(table_path, "w") as f:
            f.write(averages.table(sort_by="self_device_time_total", row_limit=30))
            f.write("\n\n# host: Python functions of one call by own time (cProfile)\n" + text.getvalue())
    kernels = [e for e in averages if e.device_type == torch.autograd.DeviceType.CUDA]  # not their CPU-side ops too
    return sum(e.self_device_time_total for e in kernels) / 1e3


def relative_difference(out, reference) -> float:
    """|out - reference| / |reference| (Frobenius), in float32: how far a variant's output is from the untouched one."""
    return ((out.float() - reference.float()).norm() / reference.float().norm()).item()


def measure(torch, fn, repeats: int, warmup: int, profile_path: str | None):
    from bench.harness import wall_ms

    wall, out = wall_ms(fn, repeats, warmup)
    return wall, kernel_ms(torch, fn, profile_path), out


STEPS = 20  # one KSampler run: euler, CFG 7.5, the "normal" schedule
LATENT = None  # the latent side; None: the model's native size (SD1.5 64: 512x512 pixels; SDXL 128)


def bench_unet(torch, comfy, nodes, device, profile_dir, ablation: bool, model_name: str = "sd15",
               precisions: tuple[str, ...] = ()):
    import comfy.sample

    from rocm_sd.patch.comfy_graph import graph_stats

    class_name, unet_config, latent_side, context_width, pooled_width = MODELS[model_name]
    config = getattr(comfy.supported_models, class_name)(dict(unet_config))
    config.set_inference_dtype(torch.float16, None)
    model = config.get_model({}, device=device)
    state = random_weights(torch, model.diffusion_model.state_dict().items())
    model.diffusion_model.load_state_dict(state)
    patcher = comfy.model_patcher.ModelPatcher(model, load_device=device, offload_device=torch.device("cpu"))
    g = torch.Generator().manual_seed(1)
    side = LATENT or latent_side
    noise, latent = torch.randn(1, 4, side, side, generator=g), torch.zeros(1, 4, side, side)

    def conditioning():  # as CLIPTextEncode makes it: the text context, and SDXL's pooled embedding
        extra = {} if pooled_width is None else {"pooled_output": torch.randn(1, pooled_width, generator=g),
                                                 "width": side * 8, "height": side * 8}
        return [[torch.randn(1, 77, context_width, generator=g), extra]]

    positive, negative = conditioning(), conditioning()

    def ksampler(p):  # what the KSampler node calls; it loads the model itself (a no-op while it stays loaded)
        with torch.inference_mode():
            return comfy.sample.sample(p, noise, STEPS, 7.5, "euler", "normal", positive, negative, latent, seed=0,
                                       disable_pbar=True)

    # The host time of this machine drifts by 10-20% over minutes, so the models are timed in alternating rounds
    # (A/B/A/B...). Loading another clone of the same model unloads the previous one (ComfyUI detaches it, and the
    # node's graphs are dropped with it): each round's first run loads the model and captures, untimed.
    from bench.harness import wall_ms

    node = nodes["RocmSDOptimizeModel"]()
    variants = {"ComfyUI": patcher, "rocm_sd Optimize Model": node.optimize(patcher)[0],
                "rocm_sd Optimize Model, cuda_graph off": node.optimize(patcher, cuda_graph=False)[0],
                "rocm_sd Optimize Model, channels_last off": node.optimize(patcher, channels_last=False)[0]}
    for precision in precisions:  # the node's 8-bit linears (docs/precision.md#in-comfyui): a row per format
        variants[f"rocm_sd Optimize Model, precision {precision}"] = node.optimize(patcher, precision=precision)[0]
    if ablation:  # one option of the node at a time: which part costs or saves what; none: the clone alone
        options = ("attention", "group_norm", "layer_norm", "cuda_graph", "channels_last")
        for option in options + (None,):
            flags = {o: o == option for o in options}
            variants[f"rocm_sd Optimize Model, {option or 'no option'} only"] = node.optimize(patcher, **flags)[0]
    samples = {name: [] for name in variants}
    for _ in range(ROUNDS):
        for name, p in variants.items():
            wall, _ = wall_ms(lambda: ksampler(p), 2, warmup=1)
            samples[name].append(wall / STEPS)
    what = f"{model_name.upper()} KSampler step (euler, CFG 7.5, {side}x{side} latent), ms per step of {STEPS}"
    rows, reference = [], None
    for i, (name, p) in enumerate(variants.items()):
        ksampler(p)  # loaded, and captured where it graphs
        table = os.path.join(profile_dir, f"profile-unet-{i}.txt") if profile_dir else None
        kernels, out = kernel_ms(torch, lambda: ksampler(p), table) / STEPS, ksampler(p)
        reference = out if reference is None else reference
        rel = None if i == 0 else relative_difference(out, reference)
        rows.append((what, name, statistics.median(samples[name]), kernels, rel, samples[name]))
        graphs = graph_stats(p)
        print(f"KSampler ms per step per round, {name}: " + ", ".join(f"{w:.2f}" for w in samples[name])
              + (f"; graphs {dict(graphs)}" if graphs else ""))
    return rows


# The transformers' node rows: fused with graph capture, without it, and each step cache at its published threshold.
NODE_ROWS = ("fused", "eager", "fbcache", "teacache")


def bench_transformer(torch, comfy, nodes, device, profile_dir, model_name: str, precisions: tuple[str, ...] = (),
                      latent_side: int | None = None, node_rows: tuple[str, ...] = NODE_ROWS):
    """KSampler on ComfyUI's own SD3.5 Large or FLUX.1-dev (bf16, random weights drawn on the GPU in place: 8-12 B
    parameters), untouched and through the node: fused, and with each step cache and 8-bit precision asked."""
    import comfy.sample

    class_name, config, side, tokens, context_width, pooled_width, cfg, steps = TRANSFORMERS[model_name]
    side = latent_side or side
    model_config = getattr(comfy.supported_models, class_name)(dict(config))
    model_config.set_inference_dtype(torch.bfloat16, None)
    model = model_config.get_model({}, device=device)
    with torch.no_grad():  # buffers too: SD3's position embedding is torch.empty
        random_weights(torch, [(n, t) for n, t in [*model.named_parameters(), *model.named_buffers()]
                               if t.is_floating_point()], in_place=True)
    patcher = comfy.model_patcher.ModelPatcher(model, load_device=device, offload_device=torch.device("cpu"))
    g = torch.Generator().manual_seed(1)
    noise, latent = torch.randn(1, 16, side, side, generator=g), torch.zeros(1, 16, side, side)

    def conditioning():  # as ComfyUI's text encoders hand it on: the token context, the pooled embedding
        extra = {"pooled_output": torch.randn(1, pooled_width, generator=g)}
        if class_name == "Flux":
            extra["guidance"] = 3.5
        return [[torch.randn(1, tokens, context_width, generator=g), extra]]

    positive, negative = conditioning(), conditioning()

    def ksampler(p):
        with torch.inference_mode():
            return comfy.sample.sample(p, noise, steps, cfg, "euler", "simple", positive, negative, latent, seed=0,
                                       disable_pbar=True)

    from bench.harness import wall_ms

    node = nodes["RocmSDOptimizeModel"]()
    variants = {"ComfyUI": patcher}
    if "fused" in node_rows:
        variants["rocm_sd Optimize Model"] = node.optimize(patcher)[0]
    if "eager" in node_rows:
        variants["rocm_sd Optimize Model, cuda_graph off"] = node.optimize(patcher, cuda_graph=False)[0]
    for cache in ("fbcache", "teacache"):  # the published thresholds (dit_cache_threshold -1)
        if cache in node_rows:
            variants[f"rocm_sd Optimize Model, cache {cache}"] = node.optimize(patcher, cache=cache)[0]
    for precision in precisions:
        variants[f"rocm_sd Optimize Model, precision {precision}"] = node.optimize(patcher, precision=precision)[0]
    what = (f"{model_name} KSampler step (euler, CFG {cfg}, {side}x{side} latent), ms per step of {steps}")
    rows, reference = [], None
    for i, (name, p) in enumerate(variants.items()):
        wall, out = wall_ms(lambda: ksampler(p), 2, warmup=1)  # the first run loads the model, captures
        table = os.path.join(profile_dir, f"profile-{model_name}-{i}.txt") if profile_dir else None
        kernels = kernel_ms(torch, lambda: ksampler(p), table) / steps
        reference = out if reference is None else reference
        rel = None if i == 0 else relative_difference(out, reference)
        rows.append((what, name, wall / steps, kernels, rel, None))
        print(f"{name}: {wall / steps:.2f} ms per step, kernels {kernels:.2f} ms per step, relative difference "
              f"{'-' if rel is None else f'{rel:.2e}'}", flush=True)
        comfy.model_management.unload_all_models()  # one 24 GB model on the GPU at a time
    return rows


def bench_vae(torch, comfy, nodes, sizes, profile_dir):
    from comfy.ldm.models.autoencoder import AutoencoderKL

    template = AutoencoderKL(ddconfig=SD_VAE, embed_dim=4)
    vae = comfy.sd.VAE(sd=random_weights(torch, template.state_dict().items()))
    (optimized,) = nodes["RocmSDOptimizeVAE"]().optimize(vae)
    (nchw,) = nodes["RocmSDOptimizeVAE"]().optimize(vae, channels_last=False)
    rows = []
    for size in sizes:
        z = torch.randn(1, 4, size // 8, size // 8, generator=torch.Generator().manual_seed(2))
        path = (lambda name: os.path.join(profile_dir, f"profile-vae{size}-{name}.txt")) if profile_dir else (lambda name: None)
        with torch.inference_mode():  # as ComfyUI runs nodes (under autograd the patched modules take its own path)
            base_ms, base_kernel, reference = measure(torch, lambda: vae.decode(z), 10, 2, path("comfyui"))
            opt_ms, opt_kernel, got = measure(torch, lambda: optimized.decode(z), 10, 2, path("rocm_sd"))
            nchw_ms, nchw_kernel, nchw_got = measure(torch, lambda: nchw.decode(z), 10, 2, None)
        rel, nchw_rel = (relative_difference(out, reference) for out in (got, nchw_got))
        what = f"SD VAE decode {size}x{size} ({vae.vae_dtype})"
        rows += [(what, "ComfyUI", base_ms, base_kernel, None, None), (what, "rocm_sd Optimize VAE", opt_ms, opt_kernel, rel, None),
                 (what, "rocm_sd Optimize VAE, channels_last off", nchw_ms, nchw_kernel, nchw_rel, None)]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("comfyui", help="a ComfyUI checkout (its requirements installed)")
    parser.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    parser.add_argument("--sizes", default="512,1024", help="VAE decode sizes in pixels")
    parser.add_argument("--profile", metavar="DIR", help="write each row's per-op profiler table into DIR")
    parser.add_argument("--ablation", action="store_true", help="UNet rows with one node option on at a time")
    parser.add_argument("--model", choices=sorted(MODELS) + sorted(TRANSFORMERS), default="sd15",
                        help="the UNet architecture, or a diffusion transformer (SD3.5 Large, FLUX.1-dev: KSampler "
                             "rows only, no VAE rows)")
    parser.add_argument("--latent", type=int, help="the transformers' latent side (default 128: 1024x1024; a small "
                                                   "one checks the path on a CPU)")
    parser.add_argument("--precision", action="append", choices=("fp8", "int8"), default=[],
                        help="also a row with the node's precision option (repeatable)")
    parser.add_argument("--node-rows", default=",".join(NODE_ROWS),
                        help="the transformers' node rows beside ComfyUI's (comma-separated, of "
                             f"{', '.join(NODE_ROWS)}; default all): each row is a model load and four 28-step runs")
    args = parser.parse_args()
    node_rows = tuple(row for row in args.node_rows.split(",") if row)
    if not set(node_rows) <= set(NODE_ROWS):
        parser.error(f"--node-rows: {', '.join(sorted(set(node_rows) - set(NODE_ROWS)))} not among "
                     f"{', '.join(NODE_ROWS)}")
    check = check_script()
    argv = list(sys.argv)
    comfy = check.import_comfyui(args.comfyui)  # it sets sys.argv to ComfyUI's own command line
    sys.argv = argv  # the results record this command
    import torch

    from bench.harness import write_results

    device = comfy.model_management.get_torch_device()
    nodes = check.load_nodes()
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.model in TRANSFORMERS:
        rows = bench_transformer(torch, comfy, nodes, device, args.profile, args.model, tuple(args.precision),
                                 args.latent, node_rows)
    else:
        rows = (bench_unet(torch, comfy, nodes, device, args.profile, args.ablation, args.model,
                           tuple(args.precision)) + bench_vae(torch, comfy, nodes, sizes, args.profile))
    lines = ["| call | model | wall ms | kernel ms | vs ComfyUI | relative difference |", "|---|---|---:|---:|---:|---:|"]
    results = []
    for what, engine, ms, kernel, rel, rounds in rows:
        base = next(row[2] for row in rows if row[0] == what)  # the untouched model's row of the same call
        results.append({"call": what, "engine": engine, "ms": round(ms, 3), "kernel_ms": round(kernel, 3), "rel_diff": rel,
                        **({"rounds_ms": [round(r, 3) for r in rounds]} if rounds else {})})
        lines.append(f"| {what} | {engine} | {ms:.2f} | {kernel:.2f} | {base / ms:.2f}x | {'-' if rel is None else f'{rel:.1e}'} |")
    print(write_results("comfyui" if args.model == "sd15" else f"comfyui-{args.model}", results, "\n".join(lines),
                        args.out_dir))


if __name__ == "__main__":
    main()
