"""ldm.modules.diffusionmodules.model.AttnBlock (stand-in): the VAE's single-head attention block."""
from torch import nn


class AttnBlock(nn.Module):
    def __init__(self, in_channels):
        nn.Module.__init__(self)  # not super(): sgm copies this __init__ into a class of its own
        self.norm = nn.GroupNorm(8, in_channels, eps=1e-6)
        self.q, self.k, self.v, self.proj_out = (nn.Conv2d(in_channels, in_channels, 1) for _ in range(4))

    def forward(self, x):
        raise NotImplementedError("the webui always installs a forward (modules.sd_hijack_optimizations)")
