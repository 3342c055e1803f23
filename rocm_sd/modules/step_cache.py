"""Step caching of a UNet (DeepCache, arXiv 2312.00858; an adaptive variant after TeaCache, arXiv 2411.19108).

Adjacent denoising steps change a UNet's deep features little. A full call runs the whole UNet and keeps one hidden
state of the up path; a partial call runs only the outermost branch around it and reuses the kept one. Which branch
is the `branch` (DeepCache's cache_branch_id, within the outermost block): b layers of down_blocks[0] run fresh,
and up_blocks[-1] from its mirror layer on, the layer len(up_blocks[-1].resnets) - 1 - b, whose skips those b
layers and conv_in give. Branch 0 (DeepCache's default, and that of its published 2.3x / 2.6x): no down layer,
only up_blocks[-1]'s last layer, whose skip is conv_in's output. Branch 1: down_blocks[0]'s first layer and the
last two up layers. Branch 2 in SD1.x/2.x/SDXL UNets (two layers per block): the whole outermost block both ways,
the cached state being up_blocks[-1]'s input. A partial call: conv_in and the time embedding (and all other
conditioning) as the model's own forward computes them, the branch's down layers (resnet, and attention where the
block has it), up_blocks[-1] from the mirror layer on with the cached hidden state and the fresh skips, then
conv_norm_out / conv_act / conv_out. It calls the model's own modules, so whatever else rocm_sd patched in them runs
too.

Which calls are full (Schedule): calls are grouped by timestep. A call whose timestep equals the current step's joins
that step; the k-th call of a step (classifier-free guidance run as separate cond / uncond calls) uses cache slot k,
with its own cached feature. A lower timestep starts the next step; a timestep that is not lower than the current
step's (or an input sample of another shape, dtype or device) starts a new generation: step 0, every slot empty; so
does, in a diffusers pipeline, a timestep taken from another scheduler.timesteps tensor (set_timesteps ran again), and
a call past the MAX_SLOTS-th of a step (runs of one step, called again, all have the same timestep). With mode
'deepcache', step i (from 0) is full when i % interval == 0. With mode 'adaptive', step 0 is full, then a slot's call
is full when the relative L1 change of the UNet's input sample, mean|x - x_prev| / mean|x_prev| (x_prev: the slot's
input at its previous call), summed since the slot's last full call, reaches the threshold; else partial. A call also
runs in full where a partial one cannot (no cached feature in its slot, a T2I-Adapter's residuals); the record's
counts say why. The last step is not special: the controller sees calls, not the scheduler, and DeepCache does not
special-case it either.

Host syncs: deepcache decides on host values only. A timestep that is a view of a one-dimensional GPU tensor (a
diffusers pipeline iterating scheduler.timesteps) is read from one host copy of that tensor, taken once per
schedule; any other GPU timestep is read per call (one host sync). Adaptive reads its change on the host: one sync
per call (after the first step), which waits for the GPU's queued work.

Graphs: the controller's two calls, `full` (returns the output and the feature) and `partial` (takes the feature),
are attributes that patch/diffusers.py's install_graphs replaces with graphed calls (`GRAPHED_CALLS`); the deciding
above stays plain Python around them.

Two hosts: UNetStepCache, a diffusers UNet2DConditionModel's forward; ComfyStepCache, the model_function_wrapper of
a ComfyUI model with a UNetModel (patch/comfy_graph.py's GraphedModelFunction graphs its two calls). StepCache,
their base, holds the deciding.
"""
from __future__ import annotations

import functools
import inspect
import weakref
from collections import Counter
from dataclasses import dataclass

import torch
from torch import nn

MODES = ("deepcache", "adaptive")


# ---- which calls are full --------------------------------------------------------------------------------------

@dataclass
class Slot:
    """One cache slot: the k-th call of each step."""
    feature: torch.Tensor | None = None    # from the slot's last full call: the hidden state a partial call starts
                                           # from (a UNet's), the residual a cached call adds (a transformer's)
    previous: torch.Tensor | None = None   # what the next call compares with: the slot's input sample at its previous
                                           # call (adaptive), the transformer's probe (modules/dit_cache.py)
    change: float = 0.0                    # summed relative change since the slot's last full call


def relative_change(sample: torch.Tensor, previous: torch.Tensor, groups: int = 1) -> torch.Tensor:
    """mean|sample - previous| / mean|previous|, a 0-d float32 tensor on their device (a graph can compute it).
    groups > 1: the batch as that many equal groups (a ComfyUI call's [cond, uncond] entries), each's own relative
    change, and the largest of them: a batch changed little only where every group did."""
    sample, previous = sample.float(), previous.float()
    if groups > 1:
        sample, previous = sample.reshape(groups, -1), previous.reshape(groups, -1)
        return ((sample - previous).abs().mean(1) / previous.abs().mean(1).clamp_min(1e-12)).max()
    return (sample - previous).abs().mean() / previous.abs().mean().clamp_min(1e-12)


def relative_l1(sample: torch.Tensor, previous: torch.Tensor) -> float:
    """relative_change read on the host (one sync for GPU tensors)."""
    return relative_change(sample, previous).item()


# Calls of one step at most. One more at the same timestep starts a new generation: a pipeline run of one step,
# called again, hands the model the same timestep, and must not add a slot (a cached feature) per run.
MAX_SLOTS = 4


class Steps:
    """Groups calls into generations, steps and slots (the module doc's grouping); the transformers' step cache
    (modules/dit_cache.py) shares it."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.timestep: float | None = None   # the current step's
        self.key = None                      # the input sample's shape, dtype and device in this generation
        self.step = 0                        # the current step's index in its generation
        self.call = 0                        # calls of the current step so far, less one: the slot of the latest
        self.slots: list[Slot] = []

    def locate(self, timestep: float, key) -> Slot:
        """The slot of a call at `timestep` with inputs of `key`, starting a new step or generation where it does."""
        if self.timestep is None or key != self.key or timestep > self.timestep or (
                timestep == self.timestep and self.call + 1 >= MAX_SLOTS):
            self.reset()
            self.key = key
        elif timestep < self.timestep:
            self.step, self.call = self.step + 1, 0
        else:
            self.call += 1
        self.timestep = timestep
        while len(self.slots) <= self.call:
            self.slots.append(Slot())
        return self.slots[self.call]


class Schedule(Steps):
    """Groups calls into generations, steps and slots, and decides which are full (the module doc)."""

    def __init__(self, mode: str, interval: int = 3, threshold: float = 0.15):
        if mode not in MODES:
            raise ValueError(f"step cache mode {mode!r} is not one of {', '.join(MODES)}")
        self.mode, self.interval, self.threshold = mode, int(interval), float(threshold)
        super().__init__()

    def plan(self, timestep: float, key, sample: torch.Tensor | None = None) -> tuple[Slot, bool]:
        """The slot of this call and whether the schedule wants it full. `sample`: the UNet's input (adaptive)."""
        slot = self.locate(timestep, key)
        if self.mode == "deepcache":
            return slot, self.step % self.interval == 0
        full = self.step == 0 or slot.previous is None or self.threshold <= 0
        if not full:
            slot.change += relative_l1(sample, slot.previous)
            full = slot.change >= self.threshold
        slot.previous = sample.detach().clone()
        if full:
            slot.change = 0.0
        return slot, full


def refresh(slot: Slot, feature: torch.Tensor) -> None:
    """A full call ran for `slot`: its feature is new, and the adaptive change counts from here."""
    slot.feature = feature
    slot.change = 0.0


class HostTimesteps:
    """A timestep's value on the host, without waiting for the GPU where the value is already known there.

    diffusers' pipelines iterate `scheduler.timesteps`, a GPU tensor: each step's timestep is a view of it. Its
    values are copied to the host once (kept while that tensor lives and is not written; `copies` counts the
    tensors copied), and a view is read by its offset. A GPU timestep of any other kind costs a host sync per call
    (counted in `syncs`). `position`: where the latest value read stands in its schedule, (index, number of
    timesteps), or None where it was not a view of one."""

    def __init__(self):
        self._base = None       # weak reference to the tensor whose host copy `_values` is
        self._version = -1
        self._values: list = []
        self.syncs = 0
        self.copies = 0         # host copies taken: a new one means a new schedule (set_timesteps ran again)
        self.position: tuple[int, int] | None = None

    def __getstate__(self) -> dict:
        return {}

    def __setstate__(self, state: dict) -> None:
        self.__init__()

    def value(self, t) -> float:
        self.position = None
        if not isinstance(t, torch.Tensor):
            return float(t)
        known = self.view_value(t)
        if known is not None:
            return known
        self.syncs += t.device.type != "cpu"
        return float(t.reshape(-1)[0])

    def view_value(self, t: torch.Tensor) -> float | None:
        """The value of `t`, one element of a one-dimensional tensor (or that element expanded, as diffusers' SD3
        pipeline passes `t.expand(batch)`), from a host copy of that tensor (taken now if this one has none of it as
        it is); None where `t` is not such a view."""
        base = t._base
        if (base is None or t.numel() == 0 or any(stride for stride in t.stride()) and t.numel() != 1
                or base.dim() != 1 or base.stride() != (1,) or base.dtype != t.dtype):
            return None
        if self._base is None or self._base() is not base or self._version != base._version:
            self._values = base.tolist()
            self._base, self._version = weakref.ref(base), base._version
            self.copies += 1
        index = t.storage_offset() - base.storage_offset()
        self.position = (index, len(self._values))
        return float(self._values[index])


# ---- diffusers' UNet2DConditionModel --------------------------------------------------------------------------

def check_branch(branch) -> int:
    """`branch` (the module doc) as an int, or a ValueError naming it."""
    if isinstance(branch, bool) or not isinstance(branch, int) or branch < 0:
        raise ValueError(f"step cache branch {branch!r} is not an integer >= 0")
    return branch


def unet_problem(model: nn.Module, branch: int = 0) -> str | None:
    """Why a UNet2DConditionModel's structure does not allow the partial call of `branch`, or None when it does."""
    names = {"DownBlock2D", "CrossAttnDownBlock2D", "UpBlock2D", "CrossAttnUpBlock2D"}
    down, up = getattr(model, "down_blocks", None), getattr(model, "up_blocks", None)
    if not down or not up or len(down) < 2 or len(up) != len(down):
        return "fewer than two down blocks, or not as many up blocks as down blocks"
    first, last = down[0], up[-1]
    for block in (first, last):
        if type(block).__name__ not in names or type(block).__module__ != "diffusers.models.unets.unet_2d_blocks":
            return f"outermost block {type(block).__name__} (not one of diffusers' {', '.join(sorted(names))})"
    if len(last.resnets) != len(first.resnets) + 1 or last.upsamplers is not None:
        return "up_blocks[-1] has an upsampler, or not one layer more than down_blocks[0]"
    if branch > len(first.resnets):
        return f"branch {branch} is deeper than down_blocks[0]'s {len(first.resnets)} layers"
    if hasattr(last, "attentions") and not hasattr(first, "attentions"):
        return "up_blocks[-1] has attention but down_blocks[0] has not (its conditioning is not at hand)"
    if type(getattr(model, "conv_in", None)) is not nn.Conv2d:
        return "conv_in is not a plain nn.Conv2d"
    return None


def _freeu(block: nn.Module) -> bool:
    """Whether FreeU is on in this up block (diffusers' own test, in its forward)."""
    return bool(all(getattr(block, name, None) for name in ("s1", "s2", "b1", "b2")))


class _PartialDone(Exception):
    """Carries the partial call's result out of the model's forward (which it stops at down_blocks[0])."""

    def __init__(self, sample):
        super().__init__("partial call done")
        self.sample = sample


class StepCache:
    """The deciding both hosts share: per call, the schedule's slot and wish, the reasons a partial call cannot run
    (its slot has no feature yet, or the host's own reasons), then the full or the partial call. Counts 'step cache:
    full calls' / 'step cache: partial calls' and 'step cache: full call instead of partial: <why>' into `counts`.

    The two calls are the attributes `full` (returns the output and the feature) and `partial` (takes the feature
    first); GRAPHED_CALLS names them for graph capture, which replaces them with graphed calls."""

    GRAPHED_CALLS = ("full", "partial")

    def __init__(self, mode: str, interval: int = 3, threshold: float = 0.15, counts: Counter | None = None,
                 branch: int = 0):
        self.schedule = Schedule(mode, interval, threshold)
        self.branch = check_branch(branch)
        self.counts = counts if counts is not None else Counter()
        self.full = self.full_call
        self.partial = self.partial_call

    def __getstate__(self) -> dict:
        """A copy gets its settings and calls, never the cached features of this one's generation."""
        state = dict(self.__dict__)
        state["schedule"] = Schedule(self.schedule.mode, self.schedule.interval, self.schedule.threshold)
        return state

    def forget(self) -> None:
        """Drops the cached features and the schedule's state (revert: at once, not at a later cycle collection)."""
        self.schedule.reset()

    def run(self, timestep: float, key, sample: torch.Tensor, no_partial, full, partial):
        """One call: `no_partial()` says why this call cannot be partial (or None), `full()` runs it in full and
        returns (output, feature), `partial(feature)` runs it partially."""
        slot, wanted = self.schedule.plan(timestep, key, sample)
        if not wanted:
            why = "no cached feature in this call's slot yet" if slot.feature is None else no_partial()
            if why:
                self.counts[f"step cache: full call instead of partial: {why}"] += 1
                wanted = True
        if wanted:
            output, feature = full()
            refresh(slot, feature)
            self.counts["step cache: full calls"] += 1
            return output
        self.counts["step cache: partial calls"] += 1
        return partial(slot.feature)

    def full_call(self, *args, **kwargs):
        raise NotImplementedError

    def partial_call(self, feature, *args, **kwargs):
        raise NotImplementedError


class UNetStepCache(StepCache):
    """Installed as a diffusers UNet2DConditionModel's `forward`: decides per call (StepCache.run), then runs `full`
    or `partial` (the module doc), counting into `counts` (the model's PatchRecord counts).

    Both calls run the forward that was in place before (diffusers' own, or an accelerate offload wrapper around
    it), so that everything it does around the blocks happens as usual: the time, class and added (SDXL text_time)
    embeddings, encoder_hidden_states projections, attention masks, GLIGEN, LoRA scaling of cross_attention_kwargs.
    The full call reads the cached feature with a temporary hook; the partial call stops the forward where it calls
    down_blocks[0], with a temporary pre-hook that runs the outermost branch on the block's arguments."""

    def __init__(self, model: nn.Module, mode: str, interval: int = 3, threshold: float = 0.15,
                 counts: Counter | None = None, branch: int = 0):
        super().__init__(mode, interval, threshold, counts, branch)
        self.model = model
        self.inner = model.__dict__.get("forward")   # an instance forward in place (accelerate's), else the class's
        self.timesteps = HostTimesteps()
        self._parameters = list(inspect.signature(type(model).forward).parameters)[1:]

    @property
    def mirror(self) -> int:
        """The layer of up_blocks[-1] the partial call starts at (the module doc), whose input the full call keeps."""
        return len(self.model.up_blocks[-1].resnets) - 1 - self.branch

    # -- the call -----------------------------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        kwargs.update(zip(self._parameters, args))
        sample = kwargs["sample"]
        timestep = self.timesteps.value(kwargs["timestep"])
        # A new scheduler.timesteps tensor is a new generation too: an interrupted run followed by one that starts
        # at a lower timestep must not reuse its features.
        key = (tuple(sample.shape), sample.dtype, sample.device, self.timesteps.copies)
        return self.run(timestep, key, sample, lambda: self._no_partial(kwargs), lambda: self.full(**kwargs),
                        lambda feature: self.partial(feature, **kwargs))

    def _no_partial(self, kwargs: dict) -> str | None:
        if kwargs.get("down_intrablock_additional_residuals") is not None or (
                kwargs.get("down_block_additional_residuals") is not None
                and kwargs.get("mid_block_additional_residual") is None):
            return "T2I-Adapter residuals"
        return None

    def forward(self, **kwargs):
        """The forward that was in place before the step cache."""
        if self.inner is not None:
            return self.inner(**kwargs)
        return type(self.model).forward(self.model, **kwargs)

    # -- the two calls (graph capture replaces them with graphed ones) -----------------------------------------
    def full_call(self, **kwargs):
        """The whole UNet: (its output, the hidden state entering up_blocks[-1]'s mirror layer)."""
        kept = []
        last, mirror = self.model.up_blocks[-1], self.mirror
        # FreeU scales the up path's hidden state in place (apply_freeu, in the two coarsest up blocks): keep a copy
        copy = torch.clone if _freeu(last) else (lambda tensor: tensor)
        if mirror == 0:  # the up block's own input
            def keep(module, args, block_kwargs):
                kept.append(copy(block_kwargs["hidden_states"] if "hidden_states" in block_kwargs else args[0]))
            handle = last.register_forward_pre_hook(keep, with_kwargs=True)
        else:            # the output of the layer before the mirror layer
            def keep(module, args, output):
                kept.append(copy(output[0] if isinstance(output, tuple) else getattr(output, "sample", output)))
            before = last.attentions[mirror - 1] if hasattr(last, "attentions") else last.resnets[mirror - 1]
            handle = before.register_forward_hook(keep)
        try:
            output = self.forward(**kwargs)
        finally:
            handle.remove()
        if len(kept) != 1:
            raise RuntimeError(f"step cache: the UNet's forward ran up_blocks[-1] layer {mirror} {len(kept)} times")
        return output, kept[0]

    def partial_call(self, feature: torch.Tensor, **kwargs):
        """conv_in, the embeddings, the branch's layers of down_blocks[0], up_blocks[-1] from the mirror layer on
        with `feature`, and the output layers; ControlNet residuals added to the skips it uses."""
        residuals = kwargs.pop("down_block_additional_residuals", None)
        kwargs.pop("mid_block_additional_residual", None)

        def run(block, args, block_kwargs):
            raise _PartialDone(self._outer_branch(feature, residuals, args, block_kwargs))

        handle = self.model.down_blocks[0].register_forward_pre_hook(run, with_kwargs=True)
        try:
            self.forward(**kwargs)
        except _PartialDone as done:
            sample = done.sample
        else:
            raise RuntimeError("step cache: the UNet's forward returned without calling down_blocks[0]")
        finally:
            handle.remove()
        if not kwargs.get("return_dict", True):
            return (sample,)
        from diffusers.models.unets.unet_2d_condition import UNet2DConditionOutput

        return UNet2DConditionOutput(sample=sample)

    def _outer_branch(self, feature, residuals, args, block_kwargs) -> torch.Tensor:
        """What the partial call computes, from down_blocks[0]'s arguments as the forward passes them."""
        model = self.model
        first, last = model.down_blocks[0], model.up_blocks[-1]
        hidden = block_kwargs["hidden_states"] if "hidden_states" in block_kwargs else args[0]
        temb = block_kwargs["temb"] if "temb" in block_kwargs else (args[1] if len(args) > 1 else None)
        conditioning = {name: block_kwargs.get(name) for name in
                        ("encoder_hidden_states", "cross_attention_kwargs", "attention_mask", "encoder_attention_mask")}

        def layer(block, index, h):
            h = block.resnets[index](h, temb)
            if hasattr(block, "attentions"):
                h = block.attentions[index](h, **conditioning, return_dict=False)[0]
            return h

        skips = [hidden]  # conv_in's output, then the branch's down layers' outputs
        for index in range(self.branch):
            skips.append(layer(first, index, skips[-1]))
        if residuals is not None:  # ControlNet: added to every skip, as the forward does; the first ones are used here
            skips = [skip + residual for skip, residual in zip(skips, residuals)]
        freeu = _freeu(last)
        h = feature.clone() if freeu else feature  # apply_freeu writes into it: the cache must stay as it is
        for index in range(self.mirror, len(last.resnets)):
            skip = skips.pop()
            if freeu:
                from diffusers.utils.torch_utils import apply_freeu

                h, skip = apply_freeu(last.resolution_idx, h, skip, s1=last.s1, s2=last.s2, b1=last.b1, b2=last.b2)
            h = layer(last, index, torch.cat([h, skip], dim=1))
        if model.conv_norm_out is not None:
            h = model.conv_act(model.conv_norm_out(h))
        return model.conv_out(h)


# ---- ComfyUI's UNetModel (comfy/ldm/modules/diffusionmodules/openaimodel.py) ----------------------------------

def comfy_unet_problem(diffusion_model: nn.Module, branch: int = 0) -> str | None:
    """Why a ComfyUI diffusion model's structure does not allow the partial call of `branch`, or None when it does."""
    inputs, outputs = getattr(diffusion_model, "input_blocks", None), getattr(diffusion_model, "output_blocks", None)
    if inputs is None or outputs is None or not hasattr(diffusion_model, "out"):
        return f"{type(diffusion_model).__name__} is not a UNet of input, middle and output blocks"
    if len(inputs) < branch + 2 or len(outputs) != len(inputs):
        return f"fewer than {branch + 2} input blocks, or not as many output blocks as input blocks"
    if getattr(diffusion_model, "predict_codebook_ids", False):
        return "the UNet predicts codebook ids"
    if not all(len(block) for block in (*inputs[1:branch + 2], *outputs[-branch - 2:])):
        return "an empty block"
    # the branch stays in the outermost level: no downsampling before its last input block, no upsampling in its
    # output blocks (a Downsample / Upsample layer, or a ResBlock that resamples: resblock_updown)
    resampling = [type(layer).__name__ for block in (*inputs[1:branch + 1], *outputs[-branch - 1:]) for layer in block
                  if type(layer).__name__ in ("Downsample", "Upsample") or getattr(layer, "updown", False)]
    if resampling:
        return f"branch {branch} is deeper than the outermost level (it would cross a {resampling[0]})"
    return None


class ComfyStepCache(StepCache):
    """ComfyUI's model_function_wrapper(apply_model, {"input", "timestep", "c", "cond_or_uncond"}) for a UNetModel
    (SD1.x/2.x/SDXL): decides per evaluation (StepCache.run), then evaluates the model in full or partially.

    input_blocks[0] is conv_in, input_blocks[1:] the layers; with branch b the partial call runs input_blocks[1:b + 1]
    and output_blocks[-b - 1:] (the module doc). A full call evaluates the model (apply_model) and keeps the hidden
    state entering output_blocks[-b - 1] (the output of output_blocks[-b - 2]'s last layer, read with a temporary
    hook). A partial call evaluates the model (apply_model, so the sampler's input and output scaling run as usual)
    with the diffusion model's forward replaced, for the call, by one that runs the model's own forward until it
    reaches input_blocks[b + 1] (time and label embeddings, input blocks 0 to b with their control and patches, as the
    host computes them), stops it there, and then runs output_blocks[-b - 1:] on the cached hidden state and the
    fresh skips as the host's forward does (output control, output_block_patch patches), then `out`.

    The timestep is the sampler's sigma, a GPU tensor made per call: reading it costs one host sync per call. Calls
    run in full where a partial one would skip work others asked for: transformer patches after the skip
    (input_block_patch_after_skip) and diffusion-model wrappers (which run around the whole UNet)."""

    def __init__(self, mode: str, interval: int = 3, threshold: float = 0.15, counts: Counter | None = None,
                 branch: int = 0):
        super().__init__(mode, interval, threshold, counts, branch)
        self.timesteps = HostTimesteps()

    def __deepcopy__(self, memo):
        # ModelPatcher.clone() deep-copies model_options: its clones share the model, and this one controller.
        return self

    @property
    def stats(self) -> Counter:
        return self.counts

    def __call__(self, apply_model, args: dict, full=None, partial=None):
        """`full(model, x, t, c)` / `partial(model, x, t, c, feature)`: the calls to make (graphed ones), by
        default this controller's own."""
        model = getattr(apply_model, "__self__", None)
        x, t, c = args["input"], args["timestep"], args["c"]
        problem = "apply_model is not a bound method of a model" if model is None else \
            comfy_unet_problem(model.diffusion_model, self.branch)
        if problem is not None:
            self.counts[f"step cache not applied: {problem}"] += 1
            return apply_model(x, t, **c)
        full, partial = full or self.full, partial or self.partial
        key = (tuple(x.shape), x.dtype, x.device)
        return self.run(self.timesteps.value(t), key, x, lambda: self._no_partial(c), lambda: full(model, x, t, c),
                        lambda feature: partial(model, x, t, c, feature))

    @staticmethod
    def _no_partial(conditioning: dict) -> str | None:
        options = conditioning.get("transformer_options") or {}
        if (options.get("patches") or {}).get("input_block_patch_after_skip"):
            return "an input_block_patch_after_skip transformer patch"
        if any((options.get("wrappers") or {}).get("diffusion_model", {}).values()):
            return "a diffusion_model wrapper"
        return None

    def full_call(self, model, x, t, c):
        """The whole evaluation: (its output, the hidden state entering output_blocks[-branch - 1])."""
        kept = []
        last = model.diffusion_model.output_blocks[-self.branch - 2][-1]
        # an output_block_patch (FreeU) may scale the hidden state in place at output_blocks[-branch - 1]: keep a copy
        patched = ((c.get("transformer_options") or {}).get("patches") or {}).get("output_block_patch")
        copy = torch.clone if patched else (lambda tensor: tensor)
        handle = last.register_forward_hook(lambda module, args, output: kept.append(copy(output)))
        try:
            output = model.apply_model(x, t, **c)
        finally:
            handle.remove()
        if len(kept) != 1:
            raise RuntimeError(f"step cache: the UNet ran output_blocks[{-self.branch - 2}] {len(kept)} times")
        return output, kept[0]

    def partial_call(self, model, x, t, c, feature):
        """The evaluation with the diffusion model's forward running only its outermost branch on `feature`."""
        diffusion_model = model.diffusion_model
        inner = diffusion_model.__dict__.get("forward")
        outer = functools.partial(_comfy_outer_branch, diffusion_model, inner, self.branch, feature)
        diffusion_model.forward = outer
        try:
            return model.apply_model(x, t, **c)
        finally:
            if inner is None:
                del diffusion_model.forward
            else:
                diffusion_model.forward = inner


def _comfy_outer_branch(diffusion_model, inner, branch, feature, x, timesteps=None, context=None, y=None, control=None,
                        transformer_options={}, **kwargs):
    """ComfyStepCache's partial forward of a UNetModel: the model's own forward (`inner`, else its class's) up to
    input_blocks[branch + 1], then output_blocks[-branch - 1:] on `feature` and `out`."""
    blocks = diffusion_model.input_blocks
    seen = {"skips": []}

    def skip(module, args):     # input_blocks[i]'s first layer: input_blocks[i - 1]'s output (conv_in's for i = 1)
        seen["skips"].append(args[0])
        if len(seen["skips"]) == 1:  # and the time embedding
            seen["emb"] = args[1] if len(args) > 1 else None
        if len(seen["skips"]) == branch + 1:
            raise _PartialDone(None)

    handles = [blocks[i][0].register_forward_pre_hook(skip) for i in range(1, branch + 2)]
    forward = inner or functools.partial(type(diffusion_model).forward, diffusion_model)
    try:
        forward(x, timesteps, context=context, y=y, control=control, transformer_options=transformer_options, **kwargs)
    except _PartialDone:
        pass
    else:
        raise RuntimeError(f"step cache: the UNet's forward returned without reaching input_blocks[{branch + 1}]")
    finally:
        for handle in handles:
            handle.remove()
    skips, emb = seen["skips"], seen["emb"]
    patches = (transformer_options.get("patches") or {}).get("output_block_patch") or []
    h = feature.clone() if patches else feature  # the patches may write into it: the cache must stay as it is
    outputs = diffusion_model.output_blocks
    count = len(outputs)
    # The transformer layers the full forward would have run before output_blocks[-branch - 1] (its bookkeeping).
    transformer_options["transformer_index"] = sum(
        hasattr(layer, "transformer_blocks")
        for block in [*blocks, diffusion_model.middle_block, *outputs[:count - branch - 1]] for layer in block)
    controls = (control or {}).get("output") or []
    for index in range(count - branch - 1, count):
        transformer_options["block"] = ("output", index)
        hsp = skips.pop()
        at = len(controls) - 1 - index  # the full forward pops one per output block, from the end
        if at >= 0 and controls[at] is not None:
            hsp = hsp + controls[at]
        for patch in patches:
            h, hsp = patch(h, hsp, transformer_options)
        h = torch.cat([h, hsp], dim=1)
        h = outputs[index](h, emb, context, transformer_options, skips[-1].shape if skips else None)
    return diffusion_model.out(h.type(x.dtype))
