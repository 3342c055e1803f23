"""comfy.model_patcher.ModelPatcher: the parts behind a MODEL socket that nodes use."""
import copy

import torch

import comfy.utils
from comfy.patcher_extension import CallbacksMP


def set_model_options_patch_replace(model_options, patch, name, block_name, number, transformer_index=None):
    to = model_options["transformer_options"].copy()
    patches_replace = to.get("patches_replace", {}).copy()
    replaces = patches_replace.get(name, {}).copy()
    key = (block_name, number) if transformer_index is None else (block_name, number, transformer_index)
    replaces[key] = patch
    patches_replace[name] = replaces
    to["patches_replace"] = patches_replace
    model_options["transformer_options"] = to
    return model_options


class ModelPatcher:
    def __init__(self, model, load_device=torch.device("cpu"), offload_device=torch.device("cpu")):
        self.model = model
        self.load_device, self.offload_device = load_device, offload_device
        self.model_options = {"transformer_options": {}}
        self.object_patches = {}
        self.object_patches_backup = {}
        self.callbacks = {}
        self.parent = None

    def clone(self):
        n = self.__class__(self.model, self.load_device, self.offload_device)
        n.object_patches = self.object_patches.copy()
        n.model_options = copy.deepcopy(self.model_options)
        n.object_patches_backup = self.object_patches_backup
        n.callbacks = {k: {key: fns.copy() for key, fns in c.items()} for k, c in self.callbacks.items()}
        n.parent = self
        return n

    def add_object_patch(self, name, obj):
        self.object_patches[name] = obj

    def get_model_object(self, name):
        if name in self.object_patches:
            return self.object_patches[name]
        if name in self.object_patches_backup:
            return self.object_patches_backup[name]
        return comfy.utils.get_attr(self.model, name)

    def set_model_unet_function_wrapper(self, unet_wrapper_function):
        self.model_options["model_function_wrapper"] = unet_wrapper_function

    def add_callback(self, call_type, callback):
        self.callbacks.setdefault(call_type, {}).setdefault(None, []).append(callback)

    def get_all_callbacks(self, call_type):
        return [fn for fns in self.callbacks.get(call_type, {}).values() for fn in fns]

    def set_model_patch_replace(self, patch, name, block_name, number, transformer_index=None):
        self.model_options = set_model_options_patch_replace(self.model_options, patch, name, block_name, number,
                                                             transformer_index)

    def set_model_attn1_replace(self, patch, block_name, number, transformer_index=None):
        self.set_model_patch_replace(patch, "attn1", block_name, number, transformer_index)

    def set_model_attn2_replace(self, patch, block_name, number, transformer_index=None):
        self.set_model_patch_replace(patch, "attn2", block_name, number, transformer_index)

    def patch_model(self, device_to=None):
        for k in self.object_patches:
            old = comfy.utils.set_attr(self.model, k, self.object_patches[k])
            if k not in self.object_patches_backup:
                self.object_patches_backup[k] = old
        return self.model

    def unpatch_model(self, device_to=None):
        for k in list(self.object_patches_backup.keys()):
            comfy.utils.set_attr(self.model, k, self.object_patches_backup[k])
        self.object_patches_backup.clear()

    def detach(self, unpatch_all=True):
        """ComfyUI's detach (a model unloaded): unpatch, then the ON_DETACH callbacks."""
        if unpatch_all:
            self.unpatch_model(self.offload_device)
        for callback in self.get_all_callbacks(CallbacksMP.ON_DETACH):
            callback(self, unpatch_all)
        return self.model
