"""The names the commands list, importable without torch (`python -m rocm_sd.tune --help` lists them): the ops, in
the order of their registry (ops.REGISTRY), and the tuner's per-layer problems of the 8-bit layers.

An OpSpec whose name is not here is refused (ops/spec.py), and importing rocm_sd.ops checks that the registry holds
exactly these names in this order: the list and the registry cannot drift apart."""

OPS = ("attention", "quantize_rows", "attention_fp8", "bias_residual", "conv_bias_residual", "geglu", "group_norm",
       "im2col_quantize", "layer_norm", "add_layer_norm", "linear_geglu", "parity_shuffle",
       "layer_norm_quantize_rows", "add_layer_norm_quantize_rows", "layer_norm_quantized", "add_layer_norm_quantized",
       "geglu_quantize_rows", "geglu_quantized", "rms_norm", "ada_layer_norm", "add_ada_layer_norm",
       "ada_layer_norm_quantized", "add_ada_layer_norm_quantized", "gelu_tanh", "gelu_tanh_quantized")

LINEAR_8BIT = "linear_8bit"  # one layer's 8-bit GEMM (and its share of quantizing its input) against its fp16 GEMM
CONV_8BIT = "conv_8bit"      # one convolution's FP8 GEMM (with its patches) against the fp16 convolution
