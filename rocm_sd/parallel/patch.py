"""Displaced patch parallelism (DistriFusion, Li et al., CVPR 2024) for the UNets: one image's rows over N ranks.

SD1.5 / SDXL (UNet2DConditionModel) run each step on the N ranks of a group at once. The latent is cut into N
horizontal bands of rows, and every rank runs the whole UNet on its band at every resolution: the down- and
up-samplings halve and double every band alike, so the bands stay aligned (the latent height must divide by
N * 2**downsamplings). Only three kinds of layer look beyond a band's rows:

    Conv2d, kernel > 1     the rows just above and below the band (the halo): the neighbouring ranks' activations
    self-attention (attn1) keys and values over the whole image: every rank's
    GroupNorm              mean and variance over the whole image: every rank's partial statistics

In the first `warmup` steps of an image these are exchanged synchronously, so a warm-up step computes what one
process does, up to reduction order. After that each layer uses what the other ranks sent at the previous step
(stale: the activations move little from one step to the next) joined with this rank's own fresh ones, and sends
this step's asynchronously (async_op collectives, waited on at the next step), so the exchange overlaps the
compute of the rest of the step. The GroupNorm is DistriFusion's corrected asynchronous one: this rank's fresh
statistics with the others' stale ones. Cross-attention (attn2), the feed-forwards and the 1x1 convolutions work
per position and need nothing. The UNet's output bands are all-gathered (fresh), so every rank holds the whole
prediction, takes the same scheduler step and makes the same image: close to one process's, not equal (PSNR in
docs/multi-gpu.md).

The default warm-up is one step: the first step of an image has no previous step to take stale activations from,
and every further warm-up step is a step whose exchanges hold up the compute. DistriFusion's own code defaults to
4 of 50 steps; `warmup` (--patch-warmup) sets it.

Apply after rocm_sd.optimize(pipe) without its graphs (cuda_graph=False; a captured step would replay one step's
exchanges, stale or fresh, for ever): the wrappers take the place of nn.Conv2d, nn.GroupNorm and rocm_sd's
RocmGroupNorm (SiLU included) and of the self-attention processors (diffusers' or rocm_sd's), and rocm_sd's fused
ResnetBlock2D and Upsample2D paths, which read their convolutions' weights directly, see wrapped convolutions and
take diffusers' forward instead. disable_patch_parallel puts every module back, before rocm_sd.revert.
"""
from __future__ import annotations

import inspect
from collections import Counter

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .arguments import PATCH_WARMUP
from .cfg import all_gather_single, restore_wrapped
from .rounds import LostContact, waiting

_WRAPPED_ATTR = "_rocm_sd_patch_parallel"


def downsamplings(unet) -> int:
    """How many times the UNet halves the latent: once per down block with a downsampler."""
    return sum(1 for block in unet.down_blocks if getattr(block, "downsamplers", None))


def rows_problem(latent_height: int, halvings: int, world: int, vae_scale: int | None = None) -> str:
    """Why a latent of `latent_height` rows cannot be cut into bands for `world` ranks, or '' (`vae_scale`: image
    rows per latent row, where known, for the image height to ask for)."""
    unit = world * 2 ** halvings
    if latent_height % unit:
        image = f" (images {unit * vae_scale} pixels high, or a multiple)" if vae_scale else ""
        return (f"patch parallelism cuts the latent's {latent_height} rows into {world} bands, which the UNet halves "
                f"{halvings} time(s): the latent height must divide by {world} x 2**{halvings} = {unit}{image}")
    return ""


def architecture_rows_problem(architecture, height: int | None, world: int) -> str:
    """rows_problem for an image `height` (None: the architecture's default size) of a models.ARCHITECTURES entry,
    from its configuration: diffusers' UNet downsamples after every down block but the last (4 blocks where the
    configuration keeps diffusers' default, as SD1.5's does)."""
    scale = 2 ** (len(architecture.vae["block_out_channels"]) - 1)
    blocks = len(architecture.unet.get("down_block_types", range(4)))
    return rows_problem((height or architecture.size) // scale, blocks - 1, world, scale)


class PatchShard:
    """One UNet's share of the image on this rank: which band, which step of the image, and the exchanges."""

    def __init__(self, group, label: str, halvings: int, warmup: int, lookout=None):
        self.group, self.label, self.halvings, self.warmup, self.lookout = group, label, halvings, warmup, lookout
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        self.step = 0                  # of the current image: steps below `warmup` exchange synchronously
        self.last_step = None          # (timestep, latent shape) of the last step
        self.new_image = True          # set by the pipeline's scheduler.set_timesteps, which each pipeline call runs
        self.layers: list = []         # every wrapper: its stale exchange is dropped when a new image starts
        self.stats: Counter = Counter()

    @property
    def fresh(self) -> bool:
        return self.step < self.warmup

    def begin_step(self, timestep, shape) -> None:
        """Count the step. A new image begins with warm-up: a new pipeline call, or, where the UNet is called on its
        own, a timestep above the last (within an image they fall, or repeat for Heun's second evaluation) or
        another latent shape."""
        t = float(timestep.flatten()[0]) if torch.is_tensor(timestep) else float(timestep)
        last, self.last_step = self.last_step, (t, tuple(shape))
        if self.new_image or last is None or t > last[0] or tuple(shape) != last[1]:
            for layer in self.layers:
                layer.forget()
            self.step, self.new_image = 0, False
        else:
            self.step += 1
        self.stats["fresh steps" if self.fresh else "stale steps"] += 1

    def split(self, sample: torch.Tensor) -> torch.Tensor:
        """This rank's band of rows of the (B, C, H, W) latent."""
        problem = rows_problem(sample.shape[-2], self.halvings, self.world)
        if problem:
            raise ValueError(problem)
        rows = sample.shape[-2] // self.world
        return sample.narrow(-2, self.rank * rows, rows)

    def gather_rows(self, band: torch.Tensor) -> torch.Tensor:
        """Every rank's band of the (B, C, h, W) output, stacked in rank order: (B, C, N * h, W). Synchronous."""
        whole = self.wait(*self.start(band), "output all-gather")
        return torch.cat(whole.unbind(0), dim=-2)

    def start(self, part: torch.Tensor):
        """An all-gather of `part` from every rank, begun: (handle, the (N, *part.shape) tensor it fills)."""
        whole = part.new_empty((self.world * part.shape[0], *part.shape[1:]))  # rank-major, as the backends write
        try:
            handle = all_gather_single(whole, part.contiguous(), group=self.group, async_op=True)
        except Exception as exc:  # noqa: BLE001 -- the backends' error types differ (gloo, NCCL, RCCL)
            raise LostContact(f"an exchange of {self.label} with this rank's patch-parallel group broke") from exc
        return handle, whole.view(self.world, *part.shape)

    def wait(self, handle, whole: torch.Tensor, what: str) -> torch.Tensor:
        """The all-gather begun by start(), finished. Marked as a wait for the lookout: a peer that never sends
        leaves this rank here, and the lookout ends it (lookout.py)."""
        if handle is None:  # finished already (a warm-up step's)
            return whole
        try:
            with waiting(self.lookout):
                handle.wait()
        except Exception as exc:  # noqa: BLE001
            raise LostContact(f"the {what} of {self.label} with this rank's patch-parallel group broke") from exc
        self.stats[what] += 1
        return whole

    def exchange(self, layer, part: torch.Tensor, what: str) -> torch.Tensor:
        """Every rank's `part` for `layer`, (N, *part.shape): this step's in warm-up (synchronous); else the
        previous step's, while this step's travels (waited on at the layer's next call). This rank's own entry
        is what it sent: callers put their fresh `part` in its place."""
        if self.fresh:
            whole = self.wait(*self.start(part), f"{what} (fresh)")
            layer.pending = (None, whole)  # the next step's stale values, if it is past the warm-up
            return whole
        previous, layer.pending = layer.pending, self.start(part)
        if previous is None:  # cannot happen: an image's first step is a warm-up step, and each step sends
            raise RuntimeError(f"{self.label}: a stale {what} with nothing sent at the previous step")
        return self.wait(*previous, f"{what} (stale)")


class _Exchanging(nn.Module):
    """A wrapped module and its exchange: `pending` holds what the previous step sent (handle, tensor). The wrapped
    module is a submodule (`inner`): parameters and devices are the model's as before, though the state-dict keys
    gain `.inner` while patch parallelism is on (load weights or LoRAs before enabling it)."""

    def __init__(self, inner: nn.Module, shard: PatchShard):
        super().__init__()
        self.inner = inner
        object.__setattr__(self, "shard", shard)  # not a submodule: one shard for every wrapper
        self.pending = None
        shard.layers.append(self)

    def forget(self) -> None:
        """Drop the previous image's stale exchange, finished first: every rank began it, so every rank ends it."""
        if self.pending is not None:
            self.shard.wait(*self.pending, "previous image's last exchange")
            self.pending = None


class PatchConv2d(_Exchanging):
    """A Conv2d of kernel height > 1 on this rank's band: the band padded with the neighbours' boundary rows
    (zeros at the image's top and bottom, as the convolution's own padding would be)."""

    def __init__(self, conv: nn.Conv2d, shard: PatchShard):
        super().__init__(conv, shard)
        self.above = conv.padding[0]
        self.below = conv.dilation[0] * (conv.kernel_size[0] - 1) - conv.padding[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        conv, shard = self.inner, self.shard
        rows = x.shape[-2]
        if max(self.above, self.below) > rows:
            raise ValueError(f"{shard.label}: a band of {rows} rows is thinner than its convolution's halo "
                             f"({self.above} + {self.below} rows): use fewer processes or a taller image")
        # What the neighbours need: this band's first rows (the band above's bottom halo), then its last rows.
        edges = torch.cat([x[..., :self.below, :], x[..., rows - self.above:, :]], dim=-2)
        every = shard.exchange(self, edges, "halo exchange")
        top = every[shard.rank - 1][..., self.below:, :] if shard.rank > 0 else x.new_zeros(
            (*x.shape[:-2], self.above, x.shape[-1]))
        bottom = every[shard.rank + 1][..., :self.below, :] if shard.rank < shard.world - 1 else x.new_zeros(
            (*x.shape[:-2], self.below, x.shape[-1]))
        padded = torch.cat([top.to(x.dtype), x, bottom.to(x.dtype)], dim=-2)
        return F.conv2d(padded, conv.weight, conv.bias, conv.stride, (0, conv.padding[1]), conv.dilation, conv.groups)


class PatchGroupNorm(_Exchanging):
    """nn.GroupNorm (or rocm_sd's RocmGroupNorm, its SiLU included) with the statistics of the whole image: each
    rank's count, mean and sum of squared deviations per (image, group), combined as Chan et al.'s parallel
    variance (stable where E[x^2] - E[x]^2 is not). After warm-up: this rank's fresh ones, the others' stale."""

    def forward(self, x: torch.Tensor, input_bias: torch.Tensor | None = None) -> torch.Tensor:
        norm, shard = self.inner, self.shard
        if input_bias is not None:  # RocmGroupNorm's (N, C) bias, added before normalising
            x = x + input_bias.view(*input_bias.shape, *([1] * (x.dim() - 2)))
        batch, groups = x.shape[0], norm.num_groups
        values = x.float().reshape(batch, groups, -1)
        count = values.shape[-1]
        mean = values.mean(-1)
        squares = (values - mean.unsqueeze(-1)).square().sum(-1)
        mine = torch.stack([mean, squares, torch.full_like(mean, count)])  # (3, B, G)
        every = shard.exchange(self, mine, "GroupNorm statistics")
        every[shard.rank] = mine
        means, sums, counts = every.unbind(1)  # each (N, B, G)
        total = counts.sum(0)
        whole_mean = (means * counts).sum(0) / total
        variance = (sums + counts * (means - whole_mean).square()).sum(0) / total
        normalized = (values - whole_mean.unsqueeze(-1)) * torch.rsqrt(variance.unsqueeze(-1) + norm.eps)
        out = normalized.reshape(x.shape)
        if norm.affine:
            shape = (1, -1, *([1] * (x.dim() - 2)))
            out = out * norm.weight.float().view(shape) + norm.bias.float().view(shape)
        if getattr(norm, "act", None) == "silu":
            out = F.silu(out)
        return out.to(x.dtype)


class PatchSelfAttention:
    """An attention module's processor where it attends to its own input (attn1): the keys and values of every
    rank's band (the others' stale after warm-up). Calls with a text (attn2) go to the processor it wraps."""

    def __init__(self, inner, shard: PatchShard):
        self.inner, self.shard = inner, shard
        self.pending = None
        shard.layers.append(self)

    forget = _Exchanging.forget

    def __call__(self, attn, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor | None = None,
                 attention_mask: torch.Tensor | None = None, temb: torch.Tensor | None = None, *args, **kwargs):
        if encoder_hidden_states is not None:
            return self.inner(attn, hidden_states, encoder_hidden_states, attention_mask, temb, *args, **kwargs)
        if (attention_mask is not None or args or kwargs or hidden_states.dim() != 3 or attn.spatial_norm is not None
                or attn.group_norm is not None):
            raise NotImplementedError(f"patch parallelism covers the UNet's self-attention over (B, tokens, C); this "
                                      f"call of {type(self.inner).__name__} (an attention mask, a 4-D input, a norm "
                                      "inside the attention, extra arguments) would attend over this rank's band only")
        residual = hidden_states
        if getattr(attn, "fused_projections", False):
            query, key, value = attn.to_qkv(hidden_states).chunk(3, dim=-1)
        else:
            query, key, value = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
        tokens = key.shape[1]
        mine = torch.cat([key, value], dim=-1)
        every = self.shard.exchange(self, mine, "keys and values")
        every[self.shard.rank] = mine
        keys, values = every.permute(1, 0, 2, 3).flatten(1, 2).chunk(2, dim=-1)  # (B, N * tokens, C) in row order
        query, keys, values = (_heads_first(t, attn.heads) for t in (query, keys, values))
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            keys = attn.norm_k(keys)
        attended = _attention(query, keys, values)
        batch, heads, _, dim = attended.shape
        hidden_states = attended.transpose(1, 2).reshape(batch, tokens, heads * dim).to(query.dtype)
        hidden_states = attn.to_out[1](attn.to_out[0](hidden_states))
        if attn.residual_connection:
            hidden_states = hidden_states + residual
        return hidden_states / attn.rescale_output_factor


def _heads_first(t: torch.Tensor, heads: int) -> torch.Tensor:
    batch, length, inner = t.shape
    return t.view(batch, length, heads, inner // heads).transpose(1, 2)


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """rocm_sd's attention where its kernels are built for this device, else PyTorch's."""
    from ..ops.attention import scaled_dot_product_attention

    return scaled_dot_product_attention(q, k, v)


class _BandStep:
    """The UNet's forward on this rank's band: the latent's rows cut, the output's rows all-gathered."""

    def __init__(self, inner, shard: PatchShard):
        self.inner, self.shard = inner, shard

    def __call__(self, sample, timestep, *args, **kwargs):
        self.shard.begin_step(timestep, sample.shape)
        out = self.inner(self.shard.split(sample), timestep, *args, **kwargs)
        if isinstance(out, tuple):
            return (self.shard.gather_rows(out[0]), *out[1:])
        out.sample = self.shard.gather_rows(out.sample)
        return out


class _NewImage:
    """The scheduler's set_timesteps, which tells the shard that a pipeline call, a new image, begins."""

    def __init__(self, inner, shard: PatchShard):
        self.inner, self.shard = inner, shard
        self.__signature__ = inspect.signature(inner)  # diffusers' retrieve_timesteps reads the parameters

    def __call__(self, *args, **kwargs):
        self.shard.new_image = True
        return self.inner(*args, **kwargs)


def _unet(pipe):
    """The pipeline's UNet, or `pipe` itself where it is one."""
    return pipe if type(pipe).__name__ == "UNet2DConditionModel" else getattr(pipe, "unet", None)


def _wrapped_calls(forward) -> list[str]:
    """The class names of the callables standing in the UNet's forward, outermost first (TextKV, graphs, caches)."""
    names = []
    while forward is not None and len(names) < 8:
        names.append(type(forward).__name__)
        forward = getattr(forward, "inner", None)
    return names


def enable_patch_parallel(pipe, group, lookout=None, warmup: int = PATCH_WARMUP):
    """Split every step of `pipe`'s UNet (SD1.5 / SDXL; or `pipe` is the UNet) over the ranks of `group` by bands
    of rows, displaced after `warmup` synchronous steps of each image (`lookout`: this rank's, told when the rank
    waits in the group's exchanges). Apply rocm_sd.optimize(pipe, cuda_graph=False) first where wanted."""
    unet = _unet(pipe)
    if type(unet).__name__ != "UNet2DConditionModel":
        model = getattr(pipe, "transformer", unet)
        raise ValueError(f"patch parallelism splits the UNets (UNet2DConditionModel: SD1.5, SD2.1, SDXL); this "
                         f"pipeline's model is {type(model).__name__}: use --mode seq for the diffusion transformers")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 1:
        raise ValueError(f"patch parallelism needs at least one synchronous warm-up step per image (its stale "
                         f"exchanges come from the step before), got warmup={warmup!r}")
    if getattr(unet, _WRAPPED_ATTR, None):
        return pipe
    stand_ins = _wrapped_calls(unet.__dict__.get("forward"))
    refused = {"GraphedCall": "graph capture (optimize(cuda_graph=...)) would replay one step's exchanges; "
                              "optimize with cuda_graph=False",
               "UNetStepCache": "a step cache (optimize(cache=...)) would have each rank decide on its own band "
                                "whether to skip a step; optimize without `cache`"}
    for name in stand_ins:
        if name in refused:
            raise ValueError(f"patch parallelism with {refused[name]}")
    shard = PatchShard(group, type(unet).__name__, downsamplings(unet), warmup, lookout)
    wrapped = []
    for parent in list(unet.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Conv2d) and child.kernel_size[0] > 1:
                if type(child) is not nn.Conv2d or child.padding_mode != "zeros" or isinstance(child.padding, str):
                    raise ValueError(f"patch parallelism pads plain zero-padded nn.Conv2d bands; {name} in "
                                     f"{type(parent).__name__} is {type(child).__name__} (padding "
                                     f"{child.padding_mode} {child.padding}): optimize without precision='fp8'")
                setattr(parent, name, PatchConv2d(child, shard))
                wrapped.append((parent, name, child))
            elif isinstance(child, nn.GroupNorm):
                setattr(parent, name, PatchGroupNorm(child, shard))
                wrapped.append((parent, name, child))
    for attn in [m for m in unet.modules() if hasattr(m, "processor") and hasattr(m, "is_cross_attention")]:
        if not attn.is_cross_attention:
            processor = attn.processor
            attn.set_processor(PatchSelfAttention(processor, shard))
            wrapped.append((attn, "processor", processor))
    for owner, name, kind in ((unet, "forward", _BandStep), (getattr(pipe, "scheduler", None), "set_timesteps",
                                                             _NewImage)):
        if owner is not None:
            wrapped.append((owner, name, owner.__dict__.get(name)))
            setattr(owner, name, kind(getattr(owner, name), shard))
    setattr(unet, _WRAPPED_ATTR, (shard, wrapped))
    return pipe


def disable_patch_parallel(pipe):
    """Undo enable_patch_parallel (before rocm_sd.revert)."""
    unet = _unet(pipe)
    _, wrapped = getattr(unet, _WRAPPED_ATTR, (None, []))
    restore_wrapped(wrapped)
    if wrapped:
        delattr(unet, _WRAPPED_ATTR)
    return pipe
