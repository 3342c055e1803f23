"""backend/patcher/lora.py as at dfdcbab6, for "diff" patches (a LoRA's merged difference; Forge's other patch types
only compute that difference otherwise): merge_lora_to_weight, and LoraLoader.refresh, which Forge runs when it
loads the model (memory_management.LoadedModel.model_load, after forge_patch_model): it restores the weights it
backed up, then sets a new Parameter, merged, at each patched key through the model's attribute paths (offline),
or hangs the patches on the layer as forge_online_loras (online mode), which Forge's Linear merges per call."""
import torch

from backend import utils


def merge_lora_to_weight(patches, weight, key="online_lora", computation_dtype=torch.float32):
    backup_dtype = None
    if computation_dtype == weight.dtype:
        weight = weight.clone()
    else:
        backup_dtype, weight = weight.dtype, weight.to(dtype=computation_dtype)
    for strength, v, strength_model, offset, function in patches:
        assert offset is None and function is None and len(v) == 1, "the stand-in merges plain diffs only"
        if strength_model != 1.0:
            weight *= strength_model
        weight += strength * v[0].to(weight.device, weight.dtype)
    return weight if backup_dtype is None else weight.to(dtype=backup_dtype)


class LoraLoader:
    def __init__(self, model):
        self.model = model
        self.backup = {}
        self.online_backup = []
        self.loaded_hash = str([])

    @torch.inference_mode()
    def refresh(self, lora_patches, offload_device=torch.device("cpu"), force_refresh=False):
        hashes = str(list(lora_patches.keys()))
        if hashes == self.loaded_hash and not force_refresh:
            return
        all_patches = {}
        for (_, _, _, online_mode), patches in lora_patches.items():
            for key, current in patches.items():
                all_patches[(key, online_mode)] = all_patches.get((key, online_mode), []) + current
        for m in set(self.online_backup):
            del m.forge_online_loras
        self.online_backup = []
        for k, w in self.backup.items():
            utils.set_attr_raw(self.model, k, w if isinstance(w, torch.nn.Parameter) else
                               torch.nn.Parameter(w, requires_grad=False))
        self.backup = {}
        for (key, online_mode), current in all_patches.items():
            parent, child, weight = utils.get_attr_with_parent(self.model, key)
            assert isinstance(weight, torch.nn.Parameter)
            if online_mode:
                if not hasattr(parent, "forge_online_loras"):
                    parent.forge_online_loras = {}
                parent.forge_online_loras[child] = current
                self.online_backup.append(parent)
                continue
            if key not in self.backup:
                self.backup[key] = weight.to(device=offload_device)
            merged = merge_lora_to_weight(current, weight, key, computation_dtype=torch.float32)
            utils.set_attr_raw(self.model, key, torch.nn.Parameter(merged, requires_grad=False))
        self.loaded_hash = hashes
