// The host interface of hip/bias_residual/ (conventions: rocm_sd/api.h):
// y = (x + residual + bias[c]) * scale, x / residual / y of one shape and layout
#pragma once

#include <cstdint>
#include <string>

#include "rocm_sd/api.h"

namespace rsd {

struct BiasResidualArgs {
  const void* x;
  const void* residual;
  const void* bias;  // (C,), dtype of x
  void* y;
  DType dtype;
  Layout layout;     // nchw: contiguous; nhwc: channels innermost (4-D channels_last)
  int64_t n, c, hw;
  float scale;
  void* stream;
  int device;
};
std::string bias_residual_check(const BiasResidualArgs& a);
std::string bias_residual_forward(const BiasResidualArgs& a);

}  // namespace rsd
