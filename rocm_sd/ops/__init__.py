"""rocm_sd's custom ops, one module per op family: importing this package registers every torch.ops.rocm_sd.* op.

Each module declares its op's OpSpec (ops/spec.py); REGISTRY maps op names to them, in one order, for everything
that lists the ops (the tuner, `info`, the opcheck and fake-kernel tests); op_names.OPS lists their names for
what must not import torch. The ops themselves are
`rocm_sd.ops.<module>.<op>` (e.g. rocm_sd.ops.group_norm.group_norm), or REGISTRY[name].op.
"""
from . import (attention, attention_fp8, bias_residual, conv_bias_residual, geglu, group_norm,  # noqa: F401
               im2col_quantize, layer_norm, linear_geglu, parity_shuffle, quantize, quantized_outputs,
               rms_norm)
from . import ada_layer_norm, ada_layer_norm_quantized, gelu_tanh  # noqa: F401
from .spec import REGISTRY, OpSpec, Plan  # noqa: F401
from ..op_names import OPS

if tuple(REGISTRY) != OPS:
    raise ImportError(f"rocm_sd/op_names.py's OPS lists {OPS}, the registry holds {tuple(REGISTRY)}: list each op "
                      "there, in the order the registry has")
