"""sgm.modules.attention.CrossAttention (stand-in): a class of its own, as in the webui (SDXL), with ldm's
layout; the webui patches its forward separately."""
from torch import nn

from ldm.modules.attention import CrossAttention as _LdmCrossAttention

CrossAttention = type("CrossAttention", (nn.Module,), {
    name: value for name, value in vars(_LdmCrossAttention).items() if name in ("__init__", "forward")})
