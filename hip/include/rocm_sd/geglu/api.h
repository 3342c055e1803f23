// The host interface of hip/geglu/ (conventions: rocm_sd/api.h): y = x[:, :D] * gelu(x[:, D:]) for x of shape
// (rows, 2D), row-major contiguous; with q and scale, y is also quantized per row into them (rocm_sd/quantize/api.h),
// the 8-bit input of the feed-forward's output projection
#pragma once

#include <cstdint>
#include <string>

#include "rocm_sd/api.h"
#include "rocm_sd/quantize/api.h"

namespace rsd {

struct GegluArgs {
  const void* x;  // (rows, 2 * d)
  void* y;        // (rows, d)
  DType dtype;    // of x and y
  int64_t rows, d;
  void* stream;
  int device;
  void* q = nullptr;       // (rows, d) one byte each: y quantized per row, or nullptr
  float* scale = nullptr;  // (rows,): its scales; set exactly when q is
  QuantFormat format = QuantFormat::e4m3fn;
  float bound = 0.f;               // > 0: one scale for every row, bound / fmax (rocm_sd/quantize/api.h); fp8 only
};
std::string geglu_check(const GegluArgs& a);
std::string geglu_forward(const GegluArgs& a);
// The quantized branch's block size for rows of d features in vectors of vec on waves of `wave` lanes: a block per
// row of that many threads, or 0 where a row is too long for one block (then a wave per row).
int geglu_row_block_threads(int64_t d, int vec, int wave);

}  // namespace rsd
