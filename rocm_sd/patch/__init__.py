"""Where rocm_sd's modules go, per host. optimize / revert / report / invalidate_graphs are patch/pipeline.py's,
imported at their first use: the commands read patch/flags.py's tables without importing torch."""
from .._lazy import lazy_attributes

__getattr__, __dir__ = lazy_attributes(__name__, {name: ".pipeline" for name in
                                                  ("invalidate_graphs", "optimize", "report", "revert")})
