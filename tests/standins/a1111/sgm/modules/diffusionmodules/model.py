"""sgm.modules.diffusionmodules.model.AttnBlock (stand-in): a class of its own, with ldm's layout."""
from torch import nn

from ldm.modules.diffusionmodules.model import AttnBlock as _LdmAttnBlock

AttnBlock = type("AttnBlock", (nn.Module,), {
    name: value for name, value in vars(_LdmAttnBlock).items() if name in ("__init__", "forward")})
