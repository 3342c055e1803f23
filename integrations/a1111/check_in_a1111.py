"""Checks the rocm_sd extension inside a real AUTOMATIC1111 checkout, without its server or any model file:

    python integrations/a1111/check_in_a1111.py --webui /path/to/stable-diffusion-webui --device cpu|cuda --out DIR

The webui is imported and initialized as webui.py does; the extension is installed in its extensions folder (a
symlink) and loaded by the webui's own script loader. For SD1.5 (configs/v1-inference.yaml) and SDXL
(generative-models' sd_xl_base.yaml) a random-weight checkpoint is written and loaded through the webui's own path;
txt2img runs through modules.processing with the cross attention optimization "sdp" (the webui's own) and "rocm_sd"
(every feature on), plain and with hires fix (a second resolution), and again with "sdp" afterwards (the webui's
model is itself again). Fails unless the images agree (CPU fp32: max difference <= 2 levels of 255; GPU: PSNR >= 40
dB) and rocm_sd's ops ran (on the GPU: its kernels, every call, and the UNet's steps replayed from graphs). Then
the Tiling order: txt2img with the tab's "Tiling" checkbox (process_images -> sd_hijack's apply_circular, which sets
padding_mode="circular" on every Conv2d) with "sdp" and with "rocm_sd" must agree as above, and the check must be
able to fail: the tiled image differs beyond the tolerance from the untiled one, and from rocm_sd's with its folded
VAE upsamplers convolving with zero padding whatever the mode (as before issue 46 item 7b's fix). Then the Prepare
order (--prepare-models): the extension's "rocm_sd" tab as the webui builds it (gradio), its Prepare button's
function pressed for the loaded model at the check's size; it must have run the webui's own model there under
rocm_sd.prepare's machinery, every convolution and GEMM problem of a webui txt2img at that size must be among those it
ran, and an image after it must be the image before. Writes the images and
check.json to --out. On the CPU the extension's optimization is offered although the kernels
cannot run there (rocm_sd's PyTorch path runs: what is checked is that the patches are in use).
"""
import argparse
import contextlib
import json
import os
import sys
import time

os.environ.setdefault("ROCM_SD_TUNE_DEFAULTS", "0")  # a shipped database's `torch` choice would fail the kernel check

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import real_webui  # noqa: E402

SDP = "sdp - scaled dot product"
ROCM_SD = "rocm_sd - rocm_sd kernels (AMD GPUs)"


def psnr(a, b) -> float:
    import numpy as np

    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)


def extension_script():
    """The extension's script module as the webui loaded it."""
    from modules import scripts

    for script_file in scripts.scripts_data:
        if script_file.path.endswith("rocm_sd_a1111.py"):
            return script_file.module
    raise RuntimeError("the webui did not load the rocm_sd extension's script")


def agree(a, b, device: str) -> bool:
    """The check's tolerance: CPU fp32 within 2 levels of 255, GPU PSNR >= 40 dB."""
    return int(abs(a.astype(int) - b.astype(int)).max()) <= 2 if device == "cpu" else psnr(a, b) >= 40


def compare(a, b) -> dict:
    return {"max difference (of 255)": int(abs(a.astype(int) - b.astype(int)).max()), "psnr dB": psnr(a, b)}


def generate(modules, optimization: str, args, out: str, tag: str, tiling: bool = False) -> dict:
    import numpy as np

    applied = real_webui.select_optimization(modules, optimization)
    images = {}
    for hires in (False, True):
        start = time.perf_counter()
        processed = real_webui.txt2img(modules, args.size, args.steps, hires=hires, tiling=tiling)
        image = processed.images[0]
        name = f"{tag}-{'hires' if hires else 'plain'}"
        image.save(os.path.join(out, name + ".png"))
        images[hires] = np.asarray(image)
        print(f"  {name}: {image.size}, mean {images[hires].mean():.1f} std {images[hires].std():.1f}, "
              f"{time.perf_counter() - start:.1f} s")
    return {"applied": applied, "images": images}


def check_model(modules, arch: str, args, out: str) -> dict:
    import rocm_sd
    import torch

    dtype = "F32" if args.device == "cpu" else "F16"
    path = os.path.join(args.data, "models", "Stable-diffusion", f"rocm_sd-random-{arch}.safetensors")
    real_webui.write_random_checkpoint(args.webui, arch, path, dtype=dtype)
    model = real_webui.load_checkpoint(modules, path)
    script = extension_script()
    print(f"{arch}: {type(model).__name__} loaded by the webui")
    reference = generate(modules, SDP, args, out, f"{arch}-sdp")
    rocm_sd.reset_stats()
    optimized = generate(modules, ROCM_SD, args, out, f"{arch}-rocm_sd")
    stats = {op: dict(rocm_sd.stats().get(op, {})) for op in ("group_norm", "layer_norm", "attention")}
    graphs = dict(script.unet_graph_stats())
    swapped = sum(type(m).__name__.startswith("Rocm") for m in model.modules())
    again = generate(modules, SDP, args, out, f"{arch}-sdp-again")
    restored = not any(type(m).__name__.startswith("Rocm") for m in model.modules())

    result = {"arch": arch, "applied": optimized["applied"], "rocm_sd modules while applied": swapped,
              "restored after switching back": restored, "op calls": stats, "graphs": graphs}
    ok = optimized["applied"] == "rocm_sd" and swapped > 0 and restored
    for hires in (False, True):
        a, b, c = reference["images"][hires], optimized["images"][hires], again["images"][hires]
        key = "hires" if hires else "plain"
        result[key] = {**compare(a, b), "sdp again identical": bool((a == c).all()), "image std": float(a.std())}
        ok = ok and agree(a, b, args.device) and bool((a == c).all()) and a.std() > 1  # a flat image agrees with anything
    result["tiling"] = check_tiling(modules, model, args, out, arch, reference["images"])
    ok = ok and result["tiling"]["ok"]
    if arch in args.prepare_models.split(","):
        result["prepare"] = check_prepare(modules, args, out, arch, optimized["images"])
        ok = ok and result["prepare"]["ok"]
    if args.device == "cpu":
        ran = all(sum(counts.values()) > 0 for op, counts in stats.items() if op != "attention")
    else:
        ran = all(counts and set(counts) == {"rocm_sd"} for op, counts in stats.items() if op != "attention")
        ran = ran and graphs.get("graph captures", 0) >= 2 and graphs.get("graph replays", 0) > 0
    result["ops ran"] = ran
    result["ok"] = bool(ok and ran)
    print(json.dumps(result, indent=1, default=str))
    del model
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return result


@contextlib.contextmanager
def zero_padded_fold(model):
    """The VAE's folded upsamplers convolving with zero padding whatever their convolution's padding mode, as they
    did before issue 46 item 7b's fix: the Tiling order's negative control. Yields how many classes it changed."""
    from rocm_sd.modules.upsample import folded_upsample_conv

    classes = {type(m) for m in model.first_stage_model.modules() if hasattr(m, "rocm_sd_folded")}
    saved = {cls: cls.__dict__["forward"] for cls in classes}
    for cls in classes:
        cls.forward = lambda self, x: folded_upsample_conv(x, self.conv, self.rocm_sd_folded)
    try:
        yield len(classes)
    finally:
        for cls, forward in saved.items():
            cls.forward = forward


def check_tiling(modules, model, args, out: str, arch: str, untiled: dict) -> dict:
    """The txt2img tab's "Tiling" with "sdp" and with "rocm_sd": they must agree, and the tolerance must tell the
    tiled image from the untiled one (`untiled`: sdp's plain and hires images) and from the zero-padded fold's."""
    reference = generate(modules, SDP, args, out, f"{arch}-tiling-sdp", tiling=True)
    optimized = generate(modules, ROCM_SD, args, out, f"{arch}-tiling-rocm_sd", tiling=True)
    with zero_padded_fold(model) as changed:
        control = generate(modules, ROCM_SD, args, out, f"{arch}-tiling-zero-padded-fold", tiling=True)
    circular = modules.sd_hijack.model_hijack.circular_enabled  # the webui's own state after a tiled image
    real_webui.select_optimization(modules, SDP)
    result = {"applied": optimized["applied"], "folded upsampler classes in the control": changed,
              "webui set circular padding": bool(circular)}
    ok = optimized["applied"] == "rocm_sd" and changed > 0 and circular
    for hires in (False, True):
        a, b, c = reference["images"][hires], optimized["images"][hires], control["images"][hires]
        result["hires" if hires else "plain"] = {
            "rocm_sd": compare(a, b), "untiled sdp (must differ)": compare(a, untiled[hires]),
            "zero-padded fold (must differ)": compare(a, c)}
        ok = (ok and agree(a, b, args.device) and not agree(a, untiled[hires], args.device)
              and not agree(a, c, args.device))
    result["ok"] = bool(ok)
    return result


def prepare_button():
    """The function the Prepare button of the extension's tab calls, from the tabs the webui builds (gradio)."""
    from modules import script_callbacks

    for tab, title, _ in script_callbacks.ui_tabs_callback():
        if title == "rocm_sd":
            buttons = [f for f in tab.fns if any(getattr(c, "elem_id", None) == "rocm_sd_prepare_result"
                                                 for c in f.outputs)]
            if len(buttons) == 1:
                return buttons[0].fn
    raise RuntimeError("the webui built no 'rocm_sd' tab with a Prepare button")


def check_prepare(modules, args, out: str, arch: str, before: dict) -> dict:
    """The Prepare button pressed for the loaded model (with "rocm_sd" the optimization) at the check's size: it must
    have run the webui's own model there under rocm_sd.prepare's machinery (run_sizes), and every convolution and
    GEMM problem of a webui txt2img at that size must be among the ones it ran."""
    from rocm_sd import prepare

    real_webui.select_optimization(modules, ROCM_SD)
    press, runs, real_run = prepare_button(), [], prepare.run_sizes
    prepare.run_sizes = lambda *a, **k: runs.append(real_run(*a, **k)) or runs[-1]  # observed, not replaced
    try:
        start = time.perf_counter()
        text = press(f"{args.size}x{args.size}", 1)
        seconds = time.perf_counter() - start
    finally:
        prepare.run_sizes = real_run
    print(text)
    recorder = prepare.VendorProblems()  # the webui's own problems at that size, for comparison
    with recorder:
        real_webui.txt2img(modules, args.size, args.steps)
    after = generate(modules, ROCM_SD, args, out, f"{arch}-rocm_sd-after-prepare")
    real_webui.select_optimization(modules, SDP)
    result = {"button": text.splitlines(), "seconds": round(seconds, 1), "ran": len(runs),
              "diffusers imported": "diffusers" in sys.modules}
    ok = len(runs) == 1 and text == "\n".join(runs[0].lines)
    if runs:
        prepared = runs[0]
        result.update({"model": prepared.model, "sizes": [list(s) for s in prepared.sizes]})
        ok = ok and prepared.model == f"rocm_sd-random-{arch}.safetensors" and list(prepared.sizes) == [
            (args.size, args.size)]
        for kind in ("convolution", "GEMM"):
            webui = {key for key, k in recorder.problems.items() if k == kind}
            covered = webui & {key for key, k in prepared.problems.items() if k == kind}
            result[f"{kind} problems"] = {"prepared": prepared.count(kind), "webui txt2img": len(webui),
                                          "of them prepared": len(covered)}
            ok = ok and prepared.count(kind) > 0 and covered == webui
    result["image after = before"] = all(bool((after["images"][h] == before[h]).all()) for h in (False, True))
    result["ok"] = bool(ok and result["image after = before"])
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--webui", required=True, help="an AUTOMATIC1111 checkout with its repositories/ and "
                        "Python requirements installed")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--out", required=True, help="folder for the images and check.json")
    parser.add_argument("--data", default=None, help="the webui's data folder (random checkpoints, extension "
                        "link, settings); default: OUT/webui-data")
    parser.add_argument("--models", default="sd15,sdxl")
    parser.add_argument("--prepare-models", default=None, help="the models whose Prepare button is pressed (default: "
                        "all on the GPU, sd15 on the CPU, where SDXL's fp32 txt2img is slow on a few cores)")
    parser.add_argument("--size", type=int, default=None, help="image size (default: 64 on the CPU, 512 on the GPU)")
    parser.add_argument("--steps", type=int, default=None, help="sampling steps (default: 2 on the CPU, 8 on the GPU)")
    args = parser.parse_args()
    args.size = args.size or (64 if args.device == "cpu" else 512)
    args.steps = args.steps or (2 if args.device == "cpu" else 8)
    args.prepare_models = args.prepare_models if args.prepare_models is not None else (
        "sd15" if args.device == "cpu" else args.models)
    args.webui, args.out = os.path.abspath(args.webui), os.path.abspath(args.out)
    args.data = os.path.abspath(args.data or os.path.join(args.out, "webui-data"))
    os.makedirs(args.out, exist_ok=True)
    real_webui.offline_clip_cache(os.path.join(args.data, "huggingface"))
    modules = real_webui.start_webui(args.webui, args.data, args.device)
    if args.device == "cpu":  # offer the optimization without a GPU: rocm_sd's PyTorch path runs
        extension_script().SdOptimizationRocmSd.is_available = lambda self: True
        modules.sd_hijack.list_optimizers()
    results = [check_model(modules, arch, args, args.out) for arch in args.models.split(",")]
    ok = all(r["ok"] for r in results)
    with open(os.path.join(args.out, "check.json"), "w") as f:
        json.dump({"device": args.device, "size": args.size, "steps": args.steps, "results": results, "ok": ok},
                  f, indent=1, default=str)
    print("OK" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
