// Device-side 8-bit encodings of hip/quantize/ and of the kernels that quantize their output in place of writing it
// (rocm_sd/quantize/api.h has the formats). Software conversions: the same code on every compiler and target
// (HIP 5.x has no fp8 header, CUDA's and ROCm's differ) and exact against torch's (tests: every fp16 value). One
// exception, e4m3fn on NVIDIA sm_89+: the hardware's cvt.rn.satfinite.e4m3x2.f32, two elements an instruction, which
// rounds and saturates as the software path does (the same GPU tests hold it to torch's codes); the software encode
// made the fused LayerNorm / GEGLU kernels instruction-bound. AMD's v_cvt_pk_fp8_f32 is not used: no AMD GPU here
// can check its codes against torch's.
#pragma once

#include "rocm_sd/common.h"
#include "rocm_sd/quantize/api.h"

namespace rsd {

// Rows whose largest magnitude is below this quantize with it instead (an all-zero row gets a finite scale).
constexpr float kMinAmax = 1e-12f;

__host__ __device__ constexpr float format_max(QuantFormat f) {
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

// x is already scaled into [-fmax, fmax] (or NaN). Round to nearest even, as torch's conversions, on the float's
// bits (c10's fp8_e4m3fn_from_fp32_value, generalised to both exponent biases): a dozen integer operations and
// selects, no branch, where frexpf / ldexpf / rintf (and, later, a branch per element on the format and the
// subnormal range) made the quantize kernels compute-bound. NaN: the format's canonical NaN code (torch may keep a
// NaN's sign bit in e4m3fn, 0xFF, which is also NaN there).
template <int kBias>
__device__ __forceinline__ uint32_t encode_e4m3_magnitude(uint32_t bits) {
  // Below the smallest normal (2^(1 - bias)): one float addition rounds to the subnormal quantum 2^(-bias - 2), the
  // code is what lands in the low mantissa bits. Both results are computed and one selected: no divergent branch.
  constexpr uint32_t kSmallestNormal = uint32_t(127 + 1 - kBias) << 23;
  constexpr uint32_t kDenormMagic = uint32_t((127 - kBias) + (23 - 3) + 1) << 23;
  const uint32_t subnormal = __float_as_uint(__uint_as_float(bits) + __uint_as_float(kDenormMagic)) - kDenormMagic;
  const uint32_t mantissa_odd = (bits >> 20) & 1u;  // ties to even
  const uint32_t normal = (bits + (uint32_t(kBias - 127) << 23) + 0x7FFFFu + mantissa_odd) >> 20;
  return bits < kSmallestNormal ? subnormal : normal;
}

template <QuantFormat F>
__device__ __forceinline__ uint8_t encode_as(float x) {
  if constexpr (F == QuantFormat::int8) {
    // NaN has no int8 code: 0, and the row's scale (NaN, from absmax_nan) carries it into the GEMM's output.
    const uint8_t code = uint8_t(int8_t(rintf(fminf(fmaxf(x, -127.f), 127.f))));
    return x != x ? uint8_t(0) : code;
  } else {
    constexpr bool kFnuz = F == QuantFormat::e4m3fnuz;
    const uint32_t bits = __float_as_uint(x);
    const uint32_t sign = bits & 0x80000000u;
    const uint32_t code = encode_e4m3_magnitude<kFnuz ? 8 : 7>(bits ^ sign);
    // fnuz has no negative zero (0x80 is its NaN)
    const uint8_t signed_code = kFnuz && code == 0 ? uint8_t(0) : uint8_t(code | (sign >> 24));
    return x != x ? uint8_t(kFnuz ? 0x80 : 0x7F) : signed_code;
  }
}

// From the row's max |x|: writes max(amax, kMinAmax) / fmax to *scale where `write`, and returns the multiplier into
// the format, fmax / max(amax, kMinAmax).
__device__ __forceinline__ float scale_from_amax(float amax, QuantFormat format, float* scale, bool write) {
  const float fmax = format_max(format);
  const float clamped = amax < kMinAmax ? kMinAmax : amax;  // keeps a NaN
  if (write) *scale = clamped / fmax;
  return fmax / clamped;
}

// The row's scale, from each lane's max |x| over its part of the row (one wave per row): lane 0 writes it. With a
// bound (> 0: no value of the tensor can exceed it; the same for every row, so the branch is uniform) the row takes
// the tensor's one scale, bound / fmax, and no reduction.
__device__ __forceinline__ float row_scale(float lane_amax, QuantFormat format, float* scale, float bound = 0.f) {
  return scale_from_amax(bound > 0.f ? bound : wave_absmax(lane_amax), format, scale, lane_id() == 0);
}

#if defined(RSD_PLATFORM_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define RSD_HARDWARE_E4M3FN 1
#endif

template <QuantFormat F, class T, int VEC>
__device__ __forceinline__ Vec<uint8_t, VEC> encode_vec_as(const Vec<T, VEC>& v, float inv) {
  Vec<uint8_t, VEC> out;
#if defined(RSD_HARDWARE_E4M3FN)
  if constexpr (F == QuantFormat::e4m3fn && VEC % 2 == 0) {
    // satfinite: beyond +-448 (infinities included) the largest finite code, as clamp_nan; NaN stays NaN (0x7F)
#pragma unroll
    for (int e = 0; e < VEC; e += 2) {
      uint16_t pair;  // the first operand goes to the upper byte
      asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;"
          : "=h"(pair) : "f"(to_float(v.v[e + 1]) * inv), "f"(to_float(v.v[e]) * inv));
      out.v[e] = uint8_t(pair & 0xFFu);
      out.v[e + 1] = uint8_t(pair >> 8);
    }
    return out;
  }
#endif
  constexpr float kFmax = format_max(F);
#pragma unroll
  for (int e = 0; e < VEC; ++e) out.v[e] = encode_as<F>(clamp_nan(to_float(v.v[e]) * inv, kFmax));
  return out;
}

// One vector of the row in the format, `inv` from row_scale. The format is the same for the whole launch: one
// uniform branch a vector, and each element's code is specialised to its format.
template <class T, int VEC>
__device__ __forceinline__ Vec<uint8_t, VEC> encode_vec(const Vec<T, VEC>& v, float inv, QuantFormat format) {
  switch (format) {
    case QuantFormat::int8: return encode_vec_as<QuantFormat::int8>(v, inv);
    case QuantFormat::e4m3fnuz: return encode_vec_as<QuantFormat::e4m3fnuz>(v, inv);
    default: return encode_vec_as<QuantFormat::e4m3fn>(v, inv);
  }
}

}  // namespace rsd
