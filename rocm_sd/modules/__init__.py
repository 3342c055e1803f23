"""What replaces a module: drop-in classes named Rocm<the class they replace> (same parameters and state-dict keys),
the fused forwards of diffusers' blocks (resnet, transformer, upsample), and kernel-backed copies of a host app's
own modules (host_copies). rocm_sd/patch/ decides where they go."""
from .attention import RocmAttnProcessor  # noqa: F401
from .geglu import RocmGEGLU  # noqa: F401
from .group_norm import RocmGroupNorm  # noqa: F401
from .layer_norm import RocmLayerNorm  # noqa: F401
from .pointwise import RocmPointwiseConv2d  # noqa: F401
