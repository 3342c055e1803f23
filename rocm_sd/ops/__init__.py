"""rocm_sd custom ops. Importing this package registers every `torch.ops.rocm_sd.*` op."""
from .attention import attention, attention_ref  # noqa: F401
from .attention import kernel_may_run as attention_kernel_may_run  # noqa: F401
from .bias_residual import bias_residual, bias_residual_ref  # noqa: F401
from .conv_bias_residual import conv_bias_residual, conv_bias_residual_ref  # noqa: F401
from .geglu import geglu, geglu_ref  # noqa: F401
from .group_norm import group_norm, group_norm_ref  # noqa: F401
from .layer_norm import add_layer_norm, add_layer_norm_ref, layer_norm, layer_norm_ref  # noqa: F401
from .linear_geglu import linear_geglu, linear_geglu_ref  # noqa: F401
from .parity_shuffle import parity_shuffle, parity_shuffle_ref  # noqa: F401

ALL_OPS = {"attention": attention, "group_norm": group_norm, "geglu": geglu, "bias_residual": bias_residual,
           "layer_norm": layer_norm, "add_layer_norm": add_layer_norm, "parity_shuffle": parity_shuffle,
           "linear_geglu": linear_geglu, "conv_bias_residual": conv_bias_residual}
