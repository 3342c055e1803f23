"""comfy.model_base.BaseModel reduced to what the node walks: `diffusion_model` and apply_model; `model_sampling`
(where a test gives one: comfy/model_sampling.py's), the sampler's schedule, a submodule beside the diffusion model as
in ComfyUI."""
from torch import nn

from comfy.ldm.modules.diffusionmodules.openaimodel import UNetModel


class BaseModel(nn.Module):
    def __init__(self, unet_model=UNetModel, model_sampling=None, **unet_kwargs):
        super().__init__()
        self.diffusion_model = unet_model(**unet_kwargs)
        if model_sampling is not None:
            self.model_sampling = model_sampling

    def apply_model(self, x, t, c_crossattn=None, control=None, transformer_options={}, **kwargs):
        # ComfyUI's sampler hands the conditioning over on the CPU; apply_model casts it (cast_to_device)
        context = None if c_crossattn is None else c_crossattn.to(x.device, x.dtype)
        return self.diffusion_model(x, t, context=context, control=control, transformer_options=transformer_options,
                                    **kwargs)
