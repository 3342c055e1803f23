"""rocm_sd for AUTOMATIC1111: a "rocm_sd" tab whose Prepare button runs `rocm_sd.prepare` for the loaded model
(`python -m rocm_sd prepare`): every convolution and GEMM problem the model issues at the sizes given, once, so that
MIOpen's first-run search (find, minutes per new size on ROCm) and TunableOp are done before the first image and
kept for later launches (on NVIDIA, cuDNN's benchmark mode for this process). The problems are the webui's model's:
its architecture (read from the loaded checkpoint), dtype and device, and rocm_sd's checkboxes while "rocm_sd" is the
cross attention optimization (the webui's own model otherwise). The webui's model waits on the CPU meanwhile (its
memory for prepare's random-weight copy), and generation waits for the button (the webui's queue lock), as it does
for any other job.
"""
import argparse

from modules import script_callbacks, sd_models, shared

try:
    from rocm_sd import checkpoints, cli_args, prepare
    from rocm_sd.patch.a1111 import FEATURES, prepare_flags
    UNAVAILABLE = None
except ImportError as exc:  # the main script says so once; without rocm_sd there is no tab
    UNAVAILABLE = f"rocm_sd is not importable ({exc})"

SIZES_HINT = "WIDTHxHEIGHT, comma-separated, e.g. 1024x1024,832x1216 (empty: the model's own size)"


def _features():
    """The checkboxes' features while "rocm_sd" is the webui's optimization; None (the webui's own model) else."""
    from modules import sd_hijack

    if getattr(sd_hijack.current_optimizer, "name", None) != "rocm_sd":
        return None
    return {feature: bool(getattr(shared.opts, f"rocm_sd_{feature}", True)) for feature in FEATURES + ("attention",)}


def _webui_dtype(device):
    """The UNet's compute dtype on a GPU (prepare's default, float32, on a CPU)."""
    import torch

    from modules import devices

    dtype = getattr(devices, "dtype_unet", None)
    return dtype if device.type == "cuda" and dtype in (torch.float16, torch.bfloat16, torch.float32) else None


def _arguments(sd_model, sizes_text: str, batch):
    """(architecture, sizes or None, batch) for prepare.run; ValueError saying what is wrong with them."""
    info = getattr(sd_model, "sd_checkpoint_info", None)
    if info is None:
        raise ValueError("no model is loaded (pick a checkpoint first)")
    arch = checkpoints.architecture_of(info.filename)
    try:
        sizes = cli_args.image_sizes(sizes_text) if (sizes_text or "").strip() else None
    except argparse.ArgumentTypeError as error:
        raise ValueError(f"image sizes: {error}") from None
    try:
        batch = cli_args.positive_int("1" if batch is None else str(batch).removesuffix(".0"))
    except argparse.ArgumentTypeError as error:
        raise ValueError(f"batch size: {error}") from None
    return arch, sizes, batch


def prepare_loaded_model(sizes_text: str, batch) -> str:
    """The Prepare button: rocm_sd.prepare for the loaded model at `sizes_text`, `batch` images per call. Returns
    what it did (prepare's own lines) or why it did nothing, for the tab's result box; never raises."""
    if UNAVAILABLE:
        return f"nothing prepared: {UNAVAILABLE}"
    sd_model = getattr(sd_models.model_data, "sd_model", None)  # not shared.sd_model: that would load one
    try:
        arch, sizes, batch = _arguments(sd_model, sizes_text, batch)
    except (ValueError, OSError) as error:  # OSError: the checkpoint file is gone or unreadable
        return f"nothing prepared: {error}"
    from modules import devices
    from modules.call_queue import queue_lock

    device = devices.device
    with queue_lock:  # not while an image is generated
        sd_models.send_model_to_cpu(sd_model)
        try:
            result = prepare.run(arch, sizes, batch=batch, dtype=_webui_dtype(device), device=device,
                                 **prepare_flags(_features()))
        except Exception as error:  # noqa: BLE001 - a failed warm-up must not take the webui down
            return f"prepare stopped ({type(error).__name__}: {error}); the first image will search as usual"
        finally:
            sd_models.send_model_to_device(sd_model)
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
