from .group_norm import GroupNormAct  # noqa: F401
