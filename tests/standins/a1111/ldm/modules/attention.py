"""ldm.modules.attention.CrossAttention (stand-in; the webui replaces its forward)."""
from torch import nn


class CrossAttention(nn.Module):
    def __init__(self, query_dim, context_dim=None, heads=8, dim_head=64):
        nn.Module.__init__(self)  # not super(): sgm copies this __init__ into a class of its own
        inner = heads * dim_head
        self.heads, self.scale = heads, dim_head ** -0.5
        self.to_q = nn.Linear(query_dim, inner, bias=False)
        self.to_k = nn.Linear(context_dim or query_dim, inner, bias=False)
        self.to_v = nn.Linear(context_dim or query_dim, inner, bias=False)
        self.to_out = nn.Sequential(nn.Linear(inner, query_dim), nn.Dropout(0.0))

    def forward(self, x, context=None, mask=None):
        raise NotImplementedError("the webui always installs a forward (modules.sd_hijack_optimizations)")
