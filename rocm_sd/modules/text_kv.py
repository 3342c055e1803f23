"""Cross-attention's keys and values computed once per text embedding instead of once per step.

A diffusers pipeline hands every UNet step the same prompt embedding (one tensor object, made before the loop), and
every step's cross-attention projects it to the same keys and values: two GEMMs over the text in every transformer
block (one with fuse_qkv), each a few microseconds, 140 a step in SDXL. TextKV stands in the model's forward. When a
call's encoder_hidden_states is the tensor an earlier call computed keys and values of, unchanged (its version), and
the projections' weights are unchanged (the same storage and versions, no module or processor registered since), the
keys and values kept are still the ones the call would compute. Otherwise it computes them now, for every
cross-attention module whose processor is RocmAttnProcessor, into buffers kept per embedding shape. During the call
those processors read the buffers instead of projecting the text. Same modules on the same input: the same numbers.

Graphs: install TextKV after the graphed calls (optimize()'s `text_kv` comes after `cuda_graph`). The keys and values
are computed outside the model's graph, by a graph of their own when graphs are on (patch/diffusers.reuse_text_kv
puts a graphed call in `compute`'s place), and the model's graph, captured with the processors reading the buffers,
replays without the projections. Buffers keep their addresses while optimized (a change of structure computes into
the same ones), so every graph captured on them stays valid; where buffers must go (past MAX_SHAPES text shapes, a
projection of another width) the model's graphs go with them (`forget_graphs`).

Not used, the processors projecting the text as before, where a call's text is not a tensor every processor receives
as it is: no encoder_hidden_states, an encoder_hid_proj (IP-Adapter), cross_attention_kwargs (LoRA scales, masks:
diffusers' own block forward runs those), autograd on, torch.compile tracing, accelerate's model offload installed
before optimize() (its hook moves the weights inside the call TextKV wraps). An inference tensor (no version counter)
is trusted for one call only. Changes that no registration or version shows (a LoRA scale edited in a plain dict while
the same embedding is passed again) need rocm_sd.invalidate_graphs(pipe), which forgets the keys and values too.
"""
from __future__ import annotations

from collections import Counter

import torch
from torch import nn

from ..graphs import structure_epoch, watch_structure
from .attention import RocmAttnProcessor, keys_values, text_projections
from .fusing import accelerate_hooked
from .quantized_linear import _version

MAX_SHAPES = 4  # text embedding shapes kept (batch sizes x prompt lengths); beyond it everything is computed again


def _text_argument(args: tuple, kwargs: dict):
    """encoder_hidden_states of a UNet2DConditionModel / ControlNetModel forward: the third positional argument."""
    return kwargs["encoder_hidden_states"] if "encoder_hidden_states" in kwargs else args[2] if len(args) > 2 else None


def _projections(attn: nn.Module) -> list[nn.Module]:
    """The modules that make an attention module's keys and values from the text, in the order they are applied."""
    norm = [attn.norm_cross] if getattr(attn, "norm_cross", None) is not None else []
    if getattr(attn, "fused_projections", False):
        return norm + [attn.to_kv]
    return norm + [attn.to_k, attn.to_v]


def text_attentions(model: nn.Module) -> list[nn.Module]:
    """The model's cross-attention modules whose processor (RocmAttnProcessor) can read kept keys and values."""
    return [m for m in model.modules() if getattr(m, "is_cross_attention", False)
            and type(getattr(m, "processor", None)) is RocmAttnProcessor]


class TextKV:
    """model.forward's stand-in (see the module doc). `inner`: the forward it wraps (a graphed call, a step cache
    controller or the model's own); `forget_graphs`: drops the model's graphs when the buffers go."""

    def __init__(self, model: nn.Module, inner, counts: Counter | None = None, forget_graphs=None):
        self.model, self.inner, self.forget_graphs = model, inner, forget_graphs
        self.counts = Counter() if counts is None else counts  # the optimize report's
        self.active = False  # during a call whose text the buffers hold
        self.forget()

    def __getstate__(self) -> dict:
        """A copy (copy.deepcopy, pickle) keeps the wiring (the graphed `compute` too, which copies without its graphs),
        never the buffers: they belong to the original's graphs."""
        state = {"model": self.model, "inner": self.inner, "counts": self.counts, "forget_graphs": self.forget_graphs}
        if "compute" in vars(self):
            state["compute"] = vars(self)["compute"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["model"], state["inner"], state["counts"], state["forget_graphs"])
        if "compute" in state:
            self.compute = state["compute"]

    def forget(self) -> None:
        """Drops the buffers and what they held (revert(), invalidate_graphs())."""
        self._buffers: dict[tuple, dict[nn.Module, tuple[torch.Tensor, ...]]] = {}  # text shape -> module -> buffers
        self._source = None          # (the text tensor, its version, the weights' key) the buffers hold
        self._epoch = -1
        self._attentions: list[nn.Module] = []
        self._weights: list[torch.Tensor] = []

    # -- the call ---------------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        text = _text_argument(args, kwargs)
        if not self._takes(text, kwargs):
            return self.inner(*args, **kwargs)
        self._prepare(text)
        self.active = True
        try:
            return self.inner(*args, **kwargs)
        finally:
            self.active = False

    def _takes(self, text, kwargs: dict) -> bool:
        # accelerate's model offload hook on the model itself brings its weights to the GPU inside the call it wraps:
        # here, outside it, they may still be in CPU memory
        return (isinstance(text, torch.Tensor) and text.dim() == 3 and not kwargs.get("cross_attention_kwargs")
                and getattr(self.model, "encoder_hid_proj", None) is None and not torch.is_grad_enabled()
                and not torch.compiler.is_compiling() and not accelerate_hooked(self.model))

    def _prepare(self, text: torch.Tensor) -> None:
        if self._epoch != structure_epoch():
            self._walk()
        version = _version(text)
        weights = tuple((t.data_ptr(), _version(t)) for t in self._weights)
        source = self._source
        if (source is not None and source[0] is text and version is not None and source[1] == version
                and source[2] == weights and self._key(text) in self._buffers):
            self.counts["text keys and values: reused"] += 1
            return
        self._source = None  # until computed: a failure leaves nothing that looks valid
        self.compute(text)
        self._source = (text, version, weights)
        self.counts["text keys and values: computed"] += 1

    def _walk(self) -> None:
        watch_structure(self.model)
        self._attentions = text_attentions(self.model)
        self._weights = [t for attn in self._attentions for module in _projections(attn)
                         for t in (*module.parameters(), *module.buffers())]
        self._source = None  # computed again, into the same buffers: graphs of the old structure may still replay
        self._epoch = structure_epoch()

    @staticmethod
    def _key(text: torch.Tensor) -> tuple:
        return tuple(text.shape), text.dtype, text.device

    def compute(self, text: torch.Tensor) -> None:
        """Every cross-attention module's keys and values of `text`, into the buffers of its shape (made at the first
        call of a shape, outside inference mode, so that later calls in or out of it can write them)."""
        key = self._key(text)
        buffers = self._buffers.get(key)
        if buffers is None:
            if len(self._buffers) >= MAX_SHAPES:
                self._drop_buffers()
            buffers = self._buffers[key] = {}
        for attn in self._attentions:
            values = text_projections(attn, text)
            kept = buffers.get(attn)
            if kept is not None and [t.shape for t in kept] != [t.shape for t in values]:
                self._drop_buffers()  # fused or unfused since: other widths
                buffers, kept = self._buffers.setdefault(key, {}), None
            if kept is None:
                with torch.inference_mode(False):
                    kept = buffers[attn] = tuple(torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in values)
            for buffer, value in zip(kept, values):
                buffer.copy_(value)

    def _drop_buffers(self) -> None:
        """Frees every buffer, and the model's graphs, which read their addresses."""
        self._buffers.clear()
        if self.forget_graphs is not None:
            self.forget_graphs()

    # -- the processors' side -------------------------------------------------------------------
    def keys_values(self, attn: nn.Module, text: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(key, value) of `attn` for this call's text, or None where this call computes them itself."""
        if not self.active or self._source is None:
            return None
        kept = self._buffers.get(self._key(text), {}).get(attn)
        if kept is None:
            return None
        return keys_values(kept)
