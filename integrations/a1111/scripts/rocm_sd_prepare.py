"""rocm_sd for AUTOMATIC1111: a "rocm_sd" tab whose Prepare button runs every convolution and GEMM problem the loaded
model issues at the sizes given, once, under `rocm_sd.prepare`'s machinery (`python -m rocm_sd prepare`'s: the
vendors' searches, the problem count, its lines), so that MIOpen's first-run search (find, minutes per new size on
ROCm) and TunableOp are done before the first image and kept for later launches (on NVIDIA, cuDNN's benchmark mode
for this process). Each size is a one-step txt2img of the webui's own model (modules.processing, no saving): its
text encoders, its UNet through the webui's sampling path (cond and uncond batched as the settings say, with rocm_sd's
patches while "rocm_sd" is the optimization, the webui's own forwards otherwise) and its VAE decode as the webui
decodes (its decode method setting). So the problems are exactly the webui's (dtypes, layouts, the VAE's batch of
one), and no diffusers is imported: the webui pins a huggingface_hub that current diffusers cannot import beside.
Generation waits for the button (the webui's queue lock), as it does for any other job. On Forge with --rocm-sd, each
size's sampling gets rocm_sd as a generation gets it (the extension's per-sampling patch): the problems are those of
the model Forge then samples with.
"""
import argparse
import os

from modules import script_callbacks, sd_models, shared

try:
    from rocm_sd import checkpoints, cli_args, models, prepare
    UNAVAILABLE = None
except ImportError as exc:  # the main script says so once; without rocm_sd there is no tab
    UNAVAILABLE = f"rocm_sd is not importable ({exc})"

SIZES_HINT = "WIDTHxHEIGHT, comma-separated, e.g. 1024x1024,832x1216 (empty: the model's own size)"
SAMPLER = "Euler"  # one model evaluation per step: a step's problems and no more


def _arguments(sd_model, sizes_text: str, batch):
    """(checkpoint name, sizes, batch) for the run; ValueError saying what is wrong with them. Without sizes, the
    model's own square size (its architecture read from the checkpoint)."""
    info = getattr(sd_model, "sd_checkpoint_info", None)
    if info is None:
        raise ValueError("no model is loaded (pick a checkpoint first)")
    try:
        sizes = cli_args.image_sizes(sizes_text) if (sizes_text or "").strip() else None
    except argparse.ArgumentTypeError as error:
        raise ValueError(f"image sizes: {error}") from None
    try:
        batch = cli_args.positive_int("1" if batch is None else str(batch).removesuffix(".0"))
    except argparse.ArgumentTypeError as error:
        raise ValueError(f"batch size: {error}") from None
    if sizes is None:
        sizes = [(models.default_size(checkpoints.architecture_of(info.filename)),) * 2]
    return os.path.basename(info.filename), sizes, batch


class _ForgeSamplingHook:
    """p.scripts of a prepare run on Forge. Forge installs rocm_sd per sampling, from the extension's script
    (RocmSdScript.process_before_every_sampling), and calls scripts only through p.scripts, which a txt2img built here
    lacks: without this runner the run would prepare Forge's unpatched model. It forwards that one callback; every
    other callback does nothing, so no other extension's script runs with arguments it was never given."""

    def __init__(self, script):
        self._script = script

    def process_before_every_sampling(self, p, **kwargs):
        self._script.process_before_every_sampling(p, **kwargs)

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return lambda *args, **kwargs: None


def _forge_rocm_sd_script(sd_model):
    """The extension's loaded RocmSdScript where the model is Forge's (forge_objects) and rocm_sd patches it per
    sampling (--rocm-sd); None on A1111, whose rocm_sd patches are the optimization itself and always on."""
    if getattr(sd_model, "forge_objects", None) is None or not getattr(shared.cmd_opts, "rocm_sd", False):
        return None
    from modules import scripts

    runner = getattr(scripts, "scripts_txt2img", None)
    return next((s for s in getattr(runner, "alwayson_scripts", None) or [] if s.title() == "rocm_sd"), None)


def _txt2img(sd_model, batch: int):
    """run_size for prepare.run_sizes: one step of the webui's txt2img at (width, height), `batch` images; on Forge
    with --rocm-sd, with rocm_sd installed as a generation installs it."""
    from modules import processing

    forge_script = _forge_rocm_sd_script(sd_model)

    def run_size(width: int, height: int) -> None:
        p = processing.StableDiffusionProcessingTxt2Img(
            sd_model=sd_model, prompt=prepare.PROMPT, negative_prompt="", steps=1, width=width, height=height,
            batch_size=batch, n_iter=1, sampler_name=SAMPLER, do_not_save_samples=True, do_not_save_grid=True)
        if forge_script is not None:
            p.scripts = _ForgeSamplingHook(forge_script)
        try:
            processing.process_images(p)
        finally:
            p.close()
    return run_size


def _describe(sd_model, batch: int) -> str:
    from modules import devices, sd_hijack

    dtypes = ", ".join(f"{part} {str(getattr(devices, f'dtype_{part.lower()}', '?')).removeprefix('torch.')}"
                       for part in ("UNet", "VAE"))
    if getattr(sd_model, "forge_objects", None) is not None:
        optimization = ("rocm_sd per sampling" if _forge_rocm_sd_script(sd_model) is not None
                        else "Forge's own (rocm_sd not on: --rocm-sd)")
    else:
        optimization = getattr(sd_hijack.current_optimizer, "name", None) or "none"
    return (f"the webui's model ({dtypes}, optimization {optimization}), batch {batch}, on {devices.device}; "
            f"a {SAMPLER} step of txt2img and its VAE decode per size")


def prepare_loaded_model(sizes_text: str, batch) -> str:
    """The Prepare button: the loaded model's problems at `sizes_text`, `batch` images per call. Returns what it did
    (prepare's lines) or why it did nothing, for the tab's result box; never raises."""
    if UNAVAILABLE:
        return f"nothing prepared: {UNAVAILABLE}"
    sd_model = getattr(sd_models.model_data, "sd_model", None)  # not shared.sd_model: that would load one
    try:
        name, sizes, batch = _arguments(sd_model, sizes_text, batch)
    except (ValueError, OSError) as error:  # OSError: the checkpoint file is gone or unreadable
        return f"nothing prepared: {error}"
    from modules import devices
    from modules.call_queue import queue_lock

    state = getattr(shared, "state", None)
    with queue_lock:  # not while an image is generated
        if state is not None:  # as the webui's own jobs start: a past Interrupt must not stop this one
            state.begin(job="rocm_sd_prepare")
        try:
            result = prepare.run_sizes(name, _txt2img(sd_model, batch), sizes, devices.device,
                                       _describe(sd_model, batch))
        except Exception as error:  # noqa: BLE001 - a failed warm-up must not take the webui down
            return f"prepare stopped ({type(error).__name__}: {error}); the first image will search as usual"
        finally:
            if state is not None:
                state.end()
    return "\n".join(result.lines)


def on_ui_tabs():
    import gradio as gr

    with gr.Blocks(analytics_enabled=False) as tab:
        gr.Markdown("**Prepare**: run every convolution and GEMM problem of the loaded model at these sizes once, so "
                    "that MIOpen's first-run search (minutes per new size on ROCm) is done before the first image. "
                    "Include the hires fix size. Progress is shown in the console.")
        with gr.Row():
            sizes = gr.Textbox(label="Image sizes", placeholder=SIZES_HINT, elem_id="rocm_sd_prepare_sizes")
            batch = gr.Number(label="Batch size", value=1, precision=0, elem_id="rocm_sd_prepare_batch")
        button = gr.Button("Prepare", variant="primary", elem_id="rocm_sd_prepare")
        result = gr.Textbox(label="Result", lines=6, interactive=False, elem_id="rocm_sd_prepare_result")
        button.click(prepare_loaded_model, inputs=[sizes, batch], outputs=[result])
    return [(tab, "rocm_sd", "rocm_sd_tab")]


if UNAVAILABLE is None:
    script_callbacks.on_ui_tabs(on_ui_tabs)
