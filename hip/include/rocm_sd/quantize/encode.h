// Device-side 8-bit encodings of hip/quantize/ and of the kernels that quantize their output in place of writing it
// (rocm_sd/quantize/api.h has the formats). Software conversions: the same code on every compiler and target
// (HIP 5.x has no fp8 header, CUDA's and ROCm's differ), exact against torch's, and cheap next to the memory
// traffic of the memory-bound kernels they end.
#pragma once

#include "rocm_sd/common.h"
#include "rocm_sd/quantize/api.h"

namespace rsd {

// Rows whose largest magnitude is below this quantize with it instead (an all-zero row gets a finite scale).
constexpr float kMinAmax = 1e-12f;

__host__ __device__ __forceinline__ float format_max(QuantFormat f) {
  return f == QuantFormat::e4m3fn ? 448.f : f == QuantFormat::e4m3fnuz ? 240.f : 127.f;
}

// max(|a|, b) that keeps a NaN: a row holding one quantizes to NaN codes, not to a silently finite result.
__device__ __forceinline__ float absmax_nan(float running, float v) {
  const float a = fabsf(v);
  return (a > running || a != a) ? a : running;
}

__device__ __forceinline__ float wave_absmax(float v) {
#pragma unroll
  for (int offset = RSD_WAVE / 2; offset > 0; offset /= 2) v = absmax_nan(v, shfl_xor(v, offset));
  return v;
}

// clamp(x, -fmax, fmax) that keeps a NaN, as torch.clamp (fminf / fmaxf would turn it into a bound).
__device__ __forceinline__ float clamp_nan(float x, float fmax) { return x != x ? x : fminf(fmaxf(x, -fmax), fmax); }

// x is already scaled into [-fmax, fmax] (or NaN). Round to nearest even, as torch's conversions. NaN: the format's
// canonical NaN code (torch may keep a NaN's sign bit in e4m3fn, 0xFF, which is also NaN there).
__device__ __forceinline__ uint8_t encode_e4m3(float x, bool fnuz) {
  if (x != x) return fnuz ? 0x80 : 0x7F;
  const uint32_t sign = signbit(x) ? 0x80u : 0u;
  const float a = fminf(fabsf(x), fnuz ? 240.f : 448.f);
  const int bias = fnuz ? 8 : 7;
  const int min_exponent = 1 - bias;  // of the normal numbers; below it the quantum is 2^(min_exponent - 3)
  int e;
  frexpf(a, &e);  // a = f * 2^e, f in [0.5, 1): the exponent of a is e - 1
  uint32_t code;
  if (a == 0.f || e - 1 < min_exponent) {
    code = uint32_t(rintf(ldexpf(a, 3 - min_exponent)));  // 0..8; 8 is the smallest normal's code
  } else {
    int exponent = e - 1;
    int mantissa = int(rintf(ldexpf(a, 3 - exponent)));  // 8..16
    if (mantissa == 16) {
      mantissa = 8;
      ++exponent;
    }
    code = (uint32_t(exponent + bias) << 3) | uint32_t(mantissa - 8);
  }
  if (fnuz && code == 0) return 0;  // fnuz has no negative zero (0x80 is its NaN)
  return uint8_t(code | sign);
}

__device__ __forceinline__ uint8_t encode(float x, QuantFormat f) {
  if (f == QuantFormat::int8) {
    // NaN has no int8 code: 0, and the row's scale (NaN, from absmax_nan) carries it into the GEMM's output.
    return x != x ? 0 : uint8_t(int8_t(rintf(fminf(fmaxf(x, -127.f), 127.f))));
  }
  return encode_e4m3(x, f == QuantFormat::e4m3fnuz);
}

}  // namespace rsd
