"""comfy.model_base.BaseModel reduced to what the node walks: `diffusion_model` and apply_model."""
from torch import nn

from comfy.ldm.modules.diffusionmodules.openaimodel import UNetModel


class BaseModel(nn.Module):
    def __init__(self, unet_model=UNetModel, **unet_kwargs):
        super().__init__()
        self.diffusion_model = unet_model(**unet_kwargs)

    def apply_model(self, x, t, c_crossattn=None, control=None, transformer_options={}, **kwargs):
        # ComfyUI's sampler hands the conditioning over on the CPU; apply_model casts it (cast_to_device)
        context = None if c_crossattn is None else c_crossattn.to(x.device, x.dtype)
        return self.diffusion_model(x, t, context=context, control=control, transformer_options=transformer_options,
                                    **kwargs)
