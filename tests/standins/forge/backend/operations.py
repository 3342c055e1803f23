"""backend/operations.py as at dfdcbab6, the parts Flux's blocks meet: Forge builds its diffusion models inside
using_forge_operations, which puts ForgeOperations' classes in torch.nn for the time. Its Linear is a plain
nn.Module (not an nn.Linear) whose forward computes its weight per call: cast to the input's dtype and device when
parameters_manual_cast (a storage dtype other than the computation dtype, and the modules Forge's memory management
offloads to the CPU), times scale_weight (fp8 scaled checkpoints), merged with online LoRA (forge_online_loras). Its
LayerNorm subclasses nn.LayerNorm. The stand-in's Linear makes its Parameters at construction (Forge's makes them
from the state dict it loads); the CUDA stream handling of weights_manual_cast is left out."""
import contextlib

import torch

from backend.patcher.lora import merge_lora_to_weight

current_device = None
current_dtype = None
current_manual_cast_enabled = False


def get_weight_and_bias(layer, weight_args=None, bias_args=None):
    scale_weight = getattr(layer, "scale_weight", None)
    patches = getattr(layer, "forge_online_loras", None)
    weight_patches = patches.get("weight", None) if patches is not None else None
    bias_patches = patches.get("bias", None) if patches is not None else None
    weight = layer.weight
    if weight is not None:
        if weight_args is not None:
            weight = weight.to(**weight_args)
        if scale_weight is not None:
            weight = weight * scale_weight.to(device=weight.device, dtype=weight.dtype)
        if weight_patches is not None:
            weight = merge_lora_to_weight(weight_patches, weight, "online weight lora", weight.dtype)
    bias = layer.bias
    if bias is not None:
        if bias_args is not None:
            bias = bias.to(**bias_args)
        if bias_patches is not None:
            bias = merge_lora_to_weight(bias_patches, bias, "online bias lora", bias.dtype)
    return weight, bias


def weights_manual_cast(layer, x):
    args = dict(device=x.device, dtype=x.dtype)
    weight, bias = get_weight_and_bias(layer, args, args)
    return weight, bias, None


class ForgeOperations:
    class Linear(torch.nn.Module):
        def __init__(self, in_features, out_features, bias=True, *args, **kwargs):
            super().__init__()
            self.in_features, self.out_features = in_features, out_features
            kw = dict(device=current_device, dtype=current_dtype)
            self.weight = torch.nn.Parameter(torch.empty(out_features, in_features, **kw))
            self.scale_weight = None
            self.bias = torch.nn.Parameter(torch.empty(out_features, **kw)) if bias else None
            self.parameters_manual_cast = current_manual_cast_enabled

        def forward(self, x):
            if self.parameters_manual_cast:
                weight, bias, _ = weights_manual_cast(self, x)
            else:
                weight, bias = get_weight_and_bias(self)
            return torch.nn.functional.linear(x, weight, bias)

    class LayerNorm(torch.nn.LayerNorm):
        def __init__(self, *args, **kwargs):
            kwargs["device"], kwargs["dtype"] = current_device, current_dtype
            super().__init__(*args, **kwargs)
            self.parameters_manual_cast = current_manual_cast_enabled

        def forward(self, x):
            if self.parameters_manual_cast:
                weight, bias, _ = weights_manual_cast(self, x)
                return torch.nn.functional.layer_norm(x, self.normalized_shape, weight, bias, self.eps)
            return super().forward(x)


@contextlib.contextmanager
def using_forge_operations(operations=None, device=None, dtype=None, manual_cast_enabled=False, bnb_dtype=None):
    global current_device, current_dtype, current_manual_cast_enabled
    current_device, current_dtype, current_manual_cast_enabled = device, dtype, manual_cast_enabled
    operations = operations or ForgeOperations
    names = ["Linear", "LayerNorm"]
    backups = {name: getattr(torch.nn, name) for name in names}
    try:
        for name in names:
            setattr(torch.nn, name, getattr(operations, name))
        yield
    finally:
        for name in names:
            setattr(torch.nn, name, backups[name])
