"""comfy.model_base.BaseModel reduced to what the node walks: `diffusion_model` and apply_model."""
from torch import nn

from comfy.ldm.modules.diffusionmodules.openaimodel import UNetModel


class BaseModel(nn.Module):
    def __init__(self, **unet_kwargs):
        super().__init__()
        self.diffusion_model = UNetModel(**unet_kwargs)

    def apply_model(self, x, t, c_crossattn=None, transformer_options={}):
        return self.diffusion_model(x, t, context=c_crossattn, transformer_options=transformer_options)
