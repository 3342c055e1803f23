"""Step caching of the diffusion transformers (diffusers' SD3Transformer2DModel: SD3 / SD3.5; FluxTransformer2DModel):
First Block Cache and TeaCache.

Adjacent denoising steps change a transformer's output little. Both modes put a boundary into the block stack. A full
call runs every block after it and keeps the residual of the rest of the network on the image stream: the hidden
state entering norm_out minus the one at the boundary. A cached call adds the kept residual to the hidden state at the
boundary and goes on to norm_out / proj_out. The text stream's residual is not kept: after the last block both models
read the image stream only (norm_out(hidden_states, temb)).

- 'fbcache' (First Block Cache: ParaAttention's; diffusers' hooks/first_block_cache.py): the boundary is after
  transformer_blocks[0] (SD3's first joint block, Flux's first double block), which every call runs. The probe is that
  block's residual on the image stream (its output minus its input). A call is cached when the probe's relative L1
  change, mean|p - p_full| / mean|p_full|, against the probe of its slot's last full call is below the threshold.
- 'teacache' (TeaCache, arXiv 2411.19108): the boundary is before the first block. The probe is the first block's
  AdaLN-modulated input, norm1(hidden_states, temb)[0]. Each slot sums the probe's relative L1 change against its
  previous call's, rescaled by TeaCache's polynomial (TEACACHE_POLYNOMIAL); a call is cached while the sum stays below
  the threshold, and a full call sets it back to 0. The schedule's last step is full, as in TeaCache's own code
  (teacache_flux.py: `cnt == num_steps - 1`), where the step is known: a timestep that is a view of
  scheduler.timesteps (SD3's pipeline passes `t.expand(batch)`). Flux's pipeline passes `timestep / 1000`, a new
  tensor, and nothing the transformer sees says which step is the last: there the last step is decided like the others.
Threshold 0: every call is full (and computes what the uncached model does, bit for bit). A slot's first call of a
generation is full in both modes.

Which calls share a cache: modules/step_cache.py's grouping (Steps). A lower timestep is the next step; an equal one is
another call of the same step, with its own slot (CFG run as separate calls: Flux's true CFG); a timestep that does
not go down, inputs of another shape, dtype or device (batch, resolution, text length), or a timestep from another
scheduler.timesteps tensor start a new generation, whose calls are full until their slot has a residual. A batched
CFG call (SD3's [uncond, cond]) is one call: one decision for the whole batch, one residual of the batch's shape.
A step takes at most MAX_SLOTS calls: one more at the same timestep is a new generation (Flux's pipeline gives every
run of one step the same timestep). Flux's guidance embedding goes into temb, so the probe and norm_out see it as the
model does. Calls run uncached (the model's own forward, the cache untouched) with ControlNet residuals, SD3's
skip_layers (skip-layer guidance calls), or autograd on (gradient checkpointing included: a kept residual would hold
the network's gradient history).

Calls (GRAPHED_CALLS; patch/diffusers.py's install_graphs graphs each on its own): `head` (the embeddings and the
first block or its norm: the streams at the boundary, and the probe's change against the slot's), `rest` (the blocks
after the boundary and the output layers: the output; it writes the new residual) and `skip` (the output layers on
hidden + residual). `head` only reads the slot's probe, so that running it again (graph capture's warm-up calls)
compares the same two: teacache's `rest` and `skip` compute the probe again to write it (a norm). Each runs the
model's own forward, with the model's block lists standing aside for one stand-in module for the call, so what the
forward does around the blocks happens as usual: embeddings, LoRA scaling from joint_attention_kwargs, IP-Adapter
projections, norm_out, proj_out, SD3's unpatchify. `rest` and `skip` compute the embeddings again (a few small GEMMs)
rather than take them from `head`. The deciding between them is plain Python, and reads the relative change (which
`head` computes on the device) on the host: one sync per call (none with threshold 0, or while the slot has no
probe). Reading the timestep costs another where it is not a view of scheduler.timesteps (Flux's pipeline divides it
by 1000).

Memory: each slot has two tensors of the image stream's shape, the same two in every generation (`buffers`, per
input shape and slot; those of KEPT_SHAPES shapes kept): its residual, which `rest` writes and `skip` reads, and its
probe (fbcache: the first block's residual at the slot's last full call, which `rest` writes; teacache: the modulated
input of the slot's previous call, which `rest` and `skip` write). Graph capture passes both in place (GRAPH_OPTIONS:
no graph keeps a copy of either, their addresses part of the graphs' signatures), so each slot's calls have their own
graphs. `head` returns the streams after the first block (fbcache; teacache's `rest` and `skip` start from the
embeddings they compute) as its graph's own outputs, which `rest` and `skip` read in place: fbcache's third tensor of
that shape per slot (teacache has none). The probe stays the algorithm's own: both published implementations keep it
beside the residual. Were `head` to run eagerly while `rest` and `skip` are graphed (its capture failed), the streams
would come at new addresses every call, and graphs.py's eviction rule would soon run `rest` and `skip` eagerly too.
"""
from __future__ import annotations

import functools
import inspect
from collections import Counter, OrderedDict
from contextlib import contextmanager

import torch
from torch import nn

from .step_cache import HostTimesteps, Slot, Steps, relative_change

MODES = ("fbcache", "teacache")
# The model classes, and their block lists in the order their forward runs them.
BLOCK_LISTS = {"SD3Transformer2DModel": ("transformer_blocks",),
               "FluxTransformer2DModel": ("transformer_blocks", "single_transformer_blocks")}
# The default thresholds, per mode and model class, as published (quality on random weights cannot be judged here).
THRESHOLDS = {
    # diffusers' docs, optimization/para_attn.md: "0.08 is the default residual difference value for FLUX models"
    ("fbcache", "FluxTransformer2DModel"): 0.08,
    # Comfy-WaveSpeed's README (ParaAttention's authors): sd3.5_large, 30 steps, residual_diff_threshold 0.12
    ("fbcache", "SD3Transformer2DModel"): 0.12,
    # ComfyUI-TeaCache's README: rel_l1_thresh 0.4 for FLUX (~2x); ali-vilab/TeaCache's TeaCache4FLUX: 0.4 -> 1.8x
    ("teacache", "FluxTransformer2DModel"): 0.4,
    # No recommendation is published for SD3. PaddleMIX's TeaCache for SD3 Medium (ppdiffusers/examples/Fast-Diffusers/
    # Training-Free/teacache) measured 0.3 -> 1.8x on an A100, the speed-up TeaCache4FLUX reports at Flux's 0.4.
    ("teacache", "SD3Transformer2DModel"): 0.3,
}
# TeaCache's rescaling of the probe's relative change, fitted on FLUX.1 (highest power first): ali-vilab/TeaCache's
# TeaCache4FLUX/teacache_flux.py, the same numbers in ComfyUI-TeaCache's nodes.py. No polynomial was fitted for SD3;
# PaddleMIX's SD3 port applies this one unchanged, and so does rocm_sd.
TEACACHE_POLYNOMIAL = (4.98651651e+02, -2.83781631e+02, 5.58554382e+01, -3.82021401e+00, 2.64230861e-01)


# The input shapes whose slot buffers are kept (a graph captured for a shape reads and writes its buffers in place).
KEPT_SHAPES = 2


def teacache_rescale(change: float) -> float:
    """TEACACHE_POLYNOMIAL at `change` (Horner's rule)."""
    return functools.reduce(lambda total, coefficient: total * change + coefficient, TEACACHE_POLYNOMIAL, 0.0)


def check_setting(mode: str, threshold) -> tuple[str, float]:
    """(mode, threshold as a float), or a ValueError naming the bad one."""
    if mode not in MODES:
        raise ValueError(f"transformer step cache mode {mode!r} is not one of {', '.join(MODES)}")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not threshold >= 0:
        raise ValueError(f"step cache threshold {threshold!r} is not a number >= 0")
    return mode, float(threshold)


def decide(mode: str, threshold: float, slot: Slot, change, previous: torch.Tensor, last: bool = False) -> bool:
    """Whether this call adds the slot's residual (the module doc's rule of each mode): the one rule of the
    transformers' step cache, which diffusers' (DiTStepCache) and ComfyUI's (modules/comfy_dit_cache.py) both follow.
    `change`: the probe's relative change against `previous` (read only where the slot has a probe); `previous`: the
    slot's probe, which the full call (fbcache) or either call (teacache) writes; `last`: the schedule's last step."""
    ready = slot.feature is not None and slot.previous is not None and threshold > 0
    if mode == "fbcache":
        cached = ready and float(change) < threshold
        if not cached:
            slot.previous = previous   # compared with until the slot's next full call
        return cached
    if ready:
        slot.change += teacache_rescale(float(change))
    cached = ready and not last and slot.change < threshold
    slot.previous = previous
    if not cached:
        slot.change = 0.0
    return cached


def slot_buffers(buffers: OrderedDict, shapes, index: int, stream_shape, dtype: torch.dtype,
                 device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Slot `index`'s residual and probe for inputs of `shapes` out of `buffers` ((shapes, slot) -> the two, latest
    last): the same two tensors in every generation, so that the graphs that read and write them in place replay.
    `stream_shape()`: the image stream's shape, asked for where the two are made. Those of KEPT_SHAPES input shapes are
    kept."""
    key = (shapes, index)
    kept = buffers.get(key)
    if kept is None:
        shape = stream_shape()
        kept = buffers[key] = tuple(torch.empty(shape, dtype=dtype, device=device) for _ in range(2))
        if len({shapes_ for shapes_, _ in buffers}) > KEPT_SHAPES:
            oldest = next(iter(buffers))[0]
            for stale in [k for k in buffers if k[0] == oldest]:
                del buffers[stale]
    buffers.move_to_end(key)
    return kept


def dit_problem(model: nn.Module) -> str | None:
    """Why the step cache cannot serve `model`, or None when it can."""
    names = BLOCK_LISTS.get(type(model).__name__)
    if names is None or not type(model).__module__.startswith("diffusers."):
        return f"{type(model).__name__} is not diffusers' {' / '.join(BLOCK_LISTS)}"
    lists = [model._modules.get(name) for name in names]
    if not all(isinstance(blocks, nn.ModuleList) for blocks in lists):
        return f"its {' / '.join(names)} are not ModuleLists"
    if not lists[0] or sum(len(blocks) for blocks in lists) < 2:
        return "fewer than two transformer blocks"
    if not hasattr(lists[0][0], "norm1"):
        return f"its first block ({type(lists[0][0]).__name__}) has no norm1"
    return None


class _Stop(Exception):
    """Carries the head call's result out of the model's forward (which it stops at the blocks)."""

    def __init__(self, result):
        super().__init__("head call done")
        self.result = result


class _StandIn(nn.Module):
    """The model's blocks for one call: `run(*args, **block_kwargs)` in their place. The blocks stay beneath it, so
    that a walk over the model's modules during the call (diffusers' LoRA scaling) still reaches them."""

    def __init__(self, run, blocks):
        super().__init__()
        self.run = run
        self.blocks = nn.ModuleList(blocks)

    def forward(self, *args, **block_kwargs):
        return self.run(*args, **block_kwargs)


@contextmanager
def _blocks_standing_aside(model: nn.Module, run):
    """The model's block lists hold `run` as their one block, then their blocks again."""
    names = BLOCK_LISTS[type(model).__name__]
    lists = {name: model._modules[name] for name in names}
    stand_in = _StandIn(run, [block for name in names for block in lists[name]])
    # In _modules directly: setattr would register new modules on the model, which graphs.py takes for a change of the
    # model's structure (a capture again).
    model._modules.update({name: nn.ModuleList([stand_in] if i == 0 else []) for i, name in enumerate(names)})
    try:
        yield
    finally:
        model._modules.update(lists)


class DiTStepCache:
    """Installed as a transformer's `forward`: groups the call (Steps), runs `head`, decides, then runs `rest` or
    `skip` (the module doc), counting into `counts` (the model's PatchRecord counts)."""

    GRAPHED_CALLS = ("head", "rest", "skip")
    # How install_graphs graphs each call (graphs.GraphedCall's options): the slot's residual and probe are read and
    # written where they lie, and head's streams at the boundary are handed to rest / skip where head's graph left them.
    GRAPH_OPTIONS = {"head": dict(in_place=("previous",), static_outputs=True),
                     "rest": dict(in_place=("hidden", "encoder", "residual", "previous")),
                     "skip": dict(in_place=("hidden", "residual", "previous"))}

    def __init__(self, model: nn.Module, mode: str, threshold: float, counts: Counter | None = None):
        self.mode, self.threshold = check_setting(mode, threshold)
        self.model = model
        self.counts = counts if counts is not None else Counter()
        self.inner = model.__dict__.get("forward")   # an instance forward in place (accelerate's), else the class's
        self.steps = Steps()
        self.timesteps = HostTimesteps()
        self.buffers: OrderedDict = OrderedDict()   # (the inputs' shapes, slot) -> (residual, probe), latest last
        self._parameters = list(inspect.signature(type(model).forward).parameters)[1:]
        self.head, self.rest, self.skip = self.head_call, self.rest_call, self.skip_call

    def __getstate__(self) -> dict:
        """A copy gets its settings and calls, never the cached residuals of this one's generation."""
        return dict(self.__dict__, steps=Steps(), buffers=OrderedDict())

    def forget(self) -> None:
        """Drops the cached residuals and probes (revert: at once, not at a later cycle collection)."""
        self.steps.reset()
        self.buffers.clear()

    def forward(self, **kwargs):
        """The forward that was in place before the step cache."""
        if self.inner is not None:
            return self.inner(**kwargs)
        return type(self.model).forward(self.model, **kwargs)

    # -- the call -----------------------------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        kwargs.update(zip(self._parameters, args))
        why = self._uncached(kwargs)
        if why is not None:
            self.counts[f"step cache: uncached call: {why}"] += 1
            return self.forward(**kwargs)
        sample, text = kwargs["hidden_states"], kwargs.get("encoder_hidden_states")
        timestep = self.timesteps.value(kwargs["timestep"])
        position = self.timesteps.position
        last = position is not None and position[0] == position[1] - 1
        shapes = (tuple(sample.shape), sample.dtype, sample.device, None if text is None else tuple(text.shape))
        slot = self.steps.locate(timestep, shapes + (self.timesteps.copies,))
        residual, previous = self._buffers(shapes, self.steps.call, sample)
        hidden, encoder, change = self.head(previous=previous, **kwargs)
        if self._cached(slot, change, previous, last):
            self.counts["step cache: cached calls"] += 1
            return self.skip(hidden=hidden, residual=residual, previous=previous, **kwargs)
        output = self.rest(hidden=hidden, encoder=encoder, residual=residual, previous=previous, **kwargs)
        slot.feature = residual
        self.counts["step cache: full calls"] += 1
        return output

    def _uncached(self, kwargs: dict) -> str | None:
        if any(kwargs.get(name) is not None for name in
               ("block_controlnet_hidden_states", "controlnet_block_samples", "controlnet_single_block_samples")):
            return "ControlNet residuals"
        if kwargs.get("skip_layers"):
            return "skip_layers (skip-layer guidance)"
        if torch.is_grad_enabled():  # (gradient checkpointing too) a kept residual would hold the whole network's
            return "autograd is on"  # gradient history, and the slot's buffers are written in place
        return None

    def _buffers(self, shapes: tuple, index: int, sample: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Slot `index`'s residual and probe for inputs of `shapes`: the same two tensors in every generation, so that
        the graphs that read and write them in place replay (those of KEPT_SHAPES input shapes are kept)."""
        return slot_buffers(self.buffers, shapes, index, lambda: self._stream_shape(sample), sample.dtype,
                            sample.device)

    def _stream_shape(self, sample: torch.Tensor) -> tuple[int, ...]:
        """The image stream's shape inside the blocks for the input `sample`: (batch, tokens, inner dim)."""
        if type(self.model).__name__ == "SD3Transformer2DModel":  # (batch, channels, height, width), patchified
            patch = self.model.config.patch_size
            tokens = (sample.shape[-2] // patch) * (sample.shape[-1] // patch)
        else:                                                   # Flux: (batch, tokens, channels), packed
            tokens = sample.shape[1]
        return (sample.shape[0], tokens, self.model.inner_dim)

    def _cached(self, slot: Slot, change, previous: torch.Tensor, last: bool = False) -> bool:
        """decide() with this cache's mode and threshold."""
        return decide(self.mode, self.threshold, slot, change, previous, last)

    # -- the three calls (graph capture replaces them with graphed ones) ---------------------------------------
    def _blocks(self) -> list[nn.Module]:
        return [block for name in BLOCK_LISTS[type(self.model).__name__] for block in self.model._modules[name]]

    @staticmethod
    def _probe(first: nn.Module, hidden_states: torch.Tensor, block_kwargs: dict) -> torch.Tensor:
        """TeaCache's probe: the first block's AdaLN-modulated input."""
        return first.norm1(hidden_states, emb=block_kwargs["temb"])[0]

    def head_call(self, previous: torch.Tensor, **kwargs):
        """The model's forward up to its blocks, then the first block (fbcache) or its norm1 (teacache): (the image
        and text streams after the first block, None for teacache, and the probe's change against `previous`)."""
        first = self._blocks()[0]

        def run(hidden_states, encoder_hidden_states, **block_kwargs):
            if self.mode == "fbcache":
                encoder, hidden = first(hidden_states=hidden_states, encoder_hidden_states=encoder_hidden_states,
                                        **block_kwargs)
                raise _Stop((hidden, encoder, relative_change(hidden - hidden_states, previous)))
            raise _Stop((None, None, relative_change(self._probe(first, hidden_states, block_kwargs), previous)))

        with _blocks_standing_aside(self.model, run):
            try:
                self.forward(**kwargs)
            except _Stop as stop:
                return stop.result
        raise RuntimeError("step cache: the transformer's forward returned without calling its blocks")

    def rest_call(self, hidden: torch.Tensor | None, encoder: torch.Tensor | None, residual: torch.Tensor,
                  previous: torch.Tensor, **kwargs):
        """The model's forward with the blocks after the boundary run on head's streams (fbcache) or the forward's own
        (teacache); writes the residual of those blocks on the image stream into `residual` and the probe into
        `previous`. Returns the output."""
        blocks = self._blocks()
        first, blocks = blocks[0], blocks[1 if self.mode == "fbcache" else 0:]

        def run(hidden_states, encoder_hidden_states, **block_kwargs):
            if self.mode == "fbcache":
                torch.sub(hidden, hidden_states, out=previous)   # head's probe, as head computed it
                h, e = hidden, encoder
            else:
                previous.copy_(self._probe(first, hidden_states, block_kwargs))
                h, e = hidden_states, encoder_hidden_states
            for block in blocks:
                e, h = block(hidden_states=h, encoder_hidden_states=e, **block_kwargs)
            torch.sub(h, hidden if self.mode == "fbcache" else hidden_states, out=residual)
            return e, h

        with _blocks_standing_aside(self.model, run):
            return self.forward(**kwargs)

    def skip_call(self, hidden: torch.Tensor | None, residual: torch.Tensor, previous: torch.Tensor, **kwargs):
        """The model's forward with its blocks replaced by adding `residual` to head's image stream (fbcache) or the
        forward's own (teacache, which also writes the probe into `previous`)."""
        first = self._blocks()[0]

        def run(hidden_states, encoder_hidden_states, **block_kwargs):
            if self.mode == "fbcache":
                return encoder_hidden_states, hidden + residual
            previous.copy_(self._probe(first, hidden_states, block_kwargs))
            return encoder_hidden_states, hidden_states + residual

        with _blocks_standing_aside(self.model, run):
            return self.forward(**kwargs)
