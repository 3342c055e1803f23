"""backend/modules/k_model.py as at dfdcbab6: KModel, the diffusion model (`diffusion_model`) behind Forge's
UnetPatcher. apply_model's prediction scaling is left out (PredictionFlux: the identity on the input, x - sigma *
output for the denoised): the stand-in's apply_model returns the model's output, cast and called as Forge's."""
import torch


class KModel(torch.nn.Module):
    def __init__(self, model, diffusers_scheduler=None, k_predictor=None, config=None):
        super().__init__()
        self.config = config
        self.storage_dtype = model.storage_dtype
        self.computation_dtype = model.computation_dtype
        self.diffusion_model = model
        self.predictor = k_predictor

    def apply_model(self, x, t, c_concat=None, c_crossattn=None, control=None, transformer_options={}, **kwargs):
        dtype = self.computation_dtype
        extra = {k: v.to(dtype) if hasattr(v, "dtype") and v.dtype not in (torch.int, torch.long) else v
                 for k, v in kwargs.items()}
        return self.diffusion_model(x.to(dtype), t.float(), context=c_crossattn.to(dtype), control=control,
                                    transformer_options=transformer_options, **extra).float()
