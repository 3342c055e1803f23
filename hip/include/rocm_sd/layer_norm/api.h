// The host interface of hip/layer_norm/ (conventions: rocm_sd/api.h): LayerNorm over the last dimension of x,
// (rows, c) contiguous; with a residual, of sum = x + residual, which is written too (SkipLayerNorm); with q and scale,
// y is also quantized per row into them (rocm_sd/quantize/api.h), the 8-bit input of the GEMMs that follow
#pragma once

#include <cstdint>
#include <string>

#include "rocm_sd/api.h"
#include "rocm_sd/quantize/api.h"

namespace rsd {

struct LayerNormArgs {
  const void* x;
  void* y;
  const void* gamma;  // (c,) or nullptr
  const void* beta;   // (c,) or nullptr
  DType dtype;
  DType param_dtype;  // of gamma and beta: dtype or f32
  int64_t rows, c;
  float eps;
  void* stream;
  int device;
  const void* residual = nullptr;  // (rows, c) contiguous, or nullptr
  void* sum = nullptr;             // (rows, c) contiguous: x + residual; set exactly when residual is
  void* q = nullptr;               // (rows, c) one byte each: y quantized per row, or nullptr
  float* scale = nullptr;          // (rows,): its scales; set exactly when q is
  QuantFormat format = QuantFormat::e4m3fn;
  float bound = 0.f;               // > 0: one scale for every row, bound / fmax (rocm_sd/quantize/api.h); fp8 only
};
std::string layer_norm_check(const LayerNormArgs& a);
std::string layer_norm_forward(const LayerNormArgs& a);

}  // namespace rsd
