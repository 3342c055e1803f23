// The host interface of hip/geglu/ (conventions: rocm_sd/api.h): y = x[:, :D] * gelu(x[:, D:]) for x of shape
// (rows, 2D), row-major contiguous
#pragma once

#include <cstdint>
#include <string>

#include "rocm_sd/api.h"

namespace rsd {

struct GegluArgs {
  const void* x;  // (rows, 2 * d)
  void* y;        // (rows, d)
  DType dtype;    // of x and y
  int64_t rows, d;
  void* stream;
  int device;
};
std::string geglu_check(const GegluArgs& a);
std::string geglu_forward(const GegluArgs& a);

}  // namespace rsd
