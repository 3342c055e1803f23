// The host interface of hip/ada_layer_norm/ (conventions: rocm_sd/api.h): the AdaLN-Zero modulation of diffusion
// transformers (SD3 / SD3.5 MMDiT, Flux), LayerNorm without affine parameters followed by a per-sample scale and
// shift, over x (batch * tokens, c) contiguous:
//   out = LayerNorm(x) * (1 + scale[b]) + shift[b]
// and its gated-residual form, with y, gate and h: h = x + gate[b] * y is written too, and normalised instead of x.
// scale, shift and gate are (batch, c) at any strides (the chunks of one embedding (batch, k * c)).
// With q and q_scale and no out, out is not written but quantized per row into them (rocm_sd/quantize/api.h): the 8-bit
// input of the projections that take it.
#pragma once

#include <cstdint>
#include <string>

#include "rocm_sd/api.h"
#include "rocm_sd/quantize/api.h"

namespace rsd {

struct AdaLayerNormArgs {
  const void* x;
  void* out;
  const void* scale;
  const void* shift;
  DType dtype;  // of every tensor
  int64_t batch, tokens, c;
  int64_t scale_stride[2];  // (batch, channel), in elements
  int64_t shift_stride[2];
  float eps;
  void* stream;
  int device;
  const void* y = nullptr;     // (batch * tokens, c) contiguous, or nullptr
  const void* gate = nullptr;  // (batch, c) at gate_stride; set exactly when y is
  int64_t gate_stride[2] = {0, 0};
  void* h = nullptr;           // (batch * tokens, c) contiguous: x + gate * y; set exactly when y is
  void* q = nullptr;           // (batch * tokens, c) one byte each: out quantized per row; then out is nullptr
  float* q_scale = nullptr;    // (batch * tokens,): its scales; set exactly when q is
  QuantFormat format = QuantFormat::e4m3fn;
  float bound = 0.f;           // > 0: one scale for every row, bound / fmax (rocm_sd/quantize/api.h); fp8 only
};
std::string ada_layer_norm_check(const AdaLayerNormArgs& a);
std::string ada_layer_norm_forward(const AdaLayerNormArgs& a);

}  // namespace rsd
