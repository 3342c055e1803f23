"""CFG-parallel: the two halves of a classifier-free-guidance batch on two GPUs.

With guidance the pipeline calls the UNet (or the SD3 / SD3.5 transformer) on [unconditional; conditional]
stacked in the batch. Each rank of a pair runs its half (the model treats the samples of a batch
independently, so the halves compute what the whole would), then one all-gather per step puts the whole
output on both ranks,
which then take identical scheduler steps. The VAE decode is split the same way when the batch is even, unless
vae_split.py, wrapped around it, deals the decode in bands (large latents).

The wrapper goes around whatever the model's forward is at that point, so with rocm_sd.optimize()
applied first each rank replays a graph of the half batch.
"""
from __future__ import annotations

from collections import Counter

import torch
import torch.distributed as dist
from torch.utils import _pytree as pytree

from .rounds import LostContact, waiting

# The calls split per model: (component attribute on the pipeline, method). The transformer's is what cfg-seq
# mode's guidance halves are: without it only the VAE decode was split there, and each half's ranks ran both.
SPLIT_CALLS = (("unet", "forward"), ("transformer", "forward"), ("controlnet", "forward"), ("vae", "decode"))
# Where each call takes its batch when not as the first positional argument: UNets' sample, the transformers'
# hidden_states, the VAE's z.
_SAMPLE_KEYWORDS = ("sample", "hidden_states", "z")
_WRAPPED_ATTR = "_rocm_sd_cfg_parallel"
# torch 2.13 renamed all_gather_into_tensor (and deprecated the old name); both exist in between.
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class SplitBatchCall:
    """inner(*args) on this rank's half of the batch, then the halves all-gathered in rank order."""

    def __init__(self, inner, group, label: str, lookout=None):
        self.inner, self.group, self.label, self.lookout = inner, group, label, lookout
        self.part = dist.get_rank(group)
        self.stats: Counter = Counter()

    def __call__(self, *args, **kwargs):
        sample = args[0] if args else next((kwargs[k] for k in _SAMPLE_KEYWORDS if k in kwargs), None)
        n = sample.shape[0] if torch.is_tensor(sample) and sample.dim() else 0
        if n < 2 or n % 2:
            self.stats["whole batch (odd)"] += 1
            return self.inner(*args, **kwargs)
        half = n // 2

        def take(x):  # every per-sample tensor: the latents, text embeddings, SDXL's added conditions...
            return x.narrow(0, self.part * half, half) if torch.is_tensor(x) and x.dim() and x.shape[0] == n else x

        args, kwargs = pytree.tree_map(take, (args, kwargs))
        out = self.inner(*args, **kwargs)
        self.stats["split"] += 1
        return pytree.tree_map(lambda y: self._gather(y) if torch.is_tensor(y) and y.dim() and y.shape[0] == half
                               else y, out)

    def _gather(self, part: torch.Tensor) -> torch.Tensor:
        """The pair's one collective per step, kept bare: a partner that fails never joins it, and its
        lookout ends this rank too (lookout.py). On NCCL the call returns once queued, and the wait for a
        partner that never comes is at the host's next synchronization instead."""
        whole = part.new_empty((2 * part.shape[0], *part.shape[1:]))
        try:
            with waiting(self.lookout):
                all_gather_single(whole, part.contiguous(), group=self.group)
        except Exception as exc:  # noqa: BLE001 -- the backends' error types differ (gloo, NCCL, RCCL)
            raise LostContact(f"the all-gather of {self.label} with this rank's CFG partner broke") from exc
        return whole


def enable_cfg_parallel(pipe, group, lookout=None):
    """Split the UNet (and ControlNet) steps and the VAE decode of `pipe` over the two ranks of `group`
    (`lookout`: this rank's, told when the rank waits in the pair's all-gather)."""
    if dist.get_world_size(group) != 2:
        raise ValueError(f"cfg parallel needs a group of 2 ranks, got {dist.get_world_size(group)}")
    wrapped = []
    for component, method in SPLIT_CALLS:
        model = getattr(pipe, component, None)
        if model is None or isinstance(getattr(model, method), SplitBatchCall):
            continue
        previous = model.__dict__.get(method)  # an instance attribute already (rocm_sd's graphed call) or None
        setattr(model, method, SplitBatchCall(getattr(model, method), group, f"{component}.{method}", lookout))
        wrapped.append((model, method, previous))
    setattr(pipe, _WRAPPED_ATTR, wrapped)
    return pipe


def restore_wrapped(wrapped: list) -> None:
    """Put back what the parallel modes replaced, newest first. Each entry is (owner, name, previous): an attention
    module's "processor" goes back through set_processor; a `previous` of None was no instance attribute (the class's
    method), so the stand-in is deleted; anything else is set again."""
    for owner, name, previous in reversed(wrapped):
        if name == "processor":
            owner.set_processor(previous)
        elif previous is None:
            delattr(owner, name)
        else:
            setattr(owner, name, previous)


def disable_cfg_parallel(pipe):
    """Undo enable_cfg_parallel (before rocm_sd.revert, which restores what was there before optimize)."""
    restore_wrapped(getattr(pipe, _WRAPPED_ATTR, []))
    if hasattr(pipe, _WRAPPED_ATTR):
        delattr(pipe, _WRAPPED_ATTR)
    return pipe
