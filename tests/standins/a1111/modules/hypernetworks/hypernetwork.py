"""modules.hypernetworks.hypernetwork (stand-in): hypernetworks transform the context of keys and values,
and the webui's plain (unoptimized) CrossAttention forward."""
import torch


def apply_single_hypernetwork(hypernetwork, context_k, context_v):
    """A hypernetwork holds (k module, v module) per context width; other widths pass unchanged."""
    layers = hypernetwork.get(context_k.shape[2])
    if layers is None:
        return context_k, context_v
    return layers[0](context_k), layers[1](context_v)


def apply_hypernetworks(hypernetworks, context):
    context_k = context_v = context
    for hypernetwork in hypernetworks:
        context_k, context_v = apply_single_hypernetwork(hypernetwork, context_k, context_v)
    return context_k, context_v


def attention_CrossAttention_forward(self, x, context=None, mask=None, **kwargs):
    from modules import shared

    h = self.heads
    q = self.to_q(x)
    context = x if context is None else context
    context_k, context_v = apply_hypernetworks(shared.loaded_hypernetworks, context)
    k, v = self.to_k(context_k), self.to_v(context_v)
    q, k, v = (t.view(t.shape[0], -1, h, t.shape[-1] // h).transpose(1, 2) for t in (q, k, v))
    sim = torch.einsum("bhid,bhjd->bhij", q, k) * self.scale
    out = torch.einsum("bhij,bhjd->bhid", sim.softmax(dim=-1), v)
    return self.to_out(out.transpose(1, 2).reshape(x.shape[0], -1, h * q.shape[-1]))
