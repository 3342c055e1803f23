"""comfy/model_sampling.py's flow-matching sampling (SD3 / SD3.5: ModelSamplingDiscreteFlow, shift 3.0 from
supported_models.SD3's sampling_settings), as at a125cd84. The sampler's schedule comes from its `sigmas` buffer
(sigma_min / sigma_max), a buffer of the BaseModel like the diffusion model's own."""
import torch


def time_snr_shift(alpha, t):
    if alpha == 1.0:
        return t
    return alpha * t / (1 + (alpha - 1) * t)


class ModelSamplingDiscreteFlow(torch.nn.Module):
    def __init__(self, shift=1.0, multiplier=1000):
        super().__init__()
        self.set_parameters(shift=shift, multiplier=multiplier)

    def set_parameters(self, shift=1.0, timesteps=1000, multiplier=1000):
        self.shift = shift
        self.multiplier = multiplier
        ts = self.sigma((torch.arange(1, timesteps + 1, 1) / timesteps) * multiplier)
        self.register_buffer('sigmas', ts)

    @property
    def sigma_min(self):
        return self.sigmas[0]

    @property
    def sigma_max(self):
        return self.sigmas[-1]

    def timestep(self, sigma):
        return sigma * self.multiplier

    def sigma(self, timestep):
        return time_snr_shift(self.shift, timestep / self.multiplier)
