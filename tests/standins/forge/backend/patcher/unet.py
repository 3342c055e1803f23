"""backend/patcher/unet.py as at dfdcbab6: UnetPatcher, the ModelPatcher of the diffusion model (forge_objects.unet),
around a KModel."""
import copy

from backend.modules.k_model import KModel
from backend.patcher.base import ModelPatcher


class UnetPatcher(ModelPatcher):
    @classmethod
    def from_model(cls, model, diffusers_scheduler=None, config=None, k_predictor=None):
        model = KModel(model=model, k_predictor=k_predictor, config=config)
        return UnetPatcher(model, load_device=model.diffusion_model.load_device,
                           offload_device=model.diffusion_model.offload_device,
                           current_device=model.diffusion_model.initial_device)

    def clone(self):
        n = UnetPatcher(self.model, self.load_device, self.offload_device, self.size, self.current_device)
        n.lora_patches = self.lora_patches.copy()
        n.object_patches = self.object_patches.copy()
        n.model_options = copy.deepcopy(self.model_options)
        return n


def load_model(patcher):
    """What memory_management.LoadedModel.model_load does to the patcher, all on one device: object patches on, then
    the LoRA patches merged (or hung on the layers, online)."""
    model = patcher.forge_patch_model()
    patcher.refresh_loras()
    return model
