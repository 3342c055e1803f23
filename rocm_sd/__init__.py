"""rocm_sd: fast Stable Diffusion inference on AMD GPUs.

    import rocm_sd
    rocm_sd.optimize(pipe)      # a diffusers pipeline, patched in place (and returned)
    rocm_sd.stats()             # which backend ran each op
    rocm_sd.report(pipe)        # what was replaced, graph replays, fallbacks and why
    rocm_sd.revert(pipe)        # back to the original modules

Importing the package imports neither torch nor diffusers: `python -m rocm_sd --help` and argument errors answer
at once. The names above are imported at their first use (PEP 562). The ops, torch.ops.rocm_sd.*, register with
torch as soon as torch is imported, before or after rocm_sd (_torch_hook.py), so `import rocm_sd` is all that
`torch.ops.rocm_sd.<op>` needs.
"""
from ._lazy import lazy_attributes
from ._torch_hook import register_with_torch
from .version import __version__

__all__ = ["optimize", "revert", "report", "invalidate_graphs", "stats", "reset_stats", "__version__"]
__getattr__, __dir__ = lazy_attributes(__name__, {
    "optimize": ".patch", "revert": ".patch", "report": ".patch", "invalidate_graphs": ".patch",
    "stats": ".dispatch", "reset_stats": ".dispatch"})
register_with_torch()
