"""Graph capture (CUDA graphs / HIP graphs) of a model call, replayed per input signature.

Why: an eager SD1.5 UNet step makes hundreds of kernel launches and is bound by host time (docs/performance.md), so faster kernels do not show in wall time until
the whole step is one graph launch.

GraphedCall wraps a callable (a model's forward, the VAE's decode). Per signature (the pytree
structure of the arguments, each tensor's shape, strides, dtype and device, the value of every other
argument, and the storage of every parameter and buffer of the model) it captures one graph on the
first call and replays it afterwards: inputs are copied into the graph's static buffers, outputs
are cloned out of it, so a caller never holds memory the next replay overwrites. Two exceptions, asked for per call:
buffers passed in place (`in_place`: a step cache's kept state, which the graph reads and writes where it lies, the
buffer's address part of the signature) and outputs handed out as the graph's own (`static_outputs`: read before the
next replay, as the step cache reads its head call's). It runs the
callable eagerly, and says why in `stats`, whenever a graph would be wrong or impossible: autograd
on, torch.compile tracing, inside another capture, no GPU tensor among the inputs, CPU tensors or
unhashable values among them, signatures changing too often (graphs evicted, least recently used
first, faster than they replay), or a capture that failed.

A graph bakes in the model as it was at capture. Changes rocm_sd sees lead to a new capture: a
weight moved or swapped (storage pointers are part of the signature), another module, parameter or
buffer registered on a module of a graphed model (peft's LoRA injection, fused QKV projections),
another attention processor set on one. A model put back exactly as it was replays its old graphs.
Changes it cannot see (a LoRA scale edited in a plain dict, an attribute of a module rewritten by
hand) need `rocm_sd.invalidate_graphs(pipe)` after them.
"""
from __future__ import annotations

import logging
import os
import traceback
import types
import warnings
import weakref
from collections import Counter, OrderedDict, deque
from contextlib import contextmanager
from typing import Any, Callable

import torch
from torch import nn
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import _get_current_dispatch_mode

from .modules.fusing import accelerate_hooked
from .capture import graph_capture, warmup_stream

log = logging.getLogger("rocm_sd")

# Signatures kept per callable (CFG on/off x a few resolutions x a few weight sets). A new signature past it
# evicts the least recently replayed graph (each LoRA strength a ComfyUI user tries is new weight storage:
# a new signature), unless evictions have become frequent (THRASH_EVICTIONS in the last THRASH_WINDOW
# calls): then the arguments change too often for captures to pay, and new signatures run eagerly.
MAX_GRAPHS = 8
THRASH_WINDOW = 32
THRASH_EVICTIONS = 4
WARMUP_CALLS = 2    # eager calls on a side stream before capture (lazy init, cuDNN algorithm choice)
DEVICE_TYPE = "cuda"  # the tensors graphs replay (CPU tests that emulate a capture set "cpu")


# Bumped when a module, parameter or buffer is registered on, or an attention processor set on, a
# module of a graphed model (hooks installed with the first GraphedCall): the model's structure is looked
# at again on the next call. Registrations elsewhere are ignored: diffusers builds temporary ModuleLists in
# its forwards (`self.resnets[1:]`), which must not cost a walk over the model.
_structure_epoch = 0
_hooks_installed = False
_watched: "weakref.WeakSet[nn.Module]" = weakref.WeakSet()


def _bump_epoch_if_watched(module, name=None, value=None):
    global _structure_epoch
    if module not in _watched:
        return
    for registry in (module._modules, module._parameters, module._buffers):
        if name in registry and registry[name] is value:
            return  # the same object set again: ComfyUI re-applies its object patches on every model load
    _structure_epoch += 1


def _install_structure_hooks() -> None:
    global _hooks_installed
    if _hooks_installed:
        return
    from torch.nn.modules import module as nn_module

    nn_module.register_module_module_registration_hook(_bump_epoch_if_watched)
    nn_module.register_module_parameter_registration_hook(_bump_epoch_if_watched)
    nn_module.register_module_buffer_registration_hook(_bump_epoch_if_watched)
    try:  # diffusers' processors are plain objects, not registered modules
        from diffusers.models.attention_processor import Attention

        original = Attention.set_processor
        if not getattr(original, "_rocm_sd_bumps_epoch", False):
            def set_processor(self, *args, **kwargs):
                _bump_epoch_if_watched(self)
                return original(self, *args, **kwargs)

            set_processor._rocm_sd_bumps_epoch = True
            Attention.set_processor = set_processor
    except ImportError:
        pass
    _hooks_installed = True


def watch_structure(model: nn.Module) -> None:
    """Count registrations on `model`'s modules (and processors set on its attention modules) in structure_epoch(), as
    for a graphed model: for state that other code derives from the model's structure (modules/text_kv.py)."""
    _install_structure_hooks()
    for module in model.modules():
        _watched.add(module)


def structure_epoch() -> int:
    """Moves whenever a module, parameter or buffer is registered on, or a processor set on, a watched module."""
    return _structure_epoch


class _Ineligible(Exception):
    """The call cannot be graphed; the message says why."""


def _leaf_key(leaf: Any):
    if isinstance(leaf, torch.Tensor):
        if leaf.device.type != DEVICE_TYPE:
            raise _Ineligible(f"a {leaf.device.type} tensor argument (graphs replay device memory only)")
        return ("tensor", tuple(leaf.shape), leaf.stride(), leaf.dtype, leaf.device)
    try:
        hash(leaf)
    except TypeError:
        raise _Ineligible(f"an unhashable {type(leaf).__name__} argument") from None
    if isinstance(leaf, torch.Generator):
        raise _Ineligible("a torch.Generator argument (its random stream is not replayed)")
    return (type(leaf), leaf)


class _Graph:
    def __init__(self, graph, static_inputs: list, static_output_leaves: list, output_spec, clone_outputs: bool = True):
        self.graph = graph
        # one static tensor per tensor leaf of the arguments: a copy, or the caller's own buffer where it is passed in
        # place (kept here, so that no other tensor takes the address the graph reads and writes while it lives)
        self.static_inputs = static_inputs
        self.static_output_leaves = static_output_leaves
        self.output_spec = output_spec
        self.clone_outputs = clone_outputs

    def replay(self, tensor_leaves: list):
        for static, value in zip(self.static_inputs, tensor_leaves):
            if static.data_ptr() != value.data_ptr():
                static.copy_(value)
        self.graph.replay()
        out = [leaf.clone() if isinstance(leaf, torch.Tensor) and self.clone_outputs else leaf
               for leaf in self.static_output_leaves]
        return pytree.tree_unflatten(out, self.output_spec)


class GraphedCall:
    """`fn` (a bound method of `module`) captured and replayed per input signature; see the module doc.

    ignore_kwargs: keyword arguments dropped before the call because `fn` ignores them (e.g. the
    `generator` that pipelines pass to AutoencoderKL.decode), so that they do not block capture.
    pool: a graph memory pool shared with other GraphedCalls replayed on the same stream, one at a
    time (outputs are cloned, so captures may reuse each other's temporaries).
    in_place: keyword arguments whose tensors the graph reads and writes at their own address: never copied into a
    static buffer, their data pointers part of the signature (another buffer: another graph). For state a caller
    keeps between calls, which a copy in and out of the graph would double. A capture runs the call WARMUP_CALLS times
    more on them: what it writes must not depend on what it wrote (a copy, not an accumulation).
    static_outputs: the outputs are the graph's own tensors, not clones: valid until the call's next replay, for a
    caller that reads them at once (or passes them in place to another graphed call).
    """

    def __init__(self, fn: Callable, module: torch.nn.Module, name: str, ignore_kwargs: tuple[str, ...] = (),
                 pool_owner: "GraphPool | None" = None, in_place: tuple[str, ...] = (), static_outputs: bool = False):
        self.fn = fn
        self.module = module
        self.name = name
        self.ignore_kwargs = ignore_kwargs
        self.in_place = tuple(in_place)
        self.static_outputs = static_outputs
        self.pool_owner = pool_owner or GraphPool()
        self.graphs: OrderedDict = OrderedDict()  # signature -> graph, least recently replayed first
        self.failed: dict = {}
        self._evictions: deque = deque(maxlen=THRASH_WINDOW)  # per call: whether it evicted a graph
        self.stats: Counter = Counter()
        self._weight_list = None
        self._derived: list = []
        self._sources: list = []
        self._derived_versions: tuple | None = None
        self._structures: dict = {}  # fingerprint of the model's structure -> its number
        self._structure = -1
        self._seen_epoch = -1
        _install_structure_hooks()

    # -- copies -----------------------------------------------------------------------------------
    def __getstate__(self) -> dict:
        """A copy (copy.deepcopy, pickle) gets the callable and its settings, never the graphs: those replay the
        original's memory. The copy captures its own on first use. A bound method is kept as (function, owner)
        so that a deep copy rebinds it to the copied model and pickle never looks it up by name."""
        fn = (self.fn.__func__, self.fn.__self__) if isinstance(self.fn, types.MethodType) else self.fn
        return {"fn": fn, "module": self.module, "name": self.name, "ignore_kwargs": self.ignore_kwargs,
                "pool_owner": self.pool_owner, "in_place": self.in_place, "static_outputs": self.static_outputs}

    def __setstate__(self, state: dict) -> None:
        fn = state["fn"]
        if isinstance(fn, tuple):
            fn = types.MethodType(*fn)
        self.__init__(fn, state["module"], state["name"], state["ignore_kwargs"], state["pool_owner"],
                      state.get("in_place", ()), state.get("static_outputs", False))

    # -- the call ---------------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        for name in self.ignore_kwargs:
            kwargs.pop(name, None)
        try:
            key, leaves, spec = self._signature(args, kwargs)
        except _Ineligible as why:
            self.stats[f"eager: {why}"] += 1
            return self.fn(*args, **kwargs)
        graph = self.graphs.get(key)
        evicting = graph is None and key not in self.failed and len(self.graphs) >= MAX_GRAPHS
        self._evictions.append(evicting)
        if graph is not None:
            self.graphs.move_to_end(key)  # most recently used last: eviction takes the first
        else:
            if key in self.failed:
                self.stats[f"eager: capture failed earlier ({self.failed[key]})"] += 1
                return self.fn(*args, **kwargs)
            if evicting:
                if sum(self._evictions) > THRASH_EVICTIONS:
                    self._evictions[-1] = False  # nothing was evicted
                    self.stats[f"eager: new input signatures too often to replay (over {THRASH_EVICTIONS} "
                               f"evictions in the last {THRASH_WINDOW} calls, {MAX_GRAPHS} graphs kept)"] += 1
                    return self.fn(*args, **kwargs)
                self.graphs.popitem(last=False)
                self.stats["graphs evicted (least recently used)"] += 1
            try:
                graph = self._capture(args, kwargs, leaves, spec)
            except Exception as error:  # noqa: BLE001 - any capture failure falls back to eager, reported
                reason = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:200]
                self.failed[key] = reason
                log.warning("rocm_sd: graph capture of %s failed, running it eagerly: %s", self.name, reason)
                self.stats[f"eager: capture failed ({reason})"] += 1
                return self.fn(*args, **kwargs)
            if self.graphs:  # why a call did not match the graphs there are: new shapes, moved weights...
                self.stats[f"captured again: {_what_changed(list(self.graphs), key, args, kwargs)}"] += 1
            key = self._key_as_captured(key)
            self.graphs[key] = graph
            self.stats["graph captures"] += 1
        self.stats["graph replays"] += 1
        return graph.replay([leaf for leaf in leaves if isinstance(leaf, torch.Tensor)])

    def _signature(self, args, kwargs):
        if torch.compiler.is_compiling():
            raise _Ineligible("torch.compile is tracing")
        if torch.is_grad_enabled():
            raise _Ineligible("autograd is on (graphs are captured under torch.no_grad / inference_mode)")
        if _get_current_dispatch_mode() is not None:
            raise _Ineligible("a TorchDispatchMode is active (recording, fake tensors)")
        if accelerate_hooked(self.module):
            raise _Ineligible("accelerate hooks (CPU offload) move the weights between calls")
        leaves, spec = pytree.tree_flatten((args, kwargs))
        if not any(isinstance(leaf, torch.Tensor) and leaf.device.type == DEVICE_TYPE for leaf in leaves):
            raise _Ineligible("no GPU tensor among the inputs")
        if torch.cuda.is_current_stream_capturing():
            raise _Ineligible("called inside another graph capture")
        leaf_keys, buffers = [], self._buffers(kwargs)
        for index, leaf in enumerate(leaves):
            try:
                leaf_keys.append(_leaf_key(leaf) + ((leaf.data_ptr(),) if id(leaf) in buffers else ()))
            except _Ineligible as why:  # say which argument
                raise _Ineligible(f"{why} at {_argument_path(args, kwargs, index)}") from None
        key = (spec, tuple(leaf_keys), self._model_key())
        return key, leaves, spec

    def _buffers(self, kwargs: dict) -> set[int]:
        """The ids of the tensors passed in place (`in_place`)."""
        return {id(leaf) for name in self.in_place for leaf in pytree.tree_leaves(kwargs.get(name))
                if isinstance(leaf, torch.Tensor)}

    def _model_key(self) -> tuple:
        """(which structure the model has, the storage of each weight): the model as a graph bakes it in.

        Structures are told apart by the identity and type of every module, attention processor, parameter
        and buffer, numbered per GraphedCall, so a model put back as it was (ComfyUI restores its object
        patches' originals and installs the patches again on every load) replays the graphs it had.
        Moving the model (offload, .to()) or swapping a weight tensor (LoRA fusing) changes a storage the
        graph reads from; in-place updates (copy_) keep it and stay valid.

        Weights derived from others (the 8-bit weights of modules/quantized_linear.QuantizedHostCopy) are brought up
        to date first (`rocm_sd_refresh`), outside any capture: a new derivation is new buffers, so new pointers."""
        if self._seen_epoch != _structure_epoch:
            self._walk()
        if self._derived and (self._derived_versions is None or self._source_versions() != self._derived_versions):
            for module in self._derived:
                module.rocm_sd_refresh()
            if self._seen_epoch != _structure_epoch:
                self._walk()
            self._derived_versions = self._source_versions()
        pointers = tuple(t.data_ptr() for t in self._weight_list)
        if 0 in pointers and any(t.is_meta for t in self._weight_list):
            raise _Ineligible("weights on the meta device (CPU offload brings them in for each call)")
        return (self._structure,) + pointers

    def _walk(self) -> None:
        """The model's structure, weights and derived-weight modules, again (walking the module tree costs ~1 ms:
        once per change)."""
        modules = list(self.module.modules())
        self._weight_list = list(self.module.parameters()) + list(self.module.buffers())
        self._derived = [m for m in modules if hasattr(type(m), "rocm_sd_refresh")]
        # A weight replaced is a new epoch (a walk, then every derived module refreshed); one changed in place is a
        # new version, checked per call. Inference tensors have no version (and cannot be changed outside
        # inference mode).
        self._sources = [w for w in (m._parameters.get("weight") for m in self._derived)
                         if w is not None and not w.is_inference()]
        self._derived_versions = None
        for module in modules:
            _watched.add(module)
        processors = [getattr(m, "processor", None) for m in modules]  # diffusers' attention processors
        fingerprint = (tuple((id(m), type(m), id(p), type(p)) for m, p in zip(modules, processors))
                       + tuple((id(t), t.shape, t.dtype) for t in self._weight_list))
        self._structure = self._structures.setdefault(fingerprint, len(self._structures))
        self._seen_epoch = _structure_epoch

    def _key_as_captured(self, key: tuple) -> tuple:
        """`key` with the model as the graph captured it: the warm-up calls may have changed it (weights or buffers a
        model creates on its first call, derived weights brought up to date), and the graph reads those."""
        try:
            return key[:-1] + (self._model_key(),)
        except _Ineligible:
            return key

    def _source_versions(self) -> tuple:
        return tuple(w._version for w in self._sources)

    # -- capture ----------------------------------------------------------------------------------
    def _capture(self, args, kwargs, leaves: list, spec):
        device = next(leaf.device for leaf in leaves if isinstance(leaf, torch.Tensor) and leaf.device.type == "cuda")
        side = warmup_stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        def fresh_arguments():
            # New lists and dicts around the same tensors for every warm-up call: a callee may consume its
            # arguments (ComfyUI's UNet pops the ControlNet residuals off their lists), and the caller's own
            # arguments must stay whole for the eager call that follows a failed capture.
            return pytree.tree_unflatten(leaves, spec)

        with torch.cuda.stream(side):
            for _ in range(WARMUP_CALLS - 1):
                warm_args, warm_kwargs = fresh_arguments()
                self.fn(*warm_args, **warm_kwargs)
            warm_args, warm_kwargs = fresh_arguments()
            with _host_syncs_raise():  # a call that waits for the GPU cannot be captured: find out first
                self.fn(*warm_args, **warm_kwargs)
        torch.cuda.current_stream(device).wait_stream(side)

        static_inputs, static_args, static_kwargs = self._static_arguments(kwargs, leaves, spec)
        graph = torch.cuda.CUDAGraph()
        try:
            with graph_capture(graph, pool=self.pool_owner.handle(device)):
                output = self.fn(*static_args, **static_kwargs)
        except Exception:
            _repair_after_failed_capture(device)
            raise
        self.pool_owner.captured(device, graph)
        output_leaves, output_spec = pytree.tree_flatten(output)
        return _Graph(graph, static_inputs, output_leaves, output_spec, not self.static_outputs)

    def _static_arguments(self, kwargs: dict, leaves: list, spec) -> tuple[list, tuple, dict]:
        """(the graph's input tensors, the arguments it is captured with): a copy of each tensor leaf, the buffer itself
        where it is passed in place."""
        buffers = self._buffers(kwargs)
        static_inputs = [leaf if id(leaf) in buffers else leaf.detach().clone()
                         for leaf in leaves if isinstance(leaf, torch.Tensor)]
        it = iter(static_inputs)
        static_leaves = [next(it) if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
        static_args, static_kwargs = pytree.tree_unflatten(static_leaves, spec)
        return static_inputs, static_args, static_kwargs

    def clear(self) -> None:
        """Drop every captured graph (their memory returns to the pool) and the model's weights the signatures compare.
        revert() runs this first, then brings the original weights back to the GPU while its record still holds this
        call: weights kept here (the 8-bit ones) would stay allocated beside the originals until revert's end."""
        self.graphs.clear()
        self.failed.clear()
        self._evictions.clear()
        self._structures.clear()
        self._weight_list, self._derived, self._sources, self._derived_versions = None, [], [], None
        self._seen_epoch = -1


def _argument_path(args, kwargs, index: int) -> str:
    """The leaf `index` of (args, kwargs) as code spells it: args[2]['transformer_options']['sigmas']."""
    first, *rest = pytree.tree_flatten_with_path((args, kwargs))[0][index][0]
    return f"{('args', 'kwargs')[first.idx]}{pytree.keystr(rest)}"


def _what_changed(captured: list, key: tuple, args, kwargs) -> str:
    """What differs between a new signature and the latest captured one of the same argument structure."""
    spec, leaves, (structure, *weights) = key
    same_structure = [k for k in reversed(captured) if k[0] == spec]
    if not same_structure:
        return "the arguments' structure"
    _, old_leaves, (old_structure, *old_weights) = same_structure[0]
    changed = [_argument_path(args, kwargs, i) for i, (a, b) in enumerate(zip(old_leaves, leaves)) if a != b]
    if changed:
        return "the shape, strides, dtype or value of " + ", ".join(changed[:3])
    if old_structure != structure:
        return "the model's modules, parameters or buffers (one registered or replaced)"
    if old_weights != weights:
        return f"the storage of {sum(a != b for a, b in zip(old_weights, weights))} weights (moved or replaced)"
    return "nothing visible"


@contextmanager
def _host_syncs_raise():
    """torch's sync debug mode set to raise, for one call: .item(), host copies and the like fail there."""
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "prototype feature" notice
        torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    except RuntimeError as error:
        if "synchronizing" in str(error):
            raise RuntimeError("the call synchronizes with the host (e.g. .item(), a copy to or from the CPU)"
                               + _caller_outside_torch(error)) from error
        raise
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.cuda.set_sync_debug_mode(previous)


def _caller_outside_torch(error: BaseException) -> str:
    """' at file:line (function)' of the innermost frame of error's traceback outside torch: the model code that
    synchronized, which a user or a host app's developer can find (or '' when every frame is torch's)."""
    torch_dir = os.path.dirname(torch.__file__)
    frames = [f for f in traceback.extract_tb(error.__traceback__) if not f.filename.startswith(torch_dir)]
    if not frames:
        return ""
    frame = frames[-1]
    return f" at {frame.filename}:{frame.lineno} ({frame.name}: {(frame.line or '').strip()[:80]})"


def _repair_after_failed_capture(device: torch.device) -> None:
    """An invalidated capture leaves torch's default CUDA generator mid-capture, and every later random
    op on the device fails ("Offset increment outside graph capture"). Completing one empty capture
    resets it (measured on torch 2.11, H200)."""
    if torch.cuda.is_current_stream_capturing():
        return
    try:
        torch.cuda.synchronize(device)
    except Exception:  # noqa: BLE001 - the failed capture's error may surface here once
        pass
    try:
        with graph_capture(torch.cuda.CUDAGraph()):
            torch.empty(1, device=device)
    except Exception as error:  # noqa: BLE001
        log.warning("rocm_sd: could not reset the CUDA generator after a failed capture: %s", error)


class GraphPool:
    """One graph memory pool per device, shared by the GraphedCalls of one optimized pipeline.

    A pool whose graphs have all been destroyed (cleared, or a failed capture) is never captured into again:
    PyTorch keeps it until its blocks are freed, with a use count of 0, and a capture into it fails an
    internal assertion (CUDACachingAllocator beginAllocateToPool, torch 2.11). A new pool is started instead.
    """

    def __init__(self):
        self._pools: dict = {}  # device -> (pool handle, the live graphs captured into it)

    def __reduce__(self):
        # A copied pipeline's calls share one new, empty pool (the copy's memo maps this pool to one copy).
        return GraphPool, ()

    def handle(self, device: torch.device):
        entry = self._pools.get(device)
        if entry is None or not entry[1]:
            entry = self._pools[device] = (torch.cuda.graph_pool_handle(), weakref.WeakSet())
        return entry[0]

    def captured(self, device: torch.device, graph) -> None:
        """Count `graph` (captured into handle(device)) as a user of the pool until it is destroyed."""
        self._pools[device][1].add(graph)
