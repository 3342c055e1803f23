from .geglu import GEGLUFused  # noqa: F401
from .group_norm import GroupNormAct  # noqa: F401
from .layer_norm import LayerNormFused  # noqa: F401
