"""comfy.ldm.flux.model.Flux as at a125cd84, reduced: patchify, embedders, rope ids ([text, image] rows), the double
and single blocks, the last layer (no block replace patches, ControlNet or reference latents)."""
import torch
from torch import nn

from comfy import ops
from .layers import DoubleStreamBlock, EmbedND, LastLayer, MLPEmbedder, SingleStreamBlock, timestep_embedding


class Flux(nn.Module):
    def __init__(self, in_channels=4, out_channels=4, vec_in_dim=8, context_in_dim=24, hidden_size=32, mlp_ratio=4.0,
                 num_heads=2, depth=2, depth_single_blocks=2, axes_dim=(4, 6, 6), theta=10000, patch_size=2,
                 qkv_bias=True, guidance_embed=True, dtype=None, device=None, operations=ops.disable_weight_init):
        super().__init__()
        self.patch_size, self.hidden_size, self.num_heads = patch_size, hidden_size, num_heads
        self.vec_in_dim, self.guidance_embed = vec_in_dim, guidance_embed
        self.out_channels = out_channels * patch_size * patch_size
        kw = dict(dtype=dtype, device=device, operations=operations)
        self.pe_embedder = EmbedND(dim=hidden_size // num_heads, theta=theta, axes_dim=list(axes_dim))
        self.img_in = operations.Linear(in_channels * patch_size * patch_size, hidden_size, bias=True)
        self.time_in = MLPEmbedder(in_dim=256, hidden_dim=hidden_size, **kw)
        self.vector_in = MLPEmbedder(vec_in_dim, hidden_size, **kw)
        self.guidance_in = MLPEmbedder(in_dim=256, hidden_dim=hidden_size, **kw) if guidance_embed else nn.Identity()
        self.txt_in = operations.Linear(context_in_dim, hidden_size)
        self.double_blocks = nn.ModuleList([DoubleStreamBlock(hidden_size, num_heads, mlp_ratio=mlp_ratio,
                                                              qkv_bias=qkv_bias, **kw) for _ in range(depth)])
        self.single_blocks = nn.ModuleList([SingleStreamBlock(hidden_size, num_heads, mlp_ratio=mlp_ratio, **kw)
                                            for _ in range(depth_single_blocks)])
        self.final_layer = LastLayer(hidden_size, 1, self.out_channels, **kw)

    def forward_orig(self, img, img_ids, txt, txt_ids, timesteps, y, guidance=None, transformer_options={},
                     attn_mask=None):
        img = self.img_in(img)
        vec = self.time_in(timestep_embedding(timesteps, 256).to(img.dtype))
        if self.guidance_embed and guidance is not None:
            vec = vec + self.guidance_in(timestep_embedding(guidance, 256).to(img.dtype))
        vec = vec + self.vector_in(y[:, :self.vec_in_dim])
        txt = self.txt_in(txt)
        pe = self.pe_embedder(torch.cat((txt_ids, img_ids), dim=1))
        for block in self.double_blocks:
            img, txt = block(img=img, txt=txt, vec=vec, pe=pe, attn_mask=attn_mask,
                             transformer_options=transformer_options)
        img = torch.cat((txt, img), 1)
        for block in self.single_blocks:
            img = block(img, vec=vec, pe=pe, attn_mask=attn_mask, transformer_options=transformer_options)
        return self.final_layer(img[:, txt.shape[1]:, ...], vec)

    def process_img(self, x):
        bs, c, h, w = x.shape
        p = self.patch_size
        img = x.reshape(bs, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5).reshape(bs, (h // p) * (w // p), -1)
        ids = torch.zeros((h // p, w // p, 3), device=x.device, dtype=x.dtype)
        ids[:, :, 1] = ids[:, :, 1] + torch.linspace(0, h // p - 1, steps=h // p, device=x.device,
                                                     dtype=x.dtype).unsqueeze(1)
        ids[:, :, 2] = ids[:, :, 2] + torch.linspace(0, w // p - 1, steps=w // p, device=x.device,
                                                     dtype=x.dtype).unsqueeze(0)
        return img, ids.reshape(1, -1, 3).repeat(bs, 1, 1)

    def forward(self, x, timestep, context, y=None, guidance=None, control=None, transformer_options={}, **kwargs):
        bs, c, h, w = x.shape
        p = self.patch_size
        img, img_ids = self.process_img(x)
        txt_ids = torch.zeros((bs, context.shape[1], 3), device=x.device, dtype=x.dtype)
        if y is None:
            y = torch.zeros((bs, self.vec_in_dim), device=x.device, dtype=x.dtype)
        out = self.forward_orig(img, img_ids, context, txt_ids, timestep, y, guidance, transformer_options,
                                attn_mask=kwargs.get("attention_mask"))
        out = out.reshape(bs, h // p, w // p, -1, p, p).permute(0, 3, 1, 4, 2, 5)
        return out.reshape(bs, -1, h, w)
