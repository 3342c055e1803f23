// The host interface of hip/gelu_tanh/ (conventions: rocm_sd/api.h): y = gelu(x + bias, approximate="tanh") for x of
// shape (rows, d), row-major contiguous, bias (d,) or none: the diffusion transformers' feed-forward activation after
// a GEMM without its bias+GELU epilogue. With q and scale and no y, y is not written but quantized per row into them
// (rocm_sd/quantize/api.h): the 8-bit input of the feed-forward's output projection.
#pragma once

#include <cstdint>
#include <string>

#include "rocm_sd/api.h"
#include "rocm_sd/quantize/api.h"

namespace rsd {

struct GeluTanhArgs {
  const void* x;     // (rows, d)
  const void* bias;  // (d,), or nullptr
  void* y;           // (rows, d), or nullptr (then q is given)
  DType dtype;       // of x, bias and y
  int64_t rows, d;
  void* stream;
  int device;
  void* q = nullptr;       // (rows, d) one byte each: y quantized per row, or nullptr
  float* scale = nullptr;  // (rows,): its scales; set exactly when q is
  QuantFormat format = QuantFormat::e4m3fn;
  float bound = 0.f;  // > 0: one scale for every row, bound / fmax (rocm_sd/quantize/api.h); fp8 only
};
std::string gelu_tanh_check(const GeluTanhArgs& a);
std::string gelu_tanh_forward(const GeluTanhArgs& a);
// The quantized rows' block size for rows of d features in vectors of vec on waves of `wave` lanes: a block per row of
// that many threads, or 0 where a row is too long for one block (then the op quantizes y in a second pass).
int gelu_tanh_row_block_threads(int64_t d, int vec, int wave);

}  // namespace rsd
