"""Sequence parallelism (DeepSpeed-Ulysses) for the diffusion transformers: one image's tokens over N ranks.

SD3 / SD3.5 (SD3Transformer2DModel) and Flux (FluxTransformer2DModel) run each step on the N ranks of a group at
once. Every rank holds 1/N of the image tokens through the whole network (embedders, AdaLN, MLPs and norms work
per token; Flux's rotary frequencies are cut to the rank's tokens) and all of the text tokens (333 for SD3, 512
for Flux: few, so the text stream is replicated and its layers run on every rank). Only attention mixes tokens:

    Q, K, V of the rank's image tokens, all heads    --all-to-all-->   every image token, H/N heads
    Q, K, V of the text (every rank has them)        --sliced------>   the text, the same H/N heads
    attention over the joined rows, in the model's order (Flux: text first; SD3: image first)
    image rows back to their rank, the text's H/N heads to every rank   <--all-to-all--

two all-to-alls per attention (Q, K and V travel in one; the text rides with the image rows on the way back).
The output projection's rows are all-gathered, so every rank holds the whole prediction, takes the same scheduler
step, and makes the image one rank would, up to reduction order.

diffusers 0.42 has context parallelism too (ModelMixin.enable_parallelism with a ContextParallelConfig): Ulysses
and ring attention for models with a plan, Flux among them but not SD3, and inside diffusers' attention dispatch,
which rocm_sd's processors replace. It splits the text tokens as well, which needs the text length to divide by N
(SD3's 333 does not; its uneven mode adds a collective of the sizes to every attention). So the split here is
rocm_sd's own, at its processors' `attend` step (modules/joint_attention.py).

Each rank takes a consecutive group of heads, as even as the count allows (Flux 24, SD3 / SD3.5 Medium 24: 12 / 8 / 6
a rank on 2 / 3 / 4 ranks; SD3.5 Large's 38 over 4: 10, 10, 9, 9, so the ranks with 9 wait about a tenth of an
attention for the others); there must be at least N heads. The image tokens must divide by N (4096 at 1024x1024).
Ring attention, for more ranks than heads, is not built.
"""
from __future__ import annotations

import functools
from collections import Counter

import torch
import torch.distributed as dist

from ..modules.joint_attention import RocmFluxAttnProcessor, RocmJointAttnProcessor
from ..modules.joint_attention import attend as attend_here
from .cfg import all_gather_single, restore_wrapped
from .rounds import LostContact, waiting

_WRAPPED_ATTR = "_rocm_sd_seq_parallel"

# Per model class: (the submodule whose output rows are the image tokens to split, whether the image rows come
# first in the joint attention, the submodule whose output rows are gathered, a submodule whose rotary table is
# cut to the rank's rows or None).
PLANS = {
    "SD3Transformer2DModel": ("pos_embed", True, "proj_out", None),
    "FluxTransformer2DModel": ("x_embedder", False, "proj_out", "pos_embed"),
}


class SequenceShard:
    """This rank's share of one image's tokens in the current call, and the collectives of the group.

    `split` (the embedder's output) records how many image tokens the call has; every attention of the call reads
    it to tell the image rows of its joined input from the text rows."""

    def __init__(self, group, image_first: bool, label: str, lookout=None):
        self.group, self.image_first, self.label, self.lookout = group, image_first, label, lookout
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        self.tokens = 0  # image tokens of the whole image in the current call
        self.stats: Counter = Counter()

    @property
    def local(self) -> int:
        return self.tokens // self.world

    def split(self, x: torch.Tensor) -> torch.Tensor:
        """The rank's consecutive share of the image rows of x (B, L, C)."""
        tokens = x.shape[1]
        if tokens % self.world:
            raise ValueError(f"sequence parallelism splits the image's {tokens} tokens of {self.label} over "
                             f"{self.world} ranks, which does not divide them: choose a height and width whose "
                             f"token count divides by {self.world} (1024x1024: 4096 tokens)")
        self.tokens = tokens
        self.stats["split"] += 1
        return x.narrow(1, self.rank * self.local, self.local)

    def rotary_rows(self, table: torch.Tensor) -> torch.Tensor:
        """Flux's rotary table over [text; whole image] rows, cut to [text; this rank's image rows]."""
        text = table.shape[0] - self.tokens
        return torch.cat([table[:text], table.narrow(0, text + self.rank * self.local, self.local)])

    def gather(self, part: torch.Tensor) -> torch.Tensor:
        """The image rows of every rank, in order: (B, l, C) -> (B, L, C)."""
        whole = part.new_empty((self.world * part.shape[0], *part.shape[1:]))  # rank-major, as the backends write
        self._collective("all-gather", all_gather_single, whole, part.contiguous())
        return whole.unflatten(0, (self.world, part.shape[0])).transpose(0, 1).flatten(1, 2)

    def attend(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        """attend() (modules/joint_attention.py) over the whole image: Q, K, V (B, S, H, D) hold the text rows and
        this rank's image rows, in the model's order; (B, S, H * D) out, the same rows."""
        batch, rows, heads, dim = query.shape
        n, local = self.world, self.local
        text = rows - local
        groups = head_groups(heads, n)
        start, part = groups[self.rank]
        image_rows, text_rows = ((slice(0, local), slice(local, rows)) if self.image_first
                                 else (slice(text, rows), slice(0, text)))
        # heads first, [H, 3, B, l, D] in one copy: rank r is sent this rank's image rows of its head group, the
        # consecutive [H_r, 3, B, l, D] block
        send = torch.stack([t[:, image_rows].permute(2, 0, 1, 3) for t in (query, key, value)], dim=1)
        sent = [3 * batch * local * count * dim for _, count in groups]
        received = self._all_to_all(send.view(-1), sent, [sent[self.rank]] * n)
        # [n source ranks, H_me, 3, B, l, D] -> every image row in order, this rank's heads: [3, B, L, H_me, D]
        image = received.view(n, part, 3, batch, local, dim).permute(2, 3, 0, 4, 1, 5).flatten(2, 3)
        mine = slice(start, start + part)
        q, k, v = (self._joined(image[i], t[:, text_rows, mine]) for i, t in enumerate((query, key, value)))
        out = attend_here(q, k, v).unflatten(-1, (part, dim))  # (B, joined rows, H_me, D)
        image_out, text_out = (out[:, :n * local], out[:, n * local:]) if self.image_first else \
            (out[:, text:], out[:, :text])
        # rank r is sent its image rows and the text, both of this head group: [n, B, l + text, H_me, D]
        back = torch.cat([image_out.unflatten(1, (n, local)).transpose(0, 1),
                          text_out.unsqueeze(0).expand(n, *text_out.shape)], dim=2)
        returned = [batch * rows * count * dim for _, count in groups]
        received = self._all_to_all(back.reshape(-1), [back[0].numel()] * n, returned)
        joined = torch.cat([piece.view(batch, rows, count, dim)  # heads in order
                            for piece, (_, count) in zip(received.split(returned), groups)], dim=2).flatten(2)
        self.stats["attention"] += 1
        return self._joined(joined[:, :local], joined[:, local:])

    def _joined(self, image: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        """The image and text rows in the model's order."""
        return torch.cat([image, text] if self.image_first else [text, image], dim=1)

    def _all_to_all(self, send: torch.Tensor, sent: list[int], received: list[int]) -> torch.Tensor:
        """A flat `send` whose consecutive parts of `sent` elements go to ranks 0, 1, ...; a flat result whose parts
        of `received` elements came from them."""
        out = send.new_empty(sum(received))
        self._collective("all-to-all", functools.partial(dist.all_to_all_single, output_split_sizes=received,
                                                         input_split_sizes=sent), out, send.contiguous())
        return out

    def _collective(self, what: str, fn, out: torch.Tensor, inp: torch.Tensor) -> None:
        """Kept bare, like the CFG pair's all-gather (cfg.py): a rank that fails never joins, and its lookout ends
        the others."""
        try:
            with waiting(self.lookout):
                fn(out, inp, group=self.group)
        except Exception as exc:  # noqa: BLE001 -- the backends' error types differ (gloo, NCCL, RCCL)
            raise LostContact(f"the {what} of {self.label} with this rank's sequence-parallel group broke") from exc


class _Split:
    def __init__(self, inner, shard: SequenceShard):
        self.inner, self.shard = inner, shard

    def __call__(self, *args, **kwargs):
        return self.shard.split(self.inner(*args, **kwargs))


class _Gather(_Split):
    def __call__(self, *args, **kwargs):
        return self.shard.gather(self.inner(*args, **kwargs))


class _RotaryRows(_Split):
    def __call__(self, *args, **kwargs):
        return tuple(self.shard.rotary_rows(t) for t in self.inner(*args, **kwargs))


def _not_split(name: str):
    def refuse(*args, **kwargs):
        raise NotImplementedError(f"sequence parallelism covers rocm_sd's joint attention; this call of {name} "
                                  "(an attention mask, IP-Adapter or other extra arguments) would attend over this "
                                  "rank's tokens only")
    return refuse


def _transformer(pipe):
    """The pipeline's transformer, or `pipe` itself where it is one."""
    return pipe if type(pipe).__name__ in PLANS else getattr(pipe, "transformer", None)


def head_groups(heads: int, world: int) -> list[tuple[int, int]]:
    """(first head, heads) of each rank: consecutive groups, as even as `heads` allow (38 over 4: 10, 10, 9, 9)."""
    base, extra = divmod(heads, world)
    counts = [base + (r < extra) for r in range(world)]
    return [(sum(counts[:r]), count) for r, count in enumerate(counts)]


def heads_problem(model, world: int) -> str:
    """Why `model`'s attention heads cannot be split over `world` ranks, or ''."""
    heads = model.config.num_attention_heads
    if heads < world:
        return (f"sequence parallelism splits the {heads} attention heads of {type(model).__name__} over the ranks "
                f"(Ulysses): {heads} heads cannot give each of {world} ranks one; run at most {heads} processes "
                "(ring attention, which would take more, is not built)")
    return ""


def enable_sequence_parallel(pipe, group, lookout=None):
    """Split every step of `pipe`'s transformer (SD3 / SD3.5, Flux; or `pipe` is the transformer) over the ranks of `group` by image tokens
    (`lookout`: this rank's, told when the rank waits in the group's collectives). Apply rocm_sd.optimize(pipe)
    first where wanted: the attention processors become rocm_sd's, whose attention step the split wraps."""
    from ..patch.diffusers import REPLACED

    model = _transformer(pipe)
    plan = PLANS.get(type(model).__name__)
    if plan is None:
        raise ValueError(f"sequence parallelism splits the diffusion transformers ({', '.join(PLANS)}); this "
                         f"pipeline's model is {type(getattr(pipe, 'unet', model)).__name__}: use --mode cfg or data")
    if getattr(model, _WRAPPED_ATTR, None):
        return pipe
    problem = heads_problem(model, dist.get_world_size(group))
    if problem:
        raise ValueError(problem)
    if type(model.__dict__.get("forward")).__name__ == "DiTStepCache":
        raise ValueError("sequence parallelism with a step cache (optimize(cache=...)): each rank would decide on "
                         "its own tokens whether to skip a step; optimize without `cache`")
    split_at, image_first, gather_at, rotary_at = plan
    shard = SequenceShard(group, image_first, type(model).__name__, lookout)
    wrapped = []

    def wrap(module, name, value):
        wrapped.append((module, name, module.__dict__.get(name)))
        setattr(module, name, value)

    for attn in [m for m in model.modules() if hasattr(m, "processor")]:
        processor = attn.processor
        if type(processor).__name__ in REPLACED and type(processor).__module__.startswith("diffusers."):
            attn.set_processor(REPLACED[type(processor).__name__](processor))  # as optimize's attention flag does
            wrapped.append((attn, "processor", processor))
            processor = attn.processor
        if not isinstance(processor, (RocmJointAttnProcessor, RocmFluxAttnProcessor)):
            raise ValueError(f"sequence parallelism cannot split {type(processor).__name__} (in {type(model).__name__})")
        wrap(processor, "attend", shard.attend)
        wrap(processor, "fallback", _not_split(type(processor.fallback).__name__))
    for name, kind in ((split_at, _Split), (gather_at, _Gather), (rotary_at, _RotaryRows)):
        if name is not None:
            module = getattr(model, name)
            wrap(module, "forward", kind(module.forward, shard))
    setattr(model, _WRAPPED_ATTR, (shard, wrapped))
    return pipe


def disable_sequence_parallel(pipe):
    """Undo enable_sequence_parallel (before rocm_sd.revert)."""
    model = _transformer(pipe)
    _, wrapped = getattr(model, _WRAPPED_ATTR, (None, []))
    restore_wrapped(wrapped)
    if wrapped:
        delattr(model, _WRAPPED_ATTR)
    return pipe
