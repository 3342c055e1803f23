// The host interface of hip/rms_norm/ (conventions: rocm_sd/api.h): RMSNorm of x's rows (batch, len, heads, d), any
// strides with the last dimension dense; with lead, its rows (batch, lead_len, heads, d) placed before x's in the
// output (joint attention's [text, image]); with cos and sin, the rotary embedding at the joint row index after the norm
#pragma once

#include <cstdint>
#include <string>

#include "rocm_sd/api.h"

namespace rsd {

struct RmsNormArgs {
  const void* x;            // (batch, len, heads, d), strides x_stride (elements) and 1
  const void* weight;       // (d,) or nullptr
  const void* lead;         // (batch, lead_len, heads, d), strides lead_stride and 1, or nullptr (lead_len 0)
  const void* lead_weight;  // (d,) or nullptr: lead's own weight
  const float* cos;         // (lead_len + len, d) contiguous, or nullptr
  const float* sin;         // set exactly when cos is
  void* y;                  // (batch, lead_len + len, heads, d) contiguous
  DType dtype;              // of x, lead and y
  DType param_dtype;        // of weight and lead_weight: dtype or f32
  int64_t batch, len, lead_len, heads, d;
  int64_t x_stride[3];      // batch, sequence, head
  int64_t lead_stride[3];
  float eps;
  void* stream;
  int device;
};
std::string rms_norm_check(const RmsNormArgs& a);
std::string rms_norm_forward(const RmsNormArgs& a);

}  // namespace rsd
