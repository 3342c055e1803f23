"""rocm_sd: fast Stable Diffusion inference on AMD GPUs.

    import rocm_sd
    rocm_sd.optimize(pipe)      # a diffusers pipeline, patched in place (and returned)
    rocm_sd.stats()             # which backend ran each op
    rocm_sd.report(pipe)        # what was replaced, graph replays, fallbacks and why
    rocm_sd.revert(pipe)        # back to the original modules
"""
from . import ops  # noqa: F401  (registers torch.ops.rocm_sd.*)
from .dispatch import reset_stats, stats
from .tune import active as _tuning  # noqa: F401  (the tuned choices the ops dispatch by)
from .version import __version__
from .patch import invalidate_graphs, optimize, report, revert

__all__ = ["optimize", "revert", "report", "invalidate_graphs", "stats", "reset_stats", "__version__"]
