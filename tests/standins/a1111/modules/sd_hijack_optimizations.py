"""modules.sd_hijack_optimizations (stand-in): SdOptimization and the webui's own SDP forwards, as in
AUTOMATIC1111 1.10 (the rocm_sd forwards must compute what these compute)."""
import torch
import torch.nn.functional as F

import ldm.modules.attention
import ldm.modules.diffusionmodules.model
import sgm.modules.attention
import sgm.modules.diffusionmodules.model
from modules import shared
from modules.hypernetworks import hypernetwork


def scaled_dot_product_attention_forward(self, x, context=None, mask=None, **kwargs):
    batch_size, sequence_length, inner_dim = x.shape
    h = self.heads
    q_in = self.to_q(x)
    context = x if context is None else context
    context_k, context_v = hypernetwork.apply_hypernetworks(shared.loaded_hypernetworks, context)
    k_in, v_in = self.to_k(context_k), self.to_v(context_v)
    head_dim = q_in.shape[-1] // h
    q, k, v = (t.view(batch_size, -1, h, head_dim).transpose(1, 2) for t in (q_in, k_in, v_in))
    dtype = q.dtype
    if shared.opts.upcast_attn:
        q, k, v = q.float(), k.float(), v.float()
    hidden_states = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, is_causal=False)
    hidden_states = hidden_states.transpose(1, 2).reshape(batch_size, -1, h * head_dim).to(dtype)
    return self.to_out[1](self.to_out[0](hidden_states))


def sdp_attnblock_forward(self, x):
    h_ = self.norm(x)
    q, k, v = self.q(h_), self.k(h_), self.v(h_)
    b, c, h, w = q.shape
    q, k, v = (t.reshape(b, c, h * w).transpose(1, 2).contiguous() for t in (q, k, v))
    dtype = q.dtype
    if shared.opts.upcast_attn:
        q, k, v = q.float(), k.float(), v.float()
    out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, is_causal=False).to(dtype)
    return x + self.proj_out(out.transpose(1, 2).reshape(b, c, h, w))


def diffusionmodules_model_AttnBlock_forward(self, x):  # the webui's plain VAE attention
    return sdp_attnblock_forward(self, x)


class SdOptimization:
    name = None
    label = None
    cmd_opt = None
    priority = 0

    def title(self):
        return self.name if self.label is None else f"{self.name} - {self.label}"

    def is_available(self):
        return True

    def apply(self):
        pass

    def undo(self):
        ldm.modules.attention.CrossAttention.forward = hypernetwork.attention_CrossAttention_forward
        ldm.modules.diffusionmodules.model.AttnBlock.forward = diffusionmodules_model_AttnBlock_forward
        sgm.modules.attention.CrossAttention.forward = hypernetwork.attention_CrossAttention_forward
        sgm.modules.diffusionmodules.model.AttnBlock.forward = diffusionmodules_model_AttnBlock_forward


class SdOptimizationSdp(SdOptimization):
    name = "sdp"
    label = "scaled dot product"
    cmd_opt = "opt_sdp_attention"
    priority = 80

    def apply(self):
        ldm.modules.attention.CrossAttention.forward = scaled_dot_product_attention_forward
        ldm.modules.diffusionmodules.model.AttnBlock.forward = sdp_attnblock_forward
        sgm.modules.attention.CrossAttention.forward = scaled_dot_product_attention_forward
        sgm.modules.diffusionmodules.model.AttnBlock.forward = sdp_attnblock_forward
