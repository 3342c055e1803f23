"""Step caching of ComfyUI's diffusion transformers, SD3 / SD3.5 (comfy/ldm/modules/diffusionmodules/mmdit.py, MMDiT)
and Flux (comfy/ldm/flux/model.py): First Block Cache ('fbcache') and TeaCache ('teacache') as the ComfyUI node's
cache option; and of Forge's Flux (backend/nn/flux.py, whose ModelPatcher and sampler call the model_function_wrapper
as ComfyUI's do) as the A1111 extension's on its Forge path. What is computed, and which calls are cached, is
modules/dit_cache.py's (its module doc): the same boundary in the block stack, the same probes, the same rule
(dit_cache.decide), the same published thresholds.

ComfyDiTStepCache is the patcher's model_function_wrapper (or the step cache inside patch/comfy_graph.py's, which
graphs its calls): per evaluation it groups the call (step_cache.Steps: the timestep is the sampler's sigma), runs
`head`, decides, then runs `rest` or `skip`. Each call is the evaluation itself, model.apply_model(x, t, **c), so that
the sampler's input and output scaling and everything the model's forward does around its blocks happen as usual
(patchify, embeddings, guidance embedding, rope, SD3's registers and unpatchify, Flux Kontext's reference latents, the
fp16 clamp between Flux's block lists), with each of the forward's block lists standing aside for one stand-in for the
call. MMDiT's forward iterates joint_blocks; Flux's double_blocks, then (on the text and image rows joined)
single_blocks. The first list's stand-in does the boundary's work (head: the first block, or its AdaLN-modulated input,
and the probe's change; rest: the remaining blocks of that list; skip: nothing); the last list's adds or writes the
residual of the image stream, the image rows being the last of Flux's joined rows. Where the forward keeps a block
index in transformer_options (newer ComfyUI's Flux), the stand-ins keep it true for the blocks they run.

CFG: the sampler's call carries cond_or_uncond, the batch's entries (cond, uncond, in equal parts of the batch).
A batched [cond, uncond] call is one decision, cached only where every entry's probe changed less than the threshold
(step_cache.relative_change's groups: the largest entry's change), its residual the batch's, each entry its own rows.
Split calls at one sigma are slots of one step, each with its own residual and probe; a slot whose call was another
entry at its last step (the sampler batched differently) starts again with a full call. Guidance-distilled Flux (dev,
at CFG 1: one call per step) takes its guidance into the time embedding, which the probe and the final layer read.

A new sampling run starts fresh (step_cache.Steps' grouping, plus comfy_sigmas.SamplingRuns): a sigma that does not
go down, a new schedule tensor in transformer_options["sample_sigmas"], or the schedule's first sigma. The schedule
also says which evaluation is the run's last: teacache runs it in full, as TeaCache does. Forge's sampler puts no
schedule there: a sigma that does not go down starts a run, the last evaluation is decided like the others (as in
diffusers' Flux), and the extension installs a new cache before each of Forge's samplings besides.

Calls run uncached (the `plain` call: the evaluation as it is, the cache untouched) with ControlNet residuals, other
nodes' transformer patches or 'dit' block replace patches (ComfyUI indexes those by block, and they may count on every
block running), wrappers inside the model call (APPLY_MODEL / DIFFUSION_MODEL: they would run once per call of the
three), autograd on, or a model of another structure than the one installed for.

Graphs: GRAPHED_CALLS (head, rest, skip, plain) are each their own graphed call in patch/comfy_graph.py, with the
buffers passed in place as in diffusers' step cache (GRAPH_OPTIONS); the deciding is plain Python between them. Host
syncs per call: the sigma (a GPU tensor the sampler makes per call, as for the UNet step cache), and the probe's change
(none at threshold 0, or while the slot has no probe); the schedule's values once per run.

Memory, per slot and input shape (KEPT_SHAPES shapes kept): the residual and the probe, tensors of the image stream's
shape and dtype, which one call per new input shape learns from the forward itself (the embeddings once more) before
the first head call; fbcache also holds head's image and text streams after the first block until rest or skip reads
them (with graphs: head's graph outputs). Revert: the node patches a clone, and the block lists are the model's own
again after every call; ComfyUI's unload (ON_DETACH with unpatch_all) drops the residuals.
"""
from __future__ import annotations

from collections import Counter, OrderedDict
from contextlib import contextmanager

import torch
from torch import nn
from torch.utils import _pytree as pytree

from . import dit_cache
from .comfy_sigmas import SamplingRuns
from .dit_cache import _StandIn, _Stop, decide, slot_buffers
from .step_cache import HostTimesteps, Steps, relative_change

MODES = dit_cache.MODES


class _Unfollowed(Exception):
    """The forward called its blocks in a way this module does not follow (another ComfyUI version)."""


def _at_block(options, index: int, total: int) -> None:
    """transformer_options' block bookkeeping, where the forward keeps it, for the block about to run."""
    if isinstance(options, dict) and "block_index" in options:
        options["block_index"], options["total_blocks"] = index, total


class _MMDiT:
    """MMDiT.forward_core_with_concat: joint_blocks[i](context, x, c=c_mod, use_checkpoint=..., transformer_options=...)
    -> (context, x); then final_layer(x, c_mod)."""

    name = "SD3 / SD3.5 (MMDiT)"
    twin = "SD3Transformer2DModel"  # diffusers' class of the same model, whose published thresholds apply
    lists = ("joint_blocks",)

    @staticmethod
    def enter(args, kwargs):
        """(image stream, text stream, call(block, image, text) -> (image, text), the other arguments) of a call of
        the first list's block."""
        if len(args) < 2:
            raise _Unfollowed("MMDiT's joint blocks were not called as block(context, x, ...)")
        context, x, more = args[0], args[1], args[2:]

        def call(block, image, text):
            text, image = block(text, image, *more, **kwargs)
            return image, text
        return x, context, call, kwargs

    @staticmethod
    def leave(image, text):
        return text, image

    @staticmethod
    def probe(first: nn.Module, image: torch.Tensor, kwargs: dict) -> torch.Tensor:
        """TeaCache's probe: the first x block's norm1(x) modulated by its shift_msa / scale_msa (DismantledBlock)."""
        block = first.x_block
        mods = block.adaLN_modulation(kwargs["c"]).chunk(9 if block.x_block_self_attn else 6, dim=1)
        return torch.addcmul(mods[0].unsqueeze(1), block.norm1(image), 1 + mods[1].unsqueeze(1))

    @staticmethod
    def probe_problem(first: nn.Module) -> str | None:
        block = getattr(first, "x_block", None)
        if block is None or not hasattr(block, "adaLN_modulation") or not hasattr(block, "norm1"):
            return f"its first block ({type(first).__name__}) has no x_block with norm1 and adaLN_modulation"
        if getattr(block, "scale_mod_only", False):
            return "its first block modulates by scale only (scale_mod_only)"
        return None


class _Flux:
    """Flux.forward_orig: double_blocks[i](img=, txt=, vec=, pe=, attn_mask=, transformer_options=) -> (img, txt);
    then img = cat((txt, img), 1); single_blocks[i](img, vec=, pe=, attn_mask=, transformer_options=) -> img; then
    final_layer(img[:, txt_len:], vec)."""

    name = "Flux"
    twin = "FluxTransformer2DModel"
    lists = ("double_blocks", "single_blocks")

    @staticmethod
    def enter(args, kwargs):
        if args or "img" not in kwargs or "txt" not in kwargs:
            raise _Unfollowed("Flux's double blocks were not called as block(img=..., txt=..., ...)")
        kwargs = dict(kwargs)
        img, txt = kwargs.pop("img"), kwargs.pop("txt")

        def call(block, image, text):
            return block(img=image, txt=text, **kwargs)
        return img, txt, call, kwargs

    @staticmethod
    def leave(image, text):
        return image, text

    @staticmethod
    def enter_joint(args, kwargs):
        """(the joined rows, call(block, rows) -> rows) of a call of a single block."""
        if not args:
            raise _Unfollowed("Flux's single blocks were not called as block(img, ...)")
        rows, more = args[0], args[1:]
        return rows, lambda block, x: block(x, *more, **kwargs), kwargs

    @staticmethod
    def probe(first: nn.Module, image: torch.Tensor, kwargs: dict) -> torch.Tensor:
        """TeaCache's probe (as ComfyUI-TeaCache's Flux): (1 + scale) * img_norm1(img) + shift of the first double
        block's img_mod."""
        mod, _ = first.img_mod(kwargs["vec"])
        return torch.addcmul(mod.shift, first.img_norm1(image), 1 + mod.scale)

    @staticmethod
    def probe_problem(first: nn.Module) -> str | None:
        if not isinstance(getattr(first, "img_mod", None), nn.Module) or not hasattr(first, "img_norm1"):
            return ("its first double block has no img_mod of its own (Flux 2's global modulation) for TeaCache's "
                    "probe")
        return None


class _ForgeFlux(_Flux):
    """Forge's port of Flux (backend/nn/flux.py, IntegratedFluxTransformer2DModel.inner_forward), which the A1111
    extension's Forge path caches through Forge's ModelPatcher: its blocks are called as ComfyUI's are
    (double_blocks[i](img=, txt=, vec=, pe=) -> (img, txt), then single_blocks[i](joined, vec=, pe=), the image rows
    last); its Modulation returns the six chunks as a tuple (shift, scale, gate, ...), each (B, 1, C)."""

    name = "Forge's Flux"

    @staticmethod
    def probe(first: nn.Module, image: torch.Tensor, kwargs: dict) -> torch.Tensor:
        """TeaCache's probe, as for ComfyUI's Flux: (1 + scale) * img_norm1(img) + shift of img_mod's first chunks."""
        shift, scale = first.img_mod(kwargs["vec"])[:2]
        return torch.addcmul(shift, first.img_norm1(image), 1 + scale)

    @staticmethod
    def probe_problem(first: nn.Module) -> str | None:
        if not isinstance(getattr(first, "img_mod", None), nn.Module) or not hasattr(first, "img_norm1"):
            return "its first double block has no img_mod and img_norm1 for TeaCache's probe"
        return None


FAMILIES = {("comfy.ldm.modules.diffusionmodules.mmdit", "MMDiT"): _MMDiT,
            ("comfy.ldm.modules.diffusionmodules.mmdit", "OpenAISignatureMMDITWrapper"): _MMDiT,
            ("comfy.ldm.flux.model", "Flux"): _Flux,
            ("backend.nn.flux", "IntegratedFluxTransformer2DModel"): _ForgeFlux}


def family_of(diffusion_model):
    return FAMILIES.get((type(diffusion_model).__module__, type(diffusion_model).__name__))


def default_threshold(mode: str, diffusion_model) -> float | None:
    """The published threshold of `mode` for the model (dit_cache.THRESHOLDS, by diffusers' class of the model)."""
    family = family_of(diffusion_model)
    return None if family is None else dit_cache.THRESHOLDS.get((mode, family.twin))


def cache_problem(diffusion_model, mode: str) -> str | None:
    """Why `mode` cannot cache `diffusion_model`, or None when it can."""
    family = family_of(diffusion_model)
    if family is None:
        return f"{type(diffusion_model).__name__} is not ComfyUI's MMDiT (SD3 / SD3.5) or Flux, or Forge's Flux"
    lists = [diffusion_model._modules.get(name) for name in family.lists]
    if not all(isinstance(blocks, nn.ModuleList) for blocks in lists):
        return f"its {' / '.join(family.lists)} are not ModuleLists"
    if not lists[0] or sum(len(blocks) for blocks in lists) < 2:
        return "fewer than two transformer blocks"
    return family.probe_problem(lists[0][0]) if mode == "teacache" else None


def _unreached(*args, **kwargs):
    raise RuntimeError("step cache: the transformer's forward went on past its first block list in the head call")


@contextmanager
def _standing_aside(diffusion_model, family, runs):
    """Each of the model's block lists holds one stand-in (its `runs` entry) for the call, then its blocks again. In
    _modules directly: setattr would register new modules on the model, which graphs.py takes for a change of the
    model's structure (a capture again)."""
    lists = {name: diffusion_model._modules[name] for name in family.lists}
    diffusion_model._modules.update({name: nn.ModuleList([_StandIn(run, list(lists[name]))])
                                     for name, run in zip(family.lists, runs)})
    try:
        yield
    finally:
        diffusion_model._modules.update(lists)


def _evaluate(model, x, t, c, family, runs):
    """model.apply_model(x, t, **c) with the block lists standing aside for `runs`; a _Stop's result where a stand-in
    stopped it."""
    with _standing_aside(model.diffusion_model, family, runs):
        try:
            return model.apply_model(x, t, **c)
        except _Stop as stop:
            return stop.result


class ComfyDiTStepCache:
    """ComfyUI's model_function_wrapper(apply_model, {"input", "timestep", "c", "cond_or_uncond"}) for an MMDiT or
    Flux model: the module doc. Counts into `counts`: 'step cache: full calls', 'step cache: cached calls',
    'step cache: uncached call: <why>'."""

    GRAPHED_CALLS = ("head", "rest", "skip", "plain")
    GRAPH_OPTIONS = dit_cache.DiTStepCache.GRAPH_OPTIONS   # the same buffers, by the same names

    def __init__(self, mode: str, threshold: float, counts: Counter | None = None, published: bool = False):
        self.mode, self.threshold = dit_cache.check_setting(mode, threshold)
        self.published = published   # the threshold is the model's published default (the node's notice says so)
        self.counts = counts if counts is not None else Counter()
        self.steps, self.runs, self.sigmas = Steps(), SamplingRuns(), HostTimesteps()
        self.buffers: OrderedDict = OrderedDict()   # (input shapes, slot) -> (residual, probe), latest last
        self.streams: dict = {}                     # input shapes -> the image stream's (shape, dtype, device)
        self.branches: dict[int, tuple] = {}        # slot -> the cond_or_uncond of its latest call
        self.head, self.rest, self.skip, self.plain = self.head_call, self.rest_call, self.skip_call, self.plain_call

    def __deepcopy__(self, memo):
        # ModelPatcher.clone() deep-copies model_options: its clones share the model, and this one controller.
        return self

    @property
    def stats(self) -> Counter:
        return self.counts

    def forget(self) -> None:
        """Drops the residuals and probes (ComfyUI unloaded the model, or its graphs were dropped)."""
        self.steps.reset()
        self.runs.reset()
        self.buffers.clear()
        self.streams.clear()
        self.branches.clear()

    def on_detach(self, _patcher, unpatch_all: bool) -> None:
        """ComfyUI's ON_DETACH callback: with unpatch_all the model is unloaded, and its residuals go too."""
        if unpatch_all:
            self.forget()

    # -- the evaluation --------------------------------------------------------------------------------------------
    def __call__(self, apply_model, args: dict, head=None, rest=None, skip=None, plain=None):
        """`head` / `rest` / `skip` / `plain`, each called as (model, x, t, c, its buffers by name): the calls to make
        (graphed ones), by default this controller's own."""
        model = getattr(apply_model, "__self__", None)
        x, t, c = args["input"], args["timestep"], args["c"]
        why = self._uncached(model, c)
        if why is not None:
            self.counts[f"step cache: uncached call: {why}"] += 1
            return apply_model(x, t, **c) if model is None else (plain or self.plain)(model, x, t, c)
        try:
            return self._cached_call(model, args, head or self.head, rest or self.rest, skip or self.skip)
        except _Unfollowed as error:
            self.counts[f"step cache: uncached call: {error}"] += 1
            return (plain or self.plain)(model, x, t, c)

    def _cached_call(self, model, args: dict, head, rest, skip):
        x, t, c = args["input"], args["timestep"], args["c"]
        options = c.get("transformer_options") or {}
        sigma = self.sigmas.value(t)
        position = self.runs.locate(sigma, options.get("sample_sigmas"))
        shapes = self._shapes(x, c)
        slot = self.steps.locate(sigma, (shapes, self.runs.runs))
        index, branches = self.steps.call, tuple(args.get("cond_or_uncond") or options.get("cond_or_uncond") or ())
        if self.branches.get(index) != branches:  # its residual and probe are another CFG entry's
            slot.feature = slot.previous = None
            slot.change = 0.0
            self.branches[index] = branches
        stream = self.streams[shapes] = self.streams.get(shapes) or self._stream(model, x, t, c)
        residual, previous = slot_buffers(self.buffers, shapes, index, lambda: stream[0], stream[1], stream[2])
        groups = len(branches) if len(branches) > 1 and x.shape[0] % len(branches) == 0 else 1
        hidden, encoder, change = head(model, x, t, c, previous=previous, groups=groups)
        last = position is not None and position[0] == position[1] - 2   # sigmas[-1] is where the run ends
        if decide(self.mode, self.threshold, slot, change, previous, last):
            self.counts["step cache: cached calls"] += 1
            return skip(model, x, t, c, hidden=hidden, residual=residual, previous=previous)
        output = rest(model, x, t, c, hidden=hidden, encoder=encoder, residual=residual, previous=previous)
        slot.feature = residual
        self.counts["step cache: full calls"] += 1
        return output

    def _uncached(self, model, c: dict) -> str | None:
        if model is None:
            return "apply_model is not a bound method of a model"
        problem = cache_problem(model.diffusion_model, self.mode)
        if problem is not None:
            return problem
        if c.get("control") is not None:
            return "ControlNet residuals"
        options = c.get("transformer_options") or {}
        for name, patches in (options.get("patches") or {}).items():
            if patches:
                return f"a '{name}' transformer patch"
        if (options.get("patches_replace") or {}).get("dit"):
            return "a 'dit' block replace patch"
        for kind in ("apply_model", "diffusion_model"):
            if any(((options.get("wrappers") or {}).get(kind) or {}).values()):
                return f"a '{kind}' wrapper"
        if torch.is_grad_enabled():  # a kept residual would hold the network's gradient history
            return "autograd is on"
        return None

    @staticmethod
    def _shapes(x: torch.Tensor, c: dict) -> tuple:
        """What the image stream's shape follows: the latents' and every conditioning tensor's shape (Flux Kontext's
        reference latents join the image rows), dtype and device."""
        leaves = [(name, i, tuple(leaf.shape), leaf.dtype) for name, value in c.items() if name != "transformer_options"
                  for i, leaf in enumerate(pytree.tree_leaves(value)) if isinstance(leaf, torch.Tensor)]
        return (tuple(x.shape), x.dtype, x.device, tuple(leaves))

    def _stream(self, model, x, t, c) -> tuple:
        """(shape, dtype, device) of the image stream entering the blocks: the forward run up to them, once per input
        shape."""
        family = family_of(model.diffusion_model)

        def enter(*args, **kwargs):
            image = family.enter(args, kwargs)[0]
            raise _Stop((tuple(image.shape), image.dtype, image.device))
        result = _evaluate(model, x, t, c, family, [enter] + [_unreached] * (len(family.lists) - 1))
        if not (isinstance(result, tuple) and len(result) == 3 and isinstance(result[1], torch.dtype)):
            raise _Unfollowed("the transformer's forward returned without calling its blocks")
        return result

    # -- the four calls (graph capture replaces them with graphed ones) --------------------------------------------
    def plain_call(self, model, x, t, c):
        """The evaluation as it is."""
        return model.apply_model(x, t, **c)

    def head_call(self, model, x, t, c, previous: torch.Tensor, groups: int = 1):
        """The forward up to its blocks, then the first block (fbcache) or its modulated input (teacache): (the image
        and text streams after the first block, None for teacache, and the probe's change against `previous`)."""
        family = family_of(model.diffusion_model)
        blocks = model.diffusion_model._modules[family.lists[0]]
        first = blocks[0]

        def enter(*args, **kwargs):
            image, text, call, rest = family.enter(args, kwargs)
            if self.mode == "fbcache":
                _at_block(rest.get("transformer_options"), 0, len(blocks))
                after, text = call(first, image, text)
                raise _Stop((after, text, relative_change(after - image, previous, groups)))
            raise _Stop((None, None, relative_change(family.probe(first, image, rest), previous, groups)))
        result = _evaluate(model, x, t, c, family, [enter] + [_unreached] * (len(family.lists) - 1))
        if not (isinstance(result, tuple) and len(result) == 3):
            raise _Unfollowed("the transformer's forward returned without calling its blocks")
        return result

    def rest_call(self, model, x, t, c, hidden: torch.Tensor | None, encoder: torch.Tensor | None,
                  residual: torch.Tensor, previous: torch.Tensor):
        """The evaluation with the blocks after the boundary run on head's streams (fbcache) or the forward's own
        (teacache); writes the residual of those blocks on the image stream into `residual` and the probe into
        `previous`."""
        family = family_of(model.diffusion_model)
        lists = [list(model.diffusion_model._modules[name]) for name in family.lists]
        boundary = []

        def enter(*args, **kwargs):
            image, text, call, rest = family.enter(args, kwargs)
            if self.mode == "fbcache":
                torch.sub(hidden, image, out=previous)   # head's probe, as head computed it
                image, text, start = hidden, encoder, 1
            else:
                previous.copy_(family.probe(lists[0][0], image, rest))
                start = 0
            boundary.append(image)
            for index in range(start, len(lists[0])):
                _at_block(rest.get("transformer_options"), index, len(lists[0]))
                image, text = call(lists[0][index], image, text)
            if len(lists) == 1:
                torch.sub(image, boundary[0], out=residual)
            return family.leave(image, text)

        def joint(*args, **kwargs):
            rows, call, rest = family.enter_joint(args, kwargs)
            for index, block in enumerate(lists[1]):
                _at_block(rest.get("transformer_options"), index, len(lists[1]))
                rows = call(block, rows)
            torch.sub(rows[:, rows.shape[1] - residual.shape[1]:], boundary[0], out=residual)
            return rows
        return _evaluate(model, x, t, c, family, [enter, joint][:len(lists)])

    def skip_call(self, model, x, t, c, hidden: torch.Tensor | None, residual: torch.Tensor, previous: torch.Tensor):
        """The evaluation with the blocks replaced by adding `residual` to head's image stream (fbcache) or the
        forward's own (teacache, which also writes the probe into `previous`)."""
        family = family_of(model.diffusion_model)
        single = len(family.lists) == 1
        first = model.diffusion_model._modules[family.lists[0]][0]

        def enter(*args, **kwargs):
            image, text, _, rest = family.enter(args, kwargs)
            if self.mode == "teacache":
                previous.copy_(family.probe(first, image, rest))
            base = hidden if self.mode == "fbcache" else image
            return family.leave(base + residual if single else base, text)

        def joint(*args, **kwargs):
            rows = family.enter_joint(args, kwargs)[0]
            split = rows.shape[1] - residual.shape[1]   # the image rows are the last
            return torch.cat((rows[:, :split], rows[:, split:] + residual), dim=1)
        return _evaluate(model, x, t, c, family, [enter, joint][:len(family.lists)])
