"""comfy.sd.VAE reduced to what a VAE node touches: first_stage_model and its ModelPatcher."""
import comfy.model_patcher
from comfy.ldm.modules.diffusionmodules.model import Decoder
from torch import nn


class AutoencoderStandIn(nn.Module):
    def __init__(self):
        super().__init__()
        self.decoder = Decoder()

    def decode(self, z):
        return self.decoder(z)


class VAE:
    def __init__(self):
        self.first_stage_model = AutoencoderStandIn().eval()
        self.patcher = comfy.model_patcher.ModelPatcher(self.first_stage_model)

    def decode(self, samples):
        self.patcher.patch_model()  # ComfyUI: model_management.load_models_gpu([self.patcher])
        try:
            return self.first_stage_model.decode(samples)
        finally:
            self.patcher.unpatch_model()
