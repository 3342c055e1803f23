// The host interface of hip/layer_norm/ (conventions: rocm_sd/api.h): LayerNorm over the last dimension of x,
// (rows, c) contiguous; with a residual, of sum = x + residual, which is written too (SkipLayerNorm)
#pragma once

#include <cstdint>
#include <string>

#include "rocm_sd/api.h"

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
};
std::string layer_norm_check(const LayerNormArgs& a);
std::string layer_norm_forward(const LayerNormArgs& a);

}  // namespace rsd
