"""ONNX Runtime as a `rocm_sd bench` engine: the pipeline's UNet exported by torch.onnx and run by an ONNX Runtime
session, the way ORT-based Stable Diffusion stacks (Olive, Optimum, SHARK-era MIGraphX demos) run it.

`OrtUNet` stands in for the pipeline's UNet: it exports the UNet on its first call at that call's shapes (static
shapes, as ORT's GPU providers want them), re-exports on new shapes, and hands everything else (config, dtype,
device) to the original module. Calls it cannot express as the exported graph (ControlNet residuals, attention
masks, LoRA scales through cross_attention_kwargs, timestep_cond, class labels) run the original UNet instead.
The VAE and text encoders stay in PyTorch: the UNet is >95% of a generation.

Execution providers, first available wins: MIGraphX, then ROCm (AMD), then CUDA (NVIDIA); on a CPU-only torch the
CPU provider (what CI tests). A GPU run without any of them is refused with the reason: ORT's CPU provider would
only measure a host copy of every step.

Not yet measured on a GPU: no onnxruntime build with a GPU provider could be installed on the lent machine (no
network there), so bench/results holds no ORT rows. The export and the session are tested on CPU.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import warnings

import numpy as np
import torch

GPU_PROVIDERS = ("MIGraphXExecutionProvider", "ROCMExecutionProvider", "CUDAExecutionProvider")
_TORCH_TO_NUMPY = {torch.float16: np.float16, torch.float32: np.float32, torch.bfloat16: None}


def providers_for(device: torch.device) -> tuple[list[str] | None, str | None]:
    """(providers to create sessions with, None) or (None, why the engine cannot run on `device`)."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None, "onnxruntime is not installed (pip install onnxruntime-rocm / onnxruntime-migraphx / onnxruntime-gpu)"
    try:
        import onnxscript  # noqa: F401  torch.onnx's exporter
    except ImportError:
        return None, "onnxscript, which torch.onnx.export needs, is not installed (pip install onnxscript)"
    available = ort.get_available_providers()
    if device.type == "cpu":
        return ["CPUExecutionProvider"], None
    gpu = [p for p in GPU_PROVIDERS if p in available]
    if not gpu:
        return None, (f"onnxruntime {ort.__version__} has no GPU execution provider (it has {', '.join(available)}); "
                      "install onnxruntime-rocm or onnxruntime-migraphx (AMD) or onnxruntime-gpu (NVIDIA)")
    return [gpu[0], "CPUExecutionProvider"], None


class _UNetGraph(torch.nn.Module):
    """The UNet with plain tensor inputs and one output: what gets exported."""

    def __init__(self, unet: torch.nn.Module, sdxl: bool):
        super().__init__()
        self.unet, self.sdxl = unet, sdxl

    def forward(self, sample, timestep, encoder_hidden_states, text_embeds=None, time_ids=None):
        added = {"text_embeds": text_embeds, "time_ids": time_ids} if self.sdxl else None
        return self.unet(sample, timestep, encoder_hidden_states, added_cond_kwargs=added, return_dict=False)[0]


class OrtUNet(torch.nn.Module):
    """A UNet2DConditionModel run by ONNX Runtime (see the module docstring). `close()` deletes the exported files."""

    def __init__(self, unet: torch.nn.Module, providers: list[str]):
        super().__init__()
        self._orig_mod = unet  # a submodule: .to(), .config, .dtype keep working through __getattr__
        self._providers = providers
        self._dir = tempfile.mkdtemp(prefix="rocm_sd_onnx_")
        self._sessions: dict[tuple, object] = {}
        self.calls = {"onnxruntime": 0, "pytorch": 0}

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "_orig_mod":  # asked before __init__ set it
                raise
            return getattr(self._orig_mod, name)

    def close(self) -> None:
        self._sessions.clear()
        shutil.rmtree(self._dir, ignore_errors=True)

    def _inputs(self, sample, timestep, encoder_hidden_states, added_cond_kwargs) -> dict[str, torch.Tensor]:
        batch = sample.shape[0]
        t = torch.as_tensor(timestep, device=sample.device).float().reshape(-1).expand(batch).contiguous()
        inputs = {"sample": sample.contiguous(), "timestep": t, "encoder_hidden_states": encoder_hidden_states.contiguous()}
        if added_cond_kwargs is not None:
            inputs["text_embeds"] = added_cond_kwargs["text_embeds"].contiguous()
            inputs["time_ids"] = added_cond_kwargs["time_ids"].contiguous()
        return inputs

    def _session(self, inputs: dict[str, torch.Tensor]):
        key = tuple((name, tuple(t.shape), t.dtype) for name, t in inputs.items())
        if key not in self._sessions:
            import onnxruntime as ort

            path = os.path.join(self._dir, f"unet_{len(self._sessions)}.onnx")
            graph = _UNetGraph(self._orig_mod, sdxl="text_embeds" in inputs)
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the exporter's notes on unsupported torchvision ops and the like
                torch.onnx.export(graph, tuple(inputs.values()), path, input_names=list(inputs), output_names=["out"],
                                  dynamo=True, external_data=True, verbose=False)
            options = ort.SessionOptions()
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            options.log_severity_level = 3
            self._sessions[key] = ort.InferenceSession(path, options, providers=self._providers)
        return self._sessions[key]

    def forward(self, sample, timestep, encoder_hidden_states, class_labels=None, timestep_cond=None,
                attention_mask=None, cross_attention_kwargs=None, added_cond_kwargs=None,
                down_block_additional_residuals=None, mid_block_additional_residual=None,
                down_intrablock_additional_residuals=None, encoder_attention_mask=None, return_dict=True):
        from diffusers.models.unets.unet_2d_condition import UNet2DConditionOutput

        unsupported = (class_labels, timestep_cond, attention_mask, cross_attention_kwargs,
                       down_block_additional_residuals, mid_block_additional_residual,
                       down_intrablock_additional_residuals, encoder_attention_mask)
        if any(a is not None for a in unsupported) or _TORCH_TO_NUMPY.get(sample.dtype) is None:
            self.calls["pytorch"] += 1
            return self._orig_mod(sample, timestep, encoder_hidden_states, class_labels=class_labels,
                                  timestep_cond=timestep_cond, attention_mask=attention_mask,
                                  cross_attention_kwargs=cross_attention_kwargs, added_cond_kwargs=added_cond_kwargs,
                                  down_block_additional_residuals=down_block_additional_residuals,
                                  mid_block_additional_residual=mid_block_additional_residual,
                                  down_intrablock_additional_residuals=down_intrablock_additional_residuals,
                                  encoder_attention_mask=encoder_attention_mask, return_dict=return_dict)
        self.calls["onnxruntime"] += 1
        inputs = self._inputs(sample, timestep, encoder_hidden_states, added_cond_kwargs)
        session = self._session(inputs)
        out = torch.empty_like(inputs["sample"])
        # I/O binding on the tensors' own memory: no host round trip on a GPU provider.
        binding = session.io_binding()
        device_type = "cpu" if sample.device.type == "cpu" else "cuda"
        device_id = sample.device.index or 0
        for name, t in inputs.items():
            binding.bind_input(name, device_type, device_id, _TORCH_TO_NUMPY[t.dtype], list(t.shape), t.data_ptr())
        binding.bind_output("out", device_type, device_id, _TORCH_TO_NUMPY[out.dtype], list(out.shape), out.data_ptr())
        if sample.device.type == "cuda":
            torch.cuda.current_stream(sample.device).synchronize()  # ORT runs on its own stream
        session.run_with_iobinding(binding)
        return UNet2DConditionOutput(sample=out) if return_dict else (out,)
