// The host interface of hip/quantize/ (conventions: rocm_sd/api.h): per-row symmetric quantization of x (rows, k),
// row-major contiguous, into 8-bit codes q (rows, k) and one float32 scale per row, x ~= q * scale:
//
//   scale[m] = max(amax_m, kMinAmax) / fmax        amax_m = max |x[m, :]| (NaN if the row holds one)
//   q[m, j]  = encode(clamp(x[m, j] * (fmax / max(amax_m, kMinAmax)), -fmax, fmax))
//
// encode is round-to-nearest-even into the format: the GEMM operands of optimize(precision="fp8"/"int8").
//
// The kernels that quantize their own output (LayerNorm, GEGLU) also take a bound: a value no element of their output
// can exceed (patch/precision.py derives it from the weights). With bound > 0 every row takes amax_m = bound, one
// scale for the whole tensor, which the per-tensor FP8 GEMM needs. fp8 formats only: an int8 code cannot carry a NaN,
// and a row's NaN then reaches the GEMM through its scale alone.
#pragma once

#include "rocm_sd/rtc.h"
#if !RSD_RTC  // the kernels (also compiled at run time) need QuantFormat only
#include <cmath>
#include <cstdint>
#include <string>
#endif

#include "rocm_sd/api.h"

namespace rsd {

// fp8 e4m3 as OCP defines it (gfx950, gfx12, NVIDIA sm_89+; max 448), the "fnuz" variant of gfx942 (exponent bias
// 8, no negative zero, one NaN; max 240), and int8 (max 127). Values match torch.float8_e4m3fn / float8_e4m3fnuz /
// int8 and ops/quantize.py's FORMAT_CODES.
enum class QuantFormat : int { e4m3fn = 0, e4m3fnuz = 1, int8 = 2 };

struct QuantizeRowsArgs {
  const void* x;   // (rows, k)
  void* q;         // (rows, k) one byte each
  float* scale;    // (rows,)
  DType dtype;     // of x
  QuantFormat format;
  int64_t rows, k;
  void* stream;
  int device;
  int64_t rows_per_batch = 0;  // > 0: x's rows come in batches of this many contiguous rows, batch_stride elements
  int64_t batch_stride = 0;    // apart (q and scale stay contiguous); 0: x is (rows, k) contiguous
};
#if !RSD_RTC
std::string quantize_rows_check(const QuantizeRowsArgs& a);
std::string quantize_rows_forward(const QuantizeRowsArgs& a);

// A quantized output's bound: 0 (a scale per row), or finite and positive with an fp8 format.
inline bool bound_ok(float bound, QuantFormat format) {
  return bound == 0.f || (std::isfinite(bound) && bound > 0.f && format != QuantFormat::int8);
}
inline std::string bound_problem(float bound) {
  return "bound " + std::to_string(bound) + " is not 0 (a scale per row) or a finite positive value with an fp8 format";
}
#endif

}  // namespace rsd
