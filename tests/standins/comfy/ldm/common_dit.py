"""comfy.ldm.common_dit.rms_norm (comfy/rmsnorm.py): torch's rms_norm, the weight cast to the input as ComfyUI's
cast_to does."""
import torch


def rms_norm(x, weight=None, eps=1e-6):
    if weight is None:
        return torch.nn.functional.rms_norm(x, (x.shape[-1],), eps=eps)
    return torch.nn.functional.rms_norm(x, weight.shape, weight=weight.to(dtype=x.dtype, device=x.device), eps=eps)
