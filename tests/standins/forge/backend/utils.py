"""backend/utils.py as at dfdcbab6: the attribute walkers ModelPatcher and the LoRA loader use, tensor2parameter and
fp16_fix (Flux's fp16 clamp)."""
import torch


def set_attr_raw(obj, attr, value):
    *parents, last = attr.split(".")
    for name in parents:
        obj = getattr(obj, name)
    setattr(obj, last, value)


def get_attr(obj, attr):
    for name in attr.split("."):
        obj = getattr(obj, name)
    return obj


def get_attr_with_parent(obj, attr):
    parent, name = obj, None
    for name in attr.split("."):
        parent, obj = obj, getattr(obj, name)
    return parent, name, obj


def tensor2parameter(x):
    return x if isinstance(x, torch.nn.Parameter) else torch.nn.Parameter(x, requires_grad=False)


def fp16_fix(x):
    # Forge issue 1114: clamp fp16 streams (ComfyUI's port uses nan_to_num to +-65504 instead)
    if x.dtype in [torch.float16]:
        return x.clip(-32768.0, 32768.0)
    return x
