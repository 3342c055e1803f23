from .pipeline import optimize, report, revert  # noqa: F401
