"""Checks the rocm_sd nodes inside a real ComfyUI checkout, without its server or any model file:

    python integrations/comfyui/check_in_comfyui.py /path/to/ComfyUI [--cpu]

Builds a small random SD1.5-style UNet and a random SD VAE with ComfyUI's own classes, runs them through
ComfyUI's ModelPatcher with and without "rocm_sd Optimize Model" / "rocm_sd Optimize VAE", and checks:
the outputs agree, the attention override is called, the object patches are in place while the model is
loaded, and the original model is exactly itself again afterwards; then KSampler's own path agrees with
and without the node and (on a GPU) replays the node's captured graph, also with the node's 8-bit `precision`
(on a GPU) and a weight patch; the node run while another clone of the model is loaded (a LoRA'd one, the previous
run's optimized one: re-queues, a LoRA strength or an option changed, the node chained on its own output) gives what
its input gives; small random SD3.5-style / SD3-style MMDiTs and a small Flux, built with ComfyUI's own classes,
agree with and without the node (one evaluation and KSampler's path, graph replay on a GPU) and revert exactly, and
with the node's step cache (fbcache / teacache) KSampler's path agrees with the uncached node at threshold 0 and skips
evaluations at a large threshold;
"rocm_sd Tune" reads the architecture from ComfyUI's model configs (the tuning
itself is not run). Exits non-zero on any failure.
"""
import argparse
import contextlib
import importlib.util
import os
import sys
from collections import Counter

# The check asks that every GroupNorm / LayerNorm ran rocm_sd's kernel; a shipped default database's measured
# `torch` choice (tune/defaults/, e.g. LayerNorm ties on the H200) would make that a false failure.
os.environ.setdefault("ROCM_SD_TUNE_DEFAULTS", "0")

HERE = os.path.dirname(os.path.abspath(__file__))


def load_nodes():
    spec = importlib.util.spec_from_file_location("rocm_sd_comfyui", os.path.join(HERE, "__init__.py"),
                                                  submodule_search_locations=[HERE])
    package = importlib.util.module_from_spec(spec)
    sys.modules["rocm_sd_comfyui"] = package
    spec.loader.exec_module(package)
    return package.NODE_CLASS_MAPPINGS


def import_comfyui(path: str, cpu: bool = False):
    """ComfyUI's `comfy` package from the checkout at `path`, its command line parsed as `main.py [--cpu]`."""
    sys.argv = ["main.py"] + (["--cpu"] if cpu else [])
    sys.path.insert(0, os.path.abspath(path))
    import comfy.options

    comfy.options.enable_args_parsing()
    import comfy.ldm.models.autoencoder
    import comfy.ldm.modules.attention
    import comfy.model_management
    import comfy.model_patcher
    import comfy.sd
    import comfy.supported_models
    return comfy


def kernels_ran(torch, device, ops) -> tuple[bool, dict]:
    """On a GPU: whether every call of `ops` since the last reset ran rocm_sd's kernel (the patches are in use,
    not merely installed); on a CPU the ops run PyTorch by design, so only that they were called."""
    import rocm_sd

    stats = {op: rocm_sd.stats().get(op, {}) for op in ops}
    if device.type == "cpu":
        return all(stats.values()), stats
    return all(counts and set(counts) == {"rocm_sd"} for counts in stats.values()), stats


SMALL_UNET = {"model_channels": 32, "in_channels": 4, "out_channels": 4, "num_res_blocks": [1, 1],
              "channel_mult": [1, 2], "transformer_depth": [1, 1], "transformer_depth_output": [1, 1, 1, 1],
              "transformer_depth_middle": 1, "context_dim": 64, "num_head_channels": 8,
              "use_linear_in_transformer": False, "adm_in_channels": None, "use_temporal_attention": False,
              "use_temporal_resblock": False, "num_heads": -1, "image_size": 32, "use_spatial_transformer": True,
              "legacy": False}


def small_model(torch, comfy, device, dtype, model_class="SD15", base=SMALL_UNET, **unet_config):
    """A ModelPatcher around a small random model of ComfyUI's `model_class` (comfy/supported_models.py) built
    with ComfyUI's own classes; unet_config entries override `base`'s."""
    config = getattr(comfy.supported_models, model_class)(base | unet_config)
    config.set_inference_dtype(dtype, None)
    model = config.get_model({}, device=device)
    random_weights(torch, model)
    return comfy.model_patcher.ModelPatcher(model, load_device=device, offload_device=torch.device("cpu"))


def random_weights(torch, model) -> None:
    """Random weights (seed 0) for the diffusion model of a ComfyUI BaseModel built without a state dict, its buffers
    too (SD3's position embedding is torch.empty). Not the BaseModel's model_sampling beside it: KSampler's schedule
    comes from its sigmas buffer (comfy.samplers.calculate_sigmas), and random ones gave SD3's 6 steps sigmas from
    -0.99 rising to 0.21, each a new sampling run for the step cache (issue 50), and SD1.5's negative sigmas."""
    torch.manual_seed(0)
    network = model.diffusion_model
    for p in [*network.parameters(), *network.buffers()]:
        if p.is_floating_point():
            p.data.normal_(0, 0.1)


def count_override_calls(optimized) -> tuple[list, object]:
    """(a list that grows by one at every call of the node's attention override on `optimized`, the override)."""
    calls = []
    options = optimized.model_options["transformer_options"]
    override = options.get("optimized_attention_override")
    if override is not None:
        options["optimized_attention_override"] = lambda *a, **k: calls.append(1) or override(*a, **k)
    return calls, override


def check_model(torch, comfy, nodes, device, dtype):
    patcher = small_model(torch, comfy, device, dtype)
    model = patcher.model
    g = torch.Generator().manual_seed(1)
    x, ctx = torch.randn(2, 4, 16, 16, generator=g), torch.randn(2, 7, 64, generator=g)
    x, ctx, t = x.to(device, dtype), ctx.to(device, dtype), torch.tensor([500.0, 500.0], device=device)

    def run(p):
        comfy.model_management.load_models_gpu([p])
        with torch.inference_mode():
            return p.model.apply_model(x, t, c_crossattn=ctx, transformer_options=p.model_options["transformer_options"])

    reference = run(patcher)
    (optimized,) = nodes["RocmSDOptimizeModel"]().optimize(patcher)
    calls, override = count_override_calls(optimized)
    import rocm_sd

    rocm_sd.reset_stats()
    got = run(optimized)
    ran, stats = kernels_ran(torch, device, ("group_norm", "layer_norm"))
    swapped = sum(type(m).__name__.startswith("Rocm") for m in optimized.model.modules())
    diff = relative_difference(got, reference)
    again = run(patcher)
    restored = torch.equal(again, reference) and not any(type(m).__name__.startswith("Rocm") for m in model.modules())
    print(f"model: {len(optimized.object_patches)} object patches, {swapped} rocm_sd modules while loaded, "
          f"attention override called {len(calls)}x, max relative difference {diff:.2e}, original restored: {restored}, "
          f"op calls {stats}")
    return diff <= _tolerance(torch, dtype) and swapped > 0 and (override is None or calls) and restored and ran


def _tolerance(torch, dtype) -> float:
    """Relative tolerance against ComfyUI's own result. fp32 (the CPU run): 1e-3, because the node's channels_last
    convolutions take other algorithms than NCHW ones (the difference is 2.3e-4 on the CPU in fp32 and exactly 0
    in fp64: rounding, not math); fp16: 2e-2."""
    return 1e-3 if dtype == torch.float32 else 2e-2


def relative_difference(got, reference) -> float:
    """max |got - reference| / max |reference|."""
    return (got.float() - reference.float()).abs().max().item() / reference.float().abs().max().item()


def sampler_inputs(torch, generator) -> tuple:
    """(noise, latent, positive, negative) of a 128x128 txt2img KSampler run on the small model."""
    noise, latent = torch.randn(1, 4, 16, 16, generator=generator), torch.zeros(1, 4, 16, 16)
    positive = [[torch.randn(1, 7, 64, generator=generator), {}]]
    negative = [[torch.randn(1, 7, 64, generator=generator), {}]]
    return noise, latent, positive, negative


def ksampler(torch, patcher, noise, latent, positive, negative):
    """What the KSampler node calls: 6 euler steps, CFG 7."""
    import comfy.sample

    with torch.inference_mode():
        return comfy.sample.sample(patcher, noise, 6, 7.0, "euler", "normal", positive, negative, latent, seed=0,
                                   disable_pbar=True)


def check_sampler(torch, comfy, nodes, device, dtype):
    """KSampler's own path (comfy.sample.sample, as the KSampler node calls it) with and without the node: the
    latents agree, and on a GPU the steps replayed the node's captured graph."""
    from rocm_sd.patch.comfy_graph import graph_stats

    patcher = small_model(torch, comfy, device, dtype)
    (optimized,) = nodes["RocmSDOptimizeModel"]().optimize(patcher)
    g = torch.Generator().manual_seed(3)
    noise, latent, positive, negative = sampler_inputs(torch, g)

    def sample(p):
        return ksampler(torch, p, noise, latent, positive, negative)

    reference, got = sample(patcher), sample(optimized)
    again = sample(optimized)  # a second run: new uuids and conds, the same graph
    stats = graph_stats(optimized)
    diff = max(relative_difference(out, reference) for out in (got, again))
    print(f"sampler: 2 x 6 euler steps, max relative difference {diff:.2e}, graphs {dict(stats)}")
    graphed = stats["graph captures"] == 1 and stats["graph replays"] == 12 if device.type == "cuda" else True
    tolerance = _tolerance(torch, dtype)
    if not (diff <= tolerance and graphed):
        return False

    # With a ControlNet (as "Apply ControlNet" attaches it): its residuals reach the model as a dict of tensor
    # lists that ComfyUI's UNet pops from; the graph takes them as inputs, fresh every step.
    control = controlnet_for(torch, comfy, patcher, device, dtype)
    hint = torch.rand(1, 3, 128, 128, generator=g)
    cnet = control.copy().set_cond_hint(hint, 0.9, (0.0, 1.0))
    positive = [[positive[0][0], {"control": cnet}]]
    negative = [[negative[0][0], {"control": cnet}]]
    before = graph_stats(optimized)
    reference, got = sample(patcher), sample(optimized)
    stats = graph_stats(optimized) - before
    diff = relative_difference(got, reference)
    effect = (reference.float() - again.float()).abs().max().item()  # the ControlNet changed the picture
    print(f"sampler with a ControlNet: max relative difference {diff:.2e}, its effect {effect:.2e}, "
          f"graphs {dict(stats)}")
    graphed = stats["graph captures"] == 1 and stats["graph replays"] == 6 if device.type == "cuda" else True
    return diff <= tolerance and effect > 0 and graphed


def controlnet_for(torch, comfy, patcher, device, dtype):
    """A random ControlNet matching `patcher`'s UNet, as comfy.controlnet.load_controlnet_state_dict builds one."""
    import comfy.cldm.cldm
    import comfy.controlnet
    import comfy.ops

    config = dict(patcher.model.model_config.unet_config)
    config.pop("out_channels", None)
    config.update(hint_channels=3, dtype=dtype, device=device,
                  operations=comfy.ops.pick_operations(dtype, None))
    model = comfy.cldm.cldm.ControlNet(**config)
    torch.manual_seed(4)
    for p in model.parameters():
        p.data.normal_(0, 0.1)
    return comfy.controlnet.ControlNet(model, load_device=device)


def check_requeue_orders(torch, comfy, nodes, device, dtype):
    """The node executes before its KSampler loads anything, often while another clone of the same model is ComfyUI's
    loaded model (issue 46): in each order below the optimized MODEL must sample as its input does, never with the
    loaded clone's weights or copies. LoRA: a weight patch ("diff") on every convolution and norm weight."""
    g = torch.Generator().manual_seed(6)
    x, ctx = torch.randn(2, 4, 16, 16, generator=g), torch.randn(2, 7, 64, generator=g)
    x, ctx, t = x.to(device, dtype), ctx.to(device, dtype), torch.tensor([500.0, 500.0], device=device)
    optimize = nodes["RocmSDOptimizeModel"]().optimize
    base = small_model(torch, comfy, device, dtype)
    keys = [f"{name}.weight" for name, m in base.model.named_modules()
            if isinstance(m, (torch.nn.Conv2d, torch.nn.GroupNorm, torch.nn.LayerNorm))]
    diffs = {k: v for k, v in base.model.state_dict().items() if k in keys}

    def lora(p, strength=1.0, scale=0.5):
        clone = p.clone()
        clone.add_patches({k: (torch.randn(w.shape, generator=torch.Generator().manual_seed(7)).to(w) * scale,)
                           for k, w in diffs.items()}, strength)
        return clone

    def run(p):
        comfy.model_management.load_models_gpu([p])
        with torch.inference_mode():
            return p.model.apply_model(x, t, c_crossattn=ctx, transformer_options=p.model_options["transformer_options"])

    def fresh(p):
        comfy.model_management.unload_all_models()
        out = run(p)
        comfy.model_management.unload_all_models()
        return out

    reference, full, half, one_percent = base, lora(base), lora(base, 0.5), lora(base, scale=0.01)
    expected = {id(p): fresh(p) for p in (reference, full, half, one_percent)}
    cases = {}

    def case(name, order):
        comfy.model_management.unload_all_models()
        optimized, truth = order()
        cases[name] = (relative_difference(run(optimized), expected[id(truth)]),
                       relative_difference(expected[id(truth)], expected[id(base)]) if truth is not base else None)

    case("LoRA'd clone loaded when the node runs", lambda: (run(full), (optimize(base)[0], base))[1])
    case("a 1% weight patch loaded when the node runs", lambda: (run(one_percent), (optimize(base)[0], base))[1])
    case("re-queue after a LoRA strength change", lambda: (run(optimize(full)[0]), (optimize(half)[0], half))[1])
    case("re-queue with an option changed and the LoRA removed",
         lambda: (run(optimize(full)[0]), (optimize(base, layer_norm=False)[0], base))[1])
    optimized = optimize(base)[0]
    case("a LoRA after the node, after the node alone and the plain model",
         lambda: (run(optimized), run(base), (lora(optimized), full))[2])
    case("chained on its own output with another optimized clone loaded",  # the first node ran with none loaded
         lambda: (once := optimize(base)[0], run(optimize(base)[0]), (optimize(once, channels_last=False)[0], base))[2])
    comfy.model_management.unload_all_models()
    tolerance = _tolerance(torch, dtype)
    effect = relative_difference(expected[id(one_percent)], expected[id(base)])
    for name, (diff, lora_effect) in cases.items():
        print(f"requeue order, {name}: max relative difference {diff:.2e}"
              + (f" (the LoRA's own effect {lora_effect:.2e})" if lora_effect is not None else ""))
    print(f"requeue orders: the 1% patch's own effect {effect:.2e}, tolerance {tolerance:.0e}")
    # An order only tells a baked-in clone from the right weights when their images differ: every LoRA's own effect
    # (and the 1% patch's) must stand clear of the tolerance.
    distinguishing = all(lora_effect > 3 * tolerance for _, lora_effect in cases.values() if lora_effect is not None)
    return effect > 3 * tolerance and distinguishing and all(diff <= tolerance for diff, _ in cases.values())


def check_tune_node(torch, comfy, nodes):
    """"rocm_sd Tune" reads the architecture from ComfyUI's own model config objects (SD1.5 and SDXL, small
    channel counts, real context widths) and asks the tuner and rocm_sd.prepare for it; neither is run here."""
    from rocm_sd import prepare
    from rocm_sd.tune import cli as tune_cli

    runs, prepared, real_main, real_prepare = [], [], tune_cli.main, prepare.run
    tune_cli.main = lambda argv: runs.append(argv[1]) or 0
    prepare.run = lambda arch, *args, **kwargs: prepared.append(arch)
    try:
        for name, config in (("SD15", {"context_dim": 768}),
                             ("SDXL", {"context_dim": 2048, "adm_in_channels": 2816, "num_classes": "sequential",
                                       "transformer_depth": [0, 0, 1, 1],
                                       "transformer_depth_output": [0, 0, 0, 1, 1, 1]})):
            patcher = small_model(torch, comfy, torch.device("cpu"), torch.float32, name, **config)
            nodes["RocmSDTune"]().tune(patcher, width=512, height=512)
    finally:
        tune_cli.main, prepare.run = real_main, real_prepare
    print(f"tune node: architectures asked for {runs}, prepared {prepared}")
    return runs == ["sd15", "sdxl"] and prepared == (runs if torch.cuda.is_available() else [])


# Small SD3 / SD3.5 (MMDiT: hidden 64 * depth, heads of 64) and Flux configs, as comfy/model_detection.py reads them
# from a checkpoint, for comfy/supported_models.py's SD3 and Flux.
SMALL_MMDIT = {"in_channels": 16, "out_channels": 16, "patch_size": 2, "depth": 2, "input_size": None,
               "adm_in_channels": 32, "pos_embed_scaling_factor": None, "num_patches": 64, "pos_embed_max_size": 8,
               "context_embedder_config": {"target": "torch.nn.Linear",
                                           "params": {"in_features": 48, "out_features": 128}}}
SMALL_FLUX = {"image_model": "flux", "in_channels": 16, "out_channels": 16, "vec_in_dim": 32, "context_in_dim": 48,
              "hidden_size": 64, "mlp_ratio": 4.0, "num_heads": 2, "depth": 2, "depth_single_blocks": 2,
              "axes_dim": [8, 12, 12], "theta": 10000, "patch_size": 2, "qkv_bias": True, "guidance_embed": True}
TRANSFORMERS = [  # (what, supported_models class, config, the ops its blocks call, KSampler's CFG)
    ("SD3.5 Medium-style MMDiT (Q / K RMSNorm, a dual-attention block)", "SD3",
     SMALL_MMDIT | {"qk_norm": "rms", "x_block_self_attn_layers": [0]}, ("ada_layer_norm", "add_ada_layer_norm",
                                                                         "rms_norm"), 4.5),
    ("SD3 Medium-style MMDiT (no Q / K norm)", "SD3", SMALL_MMDIT | {"x_block_self_attn_layers": []},
     ("ada_layer_norm", "add_ada_layer_norm"), 4.5),
    ("Flux (guidance-distilled, CFG 1)", "Flux", SMALL_FLUX, ("ada_layer_norm", "add_ada_layer_norm", "rms_norm"), 1.0),
]


@contextlib.contextmanager
def flux_rope_spy(comfy):
    """The `pe` of every call of ComfyUI's Flux attention function meanwhile: None where the rope was applied before
    (by rocm_sd::rms_norm), ComfyUI's rope tensor where ComfyUI's attention applies it."""
    import comfy.ldm.flux.layers as layers

    seen, attention = [], layers.attention

    def spy(*args, pe=None, **kwargs):
        seen.append(pe)
        return attention(*args, pe=pe, **kwargs)

    layers.attention = spy
    try:
        yield seen
    finally:
        layers.attention = attention


def check_transformers(torch, comfy, nodes, device, dtype):
    """The node on ComfyUI's own SD3 / SD3.5 and Flux classes (random weights): one evaluation per batch size (Flux:
    batch 1 takes rocm_sd's rope, batch 2 ComfyUI's) agrees with ComfyUI's, with the blocks swapped while loaded,
    the attention override called and the original restored exactly; then KSampler's path agrees, and on a GPU its
    steps replay the node's graph."""
    import comfy.sample
    import rocm_sd
    from rocm_sd.patch.comfy_graph import graph_stats

    ok = True
    for what, model_class, config, ops, cfg in TRANSFORMERS:
        patcher = small_model(torch, comfy, device, dtype, model_class, base=config)
        model = patcher.model
        (optimized,) = nodes["RocmSDOptimizeModel"]().optimize(patcher)
        calls, _ = count_override_calls(optimized)
        for batch in (1, 2):
            g = torch.Generator().manual_seed(batch)
            x, ctx, y = (torch.randn(*shape, generator=g).to(device, dtype)
                         for shape in ((batch, 16, 16, 16), (batch, 7, 48), (batch, 32)))
            t = torch.linspace(0.4, 0.9, batch, device=device)
            extra = {"y": y} | ({"guidance": torch.full((batch,), 3.5, device=device)} if model_class == "Flux" else {})

            def run(p):
                comfy.model_management.load_models_gpu([p])
                with torch.inference_mode():
                    return p.model.apply_model(x, t, c_crossattn=ctx,
                                               transformer_options=p.model_options["transformer_options"], **extra)

            reference = run(patcher)
            calls.clear()
            rocm_sd.reset_stats()
            with flux_rope_spy(comfy) as ropes:
                got = run(optimized)
            ran, stats = kernels_ran(torch, device, ops)
            swapped = [type(m).__name__ for m in optimized.model.modules() if type(m).__name__.startswith("Rocm")]
            diff = relative_difference(got, reference)
            again = run(patcher)
            restored = torch.equal(again, reference) and not any(type(m).__name__.startswith("Rocm")
                                                                 for m in model.modules())
            rope = "" if not ropes else f", rope applied by rocm_sd::rms_norm in {ropes.count(None)} of {len(ropes)}"
            print(f"{what}, batch {batch}: {len(optimized.object_patches)} object patches, rocm_sd blocks while "
                  f"loaded {dict(Counter(swapped))}, attention override called {len(calls)}x{rope}, max relative "
                  f"difference {diff:.2e}, original restored: {restored}, op calls {stats}")
            # rocm_sd's rope takes one table for the batch: ComfyUI's Flux builds one per sample (batch 2: its own)
            rope_as_said = not ropes or ropes.count(None) == (len(ropes) if batch == 1 else 0)
            ok = ok and diff <= _tolerance(torch, dtype) and swapped and calls and restored and ran and rope_as_said
        if not ok:
            return False

        g = torch.Generator().manual_seed(7)
        noise, latent = torch.randn(1, 16, 16, 16, generator=g), torch.zeros(1, 16, 16, 16)
        cond = {"pooled_output": torch.randn(1, 32, generator=g)}
        positive = [[torch.randn(1, 7, 48, generator=g), dict(cond)]]
        negative = [[torch.randn(1, 7, 48, generator=g), dict(cond)]]
        before = graph_stats(optimized)
        with torch.inference_mode():
            reference = comfy.sample.sample(patcher, noise, 6, cfg, "euler", "normal", positive, negative, latent,
                                            seed=0, disable_pbar=True)
            rocm_sd.reset_stats()
            got = comfy.sample.sample(optimized, noise, 6, cfg, "euler", "normal", positive, negative, latent, seed=0,
                                      disable_pbar=True)
        ran, op_stats = kernels_ran(torch, device, ops)
        stats = graph_stats(optimized) - before
        diff = relative_difference(got, reference)
        print(f"{what}: KSampler 6 euler steps, CFG {cfg}: max relative difference {diff:.2e}, graphs {dict(stats)}, "
              f"op calls {op_stats}")
        graphed = stats["graph captures"] == 1 and stats["graph replays"] == 6 if device.type == "cuda" else True
        ok = diff <= _tolerance(torch, dtype) and graphed and ran
        if not ok:
            return False
    return ok


def check_transformer_cache(torch, comfy, nodes, device, dtype):
    """The node's step cache (cache fbcache / teacache) on ComfyUI's own SD3.5-style MMDiT and Flux, on KSampler's
    path: at threshold 0 every evaluation is full and the latents agree with the node without the cache; at a
    threshold no change reaches, the evaluations after each slot's first are cached (teacache: but the run's last),
    the latents stay finite and differ; the input MODEL samples as before, exactly; on a GPU the cache's calls replay
    their own graphs."""
    import comfy.sample
    import comfy.samplers
    from rocm_sd.patch.comfy_graph import graph_stats

    def sample(p, cfg):
        g = torch.Generator().manual_seed(8)
        noise, latent = torch.randn(1, 16, 16, 16, generator=g), torch.zeros(1, 16, 16, 16)
        cond = {"pooled_output": torch.randn(1, 32, generator=g)}
        positive = [[torch.randn(1, 7, 48, generator=g), dict(cond)]]
        negative = [[torch.randn(1, 7, 48, generator=g), dict(cond)]]
        with torch.inference_mode():
            return comfy.sample.sample(p, noise, 6, cfg, "euler", "normal", positive, negative, latent, seed=0,
                                       disable_pbar=True)

    ok = True
    optimize = nodes["RocmSDOptimizeModel"]().optimize
    for what, model_class, config, _, cfg in (TRANSFORMERS[0], TRANSFORMERS[2]):
        patcher = small_model(torch, comfy, device, dtype, model_class, base=config)
        # KSampler's schedule (6 steps, "normal"): a cached step needs one going down, or every sigma is a new run
        sigmas = comfy.samplers.calculate_sigmas(patcher.get_model_object("model_sampling"), "normal", 6)
        falls = bool((sigmas[1:] < sigmas[:-1]).all()) and sigmas[-1] == 0
        print(f"{what}: KSampler's sigmas {[round(s, 4) for s in sigmas.tolist()]}, going down: {falls}")
        ok = ok and falls
        reference = sample(patcher, cfg)
        plain = sample(optimize(patcher)[0], cfg)
        for mode in ("fbcache", "teacache"):
            (every,) = optimize(patcher, cache=mode, dit_cache_threshold=0.0)
            (skipping,) = optimize(patcher, cache=mode, dit_cache_threshold=1e9)
            exact, cached = sample(every, cfg), sample(skipping, cfg)
            full, stats = graph_stats(every), graph_stats(skipping)
            diff = relative_difference(exact, plain)
            effect = relative_difference(cached, plain)
            restored = torch.equal(sample(patcher, cfg), reference)
            counts = {k: v for k, v in stats.items() if k.startswith("step cache")}
            print(f"{what}, cache {mode}: threshold 0 against the node without the cache: max relative difference "
                  f"{diff:.2e} ({full['step cache: full calls']} full calls); a large threshold: {counts}, its effect "
                  f"{effect:.2e}; original restored: {restored}; graphs {dict(stats)}")
            calls = stats["step cache: full calls"] + stats["step cache: cached calls"]
            skipped = stats["step cache: cached calls"] > 0 and not any("uncached" in k for k in counts)
            last_full = mode != "teacache" or stats["step cache: full calls"] >= 2
            graphed = (device.type != "cuda" or stats["head: graph replays"] == calls and stats["skip: graph replays"]
                       and not any("eager" in k for k in stats))
            ok = ok and (diff <= _tolerance(torch, dtype) and not any("cached calls" in k for k in full)
                         and skipped and last_full and effect > 0 and torch.isfinite(cached).all() and restored
                         and graphed)
    return ok


def check_vae(torch, comfy, nodes):
    from comfy.ldm.models.autoencoder import AutoencoderKL

    ddconfig = {"double_z": True, "z_channels": 4, "resolution": 256, "in_channels": 3, "out_ch": 3, "ch": 128,
                "ch_mult": [1, 2, 4, 4], "num_res_blocks": 2, "attn_resolutions": [], "dropout": 0.0}
    torch.manual_seed(0)
    state = {k: torch.randn_like(v) * 0.05 for k, v in AutoencoderKL(ddconfig=ddconfig, embed_dim=4).state_dict().items()}
    vae = comfy.sd.VAE(sd=state)
    (optimized,) = nodes["RocmSDOptimizeVAE"]().optimize(vae)
    z = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(2))
    import rocm_sd

    with torch.inference_mode():  # as ComfyUI runs every node; under autograd the patches take ComfyUI's path
        reference = vae.decode(z)
        rocm_sd.reset_stats()
        got = optimized.decode(z)
        ran, stats = kernels_ran(torch, comfy.model_management.get_torch_device(), ("group_norm",))
        restored = torch.equal(vae.decode(z), reference)
    diff = (got.float() - reference.float()).abs().max().item()
    print(f"vae: {len(optimized.patcher.object_patches)} object patches, max difference {diff:.2e}, "
          f"original restored: {restored}, op calls {stats}")
    return diff <= 2e-2 and restored and ran and check_vae_fixed_tiles(torch, vae, nodes)


def check_vae_fixed_tiles(torch, vae, nodes):
    """fixed_tiles through ComfyUI's own VAE.decode (its batching, dtype and device moves): the decoder sees the
    tile shapes only, at two image sizes, and a one-tile latent decodes as untiled."""
    from rocm_sd.modules import vae_tiles

    (tiled,) = nodes["RocmSDOptimizeVAE"]().optimize(vae, fixed_tiles="on")
    (untiled,) = nodes["RocmSDOptimizeVAE"]().optimize(vae, fixed_tiles="off")
    shapes = []
    hook = vae.first_stage_model.decoder.conv_in.register_forward_pre_hook(
        lambda m, args: shapes.append(tuple(args[0].shape[-2:])))
    ok = True
    try:
        with torch.inference_mode():
            for height, width in ((64, 64), (64, 80)):
                z = torch.randn(1, 4, height, width, generator=torch.Generator().manual_seed(height + width))
                reference = untiled.decode(z)
                shapes.clear()
                got = tiled.decode(z)
                seen, expected = set(shapes), vae_tiles.tile_shapes(height, width)
                diff = (got.float() - reference.float()).abs().max().item()
                print(f"vae fixed tiles, latent {height}x{width}: decoder saw {sorted(seen)} (expected "
                      f"{sorted(expected)}), max difference to untiled {diff:.2e}")
                ok &= seen == expected and (expected != {(height, width)} or diff <= 2e-2)
    finally:
        hook.remove()
    return ok


def check_precision(torch, comfy, nodes, device, dtype):
    """The node's `precision` option on KSampler's path (a GPU with 8-bit GEMMs; on a CPU, that the node declines it
    and says why): the latents stay near fp16's, the norms write the quantized rows and the steps replay the graph;
    then a LoRA-style weight patch (ComfyUI's "diff" patch) reaches the 8-bit layers as it reaches ComfyUI's own."""
    from rocm_sd.patch import precision
    from rocm_sd.patch.comfy_graph import graph_stats

    fmt, why = precision.number_format(device, "fp8")
    choice = "fp8" if fmt else "int8"
    patcher = small_model(torch, comfy, device, dtype)
    (optimized,) = nodes["RocmSDOptimizeModel"]().optimize(patcher, precision=choice, precision_layers="all")
    quantized = sum(hasattr(m, "rocm_sd_refresh") for m in optimized.object_patches.values())
    if device.type == "cpu":
        print(f"precision: on the CPU the node installs {quantized} 8-bit layers (expected 0: {why})")
        return quantized == 0
    g = torch.Generator().manual_seed(5)
    noise, latent, positive, negative = sampler_inputs(torch, g)

    def sample(p):
        return ksampler(torch, p, noise, latent, positive, negative)

    import rocm_sd

    reference = sample(patcher)
    rocm_sd.reset_stats()
    got = sample(optimized)
    ran, stats = kernels_ran(torch, device, ("layer_norm_quantize_rows", "quantize_rows"))
    graphs = graph_stats(optimized)
    diff = relative_difference(got, reference)
    print(f"precision={choice}: {quantized} 8-bit layers, max relative difference {diff:.2e} against fp16, "
          f"graphs {dict(graphs)}, op calls {stats}")
    if not (ran and quantized and diff < 0.1 and torch.isfinite(got).all() and graphs["graph replays"] == 6):
        return False
    key = next(k for k in patcher.model.state_dict() if k.endswith("attn1.to_q.weight"))
    delta = torch.randn(patcher.model.state_dict()[key].shape, generator=g).to(dtype) * 0.5
    for p in (patcher, optimized):
        p.add_patches({key: (delta,)}, 1.0)
    patched_reference, patched = sample(patcher), sample(optimized)
    diff = relative_difference(patched, patched_reference)
    effect = relative_difference(patched_reference, reference)
    print(f"precision={choice} with a weight patch: max relative difference {diff:.2e}, its effect {effect:.2e}")
    return diff < 0.1 and effect > 10 * diff


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("comfyui", help="a ComfyUI checkout (its requirements installed)")
    parser.add_argument("--cpu", action="store_true", help="run ComfyUI on the CPU")
    args = parser.parse_args()
    comfy = import_comfyui(args.comfyui, args.cpu)
    import torch

    device = comfy.model_management.get_torch_device()
    dtype = torch.float32 if device.type == "cpu" else torch.float16
    print(f"ComfyUI at {args.comfyui}: device {device}, override supported: "
          f"{hasattr(comfy.ldm.modules.attention, 'wrap_attn')}")
    nodes = load_nodes()
    # Every order runs whatever an earlier one gave, so that one failure does not hide the others' results.
    orders = {"model": lambda: check_model(torch, comfy, nodes, device, dtype),
              "sampler": lambda: check_sampler(torch, comfy, nodes, device, dtype),
              "requeue orders": lambda: check_requeue_orders(torch, comfy, nodes, device, dtype),
              "precision": lambda: check_precision(torch, comfy, nodes, device, dtype),
              "tune node": lambda: check_tune_node(torch, comfy, nodes),
              "transformers": lambda: check_transformers(torch, comfy, nodes, device, dtype),
              "transformer cache": lambda: check_transformer_cache(torch, comfy, nodes, device, dtype),
              "vae (and fixed tiles)": lambda: check_vae(torch, comfy, nodes)}
    passed = {name: bool(order()) for name, order in orders.items()}
    print("orders: " + ", ".join(f"{name} {'ok' if good else 'FAILED'}" for name, good in passed.items()))
    ok = all(passed.values())
    print("OK" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
