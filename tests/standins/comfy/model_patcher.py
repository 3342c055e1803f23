"""comfy.model_patcher.ModelPatcher: the parts behind a MODEL socket that nodes use, and ComfyUI's weight patching
(LoRA: add_patches, then a new Parameter set through each patched key's path when the model loads, the original kept in
`backup`, shared by all clones) with its load bookkeeping, as comfy/model_patcher.py at a125cd84 has them (full loads
only: no low-VRAM streaming, no hooks, no injections)."""
import copy
import uuid

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
        self.patches, self.backup, self.patches_uuid = {}, {}, uuid.uuid4()
        for name, value in (("model_loaded_weight_memory", 0), ("model_lowvram", False),
                            ("current_weight_patches_uuid", None)):
            if not hasattr(model, name):
                setattr(model, name, value)

    def clone(self):
        n = self.__class__(self.model, self.load_device, self.offload_device)
        n.patches = {k: v[:] for k, v in self.patches.items()}
        n.patches_uuid, n.backup = self.patches_uuid, self.backup
        n.object_patches = self.object_patches.copy()
        n.model_options = copy.deepcopy(self.model_options)
        n.object_patches_backup = self.object_patches_backup
        n.callbacks = {k: {key: fns.copy() for key, fns in c.items()} for k, c in self.callbacks.items()}
        n.parent = self
        return n

    def is_clone(self, other):
        return hasattr(other, "model") and self.model is other.model

    def add_patches(self, patches, strength_patch=1.0, strength_model=1.0):
        """{key: (diff,)}: the weight at `key` becomes weight * strength_model + strength_patch * diff."""
        keys = self.model.state_dict().keys()
        for key, patch in patches.items():
            if key in keys:
                self.patches.setdefault(key, []).append((strength_patch, patch, strength_model))
        self.patches_uuid = uuid.uuid4()
        return [k for k in patches if k in keys]

    def patch_weight_to_device(self, key, device_to=None):
        if key not in self.patches:
            return
        weight = comfy.utils.get_attr(self.model, key)
        if key not in self.backup:
            self.backup[key] = weight.to(device=self.offload_device, copy=False)
        out = weight.to(torch.float32, copy=True)
        for strength, (diff,), strength_model in self.patches[key]:
            out = out * strength_model + strength * diff.to(out)
        comfy.utils.set_attr(self.model, key, torch.nn.Parameter(out.to(weight.dtype), requires_grad=False))

    def load(self, device_to=None):
        for name, module in self.model.named_modules():
            params = [n for n, _ in module.named_parameters(recurse=False)]
            if not params or getattr(module, "comfy_patched_weights", False):
                continue
            for param in params:
                self.patch_weight_to_device(f"{name}.{param}", device_to)
            module.comfy_patched_weights = True
        self.model.model_loaded_weight_memory = 1
        self.model.current_weight_patches_uuid = self.patches_uuid
        for callback in self.get_all_callbacks(CallbacksMP.ON_LOAD):
            callback(self, device_to, 0, False, True)

    def partially_load(self, device_to, extra_memory=0):
        """What load_models_gpu calls: the weights unpatched only when another clone's patches are in them."""
        current = self.model.current_weight_patches_uuid
        self.unpatch_model(self.offload_device, unpatch_weights=current is not None and current != self.patches_uuid)
        self.patch_model(load_weights=False)
        if self.model.model_loaded_weight_memory > 0:
            return 0
        self.load(device_to)
        return 0

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

    def patch_model(self, device_to=None, load_weights=True):
        for k in self.object_patches:
            old = comfy.utils.set_attr(self.model, k, self.object_patches[k])
            if k not in self.object_patches_backup:
                self.object_patches_backup[k] = old
        if load_weights:
            self.load(device_to)
        return self.model

    def unpatch_model(self, device_to=None, unpatch_weights=True):
        if unpatch_weights:
            for k, weight in self.backup.items():
                comfy.utils.set_attr(self.model, k, torch.nn.Parameter(weight, requires_grad=False))
            self.backup.clear()
            self.model.current_weight_patches_uuid = None
            self.model.model_loaded_weight_memory = 0
            for m in self.model.modules():
                if hasattr(m, "comfy_patched_weights"):
                    del m.comfy_patched_weights
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
