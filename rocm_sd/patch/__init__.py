from .pipeline import invalidate_graphs, optimize, report, revert  # noqa: F401
