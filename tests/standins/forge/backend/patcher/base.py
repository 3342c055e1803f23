"""backend/patcher/base.py as at dfdcbab6: Forge's own ModelPatcher (the API after ComfyUI's, implemented anew).
Object patches are set on the model by forge_patch_model (raw setattr along the dotted path, the module there kept
in object_patches_backup) and put back by forge_unpatch_model; LoRA patches are merged by the model's LoraLoader
(refresh_loras). clone() copies the patch dicts and deep-copies model_options; it does not share
object_patches_backup (ComfyUI's clones do)."""
import copy

from backend import utils
from backend.patcher.lora import LoraLoader


def set_model_options_patch_replace(model_options, patch, name, block_name, number, transformer_index=None):
    to = model_options["transformer_options"].copy()
    to["patches_replace"] = dict(to.get("patches_replace", {}))
    to["patches_replace"][name] = dict(to["patches_replace"].get(name, {}))
    block = (block_name, number, transformer_index) if transformer_index is not None else (block_name, number)
    to["patches_replace"][name][block] = patch
    model_options["transformer_options"] = to
    return model_options


class ModelPatcher:
    def __init__(self, model, load_device, offload_device, size=0, current_device=None, **kwargs):
        self.size = size
        self.model = model
        self.lora_patches = {}
        self.object_patches = {}
        self.object_patches_backup = {}
        self.model_options = {"transformer_options": {}}
        self.load_device = load_device
        self.offload_device = offload_device
        if not hasattr(model, "lora_loader"):
            model.lora_loader = LoraLoader(model)
        self.lora_loader = model.lora_loader
        self.current_device = offload_device if current_device is None else current_device

    def clone(self):
        n = ModelPatcher(self.model, self.load_device, self.offload_device, self.size, self.current_device)
        n.lora_patches = self.lora_patches.copy()
        n.object_patches = self.object_patches.copy()
        n.model_options = copy.deepcopy(self.model_options)
        return n

    def add_patches(self, *, filename, patches, strength_patch=1.0, strength_model=1.0, online_mode=False):
        identifier = (filename, strength_patch, strength_model, online_mode)
        keys = set(k for k, _ in self.model.named_parameters())
        this = {}
        for key in patches:
            if key in keys:
                this.setdefault(key, []).append([strength_patch, patches[key], strength_model, None, None])
        self.lora_patches[identifier] = this
        return set(this)

    def refresh_loras(self):
        self.lora_loader.refresh(lora_patches=self.lora_patches, offload_device=self.offload_device)

    def set_model_unet_function_wrapper(self, unet_wrapper_function):
        self.model_options["model_function_wrapper"] = unet_wrapper_function

    def set_model_patch_replace(self, patch, name, block_name, number, transformer_index=None):
        self.model_options = set_model_options_patch_replace(self.model_options, patch, name, block_name, number,
                                                             transformer_index)

    def set_model_attn1_replace(self, patch, block_name, number, transformer_index=None):
        self.set_model_patch_replace(patch, "attn1", block_name, number, transformer_index)

    def set_model_attn2_replace(self, patch, block_name, number, transformer_index=None):
        self.set_model_patch_replace(patch, "attn2", block_name, number, transformer_index)

    def add_object_patch(self, name, obj):
        self.object_patches[name] = obj

    def get_model_object(self, name):
        if name in self.object_patches:
            return self.object_patches[name]
        if name in self.object_patches_backup:
            return self.object_patches_backup[name]
        return utils.get_attr(self.model, name)

    def forge_patch_model(self, target_device=None):
        for k, item in self.object_patches.items():
            old = utils.get_attr(self.model, k)
            if k not in self.object_patches_backup:
                self.object_patches_backup[k] = old
            utils.set_attr_raw(self.model, k, item)
        if target_device is not None:
            self.model.to(target_device)
            self.current_device = target_device
        return self.model

    def forge_unpatch_model(self, target_device=None):
        if target_device is not None:
            self.model.to(target_device)
            self.current_device = target_device
        for k in list(self.object_patches_backup):
            utils.set_attr_raw(self.model, k, self.object_patches_backup[k])
        self.object_patches_backup = {}
