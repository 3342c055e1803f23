// Shared device helpers: element types and conversions, aligned vectors, Welford statistics,
// wave and block reductions. Everything here is wave-size agnostic.
#pragma once

#include "rocm_sd/compat.h"

namespace rsd {

// bf16 as raw bits: the bf16 headers differ across HIP 5.x, HIP 6+ and CUDA, while the
// conversion is two integer operations, so rocm_sd owns it.
struct bf16 {
  uint16_t bits;
};

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(bf16 v) { return __uint_as_float(uint32_t(v.bits) << 16); }

template <class T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ bf16 from_float<bf16>(float v) {
#if defined(__HIP_DEVICE_COMPILE__) && (defined(__GFX11__) || defined(__GFX12__))
  // RDNA3 / RDNA4: the compiler's own conversion, the same rounding as selects. Written out as below, the NaN test
  // became divergent branches around every conversion there, and the attention kernels spilled
  // (bench/results/amd-resources-*.md). Elsewhere the code below keeps fewer registers live (CDNA's bf16 kernels
  // lose occupancy with the selects).
  return bf16{__builtin_bit_cast(uint16_t, static_cast<__bf16>(v))};
#else
  // Round to nearest even; NaN stays NaN (quiet bit forced so truncation cannot make it Inf).
  uint32_t u = __float_as_uint(v);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{uint16_t((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{uint16_t(u >> 16)};
#endif
}

// VEC consecutive elements, loaded and stored as one access of VEC * sizeof(T) bytes.
template <class T, int VEC>
struct alignas(sizeof(T) * VEC) Vec {
  T v[VEC];
};

template <class T, int VEC>
__device__ __forceinline__ Vec<T, VEC> load_vec(const T* p) {
  return *reinterpret_cast<const Vec<T, VEC>*>(p);
}

template <class T, int VEC>
__device__ __forceinline__ void store_vec(T* p, const Vec<T, VEC>& v, bool streaming) {
  if (streaming)
    store_streaming(reinterpret_cast<Vec<T, VEC>*>(p), v);
  else
    *reinterpret_cast<Vec<T, VEC>*>(p) = v;
}

// Count, mean and sum of squared deviations (M2) of a set of values, in fp32.
// Merging uses Chan et al.'s parallel formula, which stays accurate when the mean is large
// compared to the spread (the naive E[x^2] - E[x]^2 does not).
struct WelfordStats {
  float n;
  float mean;
  float m2;
};

__device__ __forceinline__ WelfordStats welford_merge(WelfordStats a, WelfordStats b) {
  const float n = a.n + b.n;
  if (n == 0.f) return a;
  const float delta = b.mean - a.mean;
  const float wb = b.n / n;
  WelfordStats r;
  r.n = n;
  r.mean = a.mean + delta * wb;
  r.m2 = a.m2 + b.m2 + delta * delta * a.n * wb;
  return r;
}

// Per-thread accumulator: sums of (x - shift), with the shift one value of the same data (set before
// the first add), so that the sums do not cancel catastrophically when the mean is large compared to
// the spread. Threads sharing a shift can be summed directly (block_sum); otherwise converted to
// WelfordStats before values from different threads are combined. No per-element bookkeeping: at
// memory speed a GroupNorm has ~15 instructions per element to spend in all (see
// bench/notes/group_norm.md), so the count advances per vector.
struct ShiftedSums {
  float shift = 0.f;
  float sum = 0.f;
  float sumsq = 0.f;
  float n = 0.f;

  // Adds v + bias (bias: one value for the vector, e.g. the input bias of its channel).
  template <class T, int VEC>
  __device__ __forceinline__ void add(const Vec<T, VEC>& v, float bias = 0.f) {
    const float offset = bias - shift;
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const float d = to_float(v.v[k]) + offset;
      sum += d;
      sumsq = fmaf(d, d, sumsq);
    }
    n += float(VEC);
  }

  // Adds v[k] + bias[k] for the COUNT elements from FIRST on (a vector across channels, channels_last: all of
  // it, or the part of it in one group).
  template <int FIRST, int COUNT, class T, int VEC>
  __device__ __forceinline__ void add(const Vec<T, VEC>& v, const float (&bias)[VEC]) {
#pragma unroll
    for (int k = FIRST; k < FIRST + COUNT; ++k) {
      const float d = to_float(v.v[k]) + (bias[k] - shift);
      sum += d;
      sumsq = fmaf(d, d, sumsq);
    }
    n += float(COUNT);
  }
  template <class T, int VEC>
  __device__ __forceinline__ void add(const Vec<T, VEC>& v, const float (&bias)[VEC]) {
    add<0, VEC>(v, bias);
  }

  __device__ __forceinline__ WelfordStats stats() const {
    WelfordStats s;
    s.n = n;
    if (n == 0.f) {
      s.mean = 0.f;
      s.m2 = 0.f;
      return s;
    }
    const float mean_d = sum / n;
    s.mean = shift + mean_d;
    s.m2 = fmaxf(sumsq - sum * mean_d, 0.f);
    return s;
  }
};

__device__ __forceinline__ WelfordStats wave_reduce(WelfordStats s) {
#pragma unroll
  for (int offset = RSD_WAVE / 2; offset > 0; offset /= 2) {
    WelfordStats o;
    o.n = shfl_xor(s.n, offset);
    o.mean = shfl_xor(s.mean, offset);
    o.m2 = shfl_xor(s.m2, offset);
    s = welford_merge(s, o);
  }
  return s;
}

// Sum over the wave; the result is valid in every lane (all lanes of the wave must take part).
__device__ __forceinline__ float wave_sum(float v) {
#pragma unroll
  for (int offset = RSD_WAVE / 2; offset > 0; offset /= 2) v += shfl_xor(v, offset);
  return v;
}

// Block reductions; results are valid in every thread. `scratch` is shared memory of
// kReduceScratchFloats floats. They contain __syncthreads: call from all threads of the block.
constexpr int kReduceScratchFloats = 3 * RSD_MAX_WAVES_PER_BLOCK;

__device__ __forceinline__ WelfordStats block_reduce(WelfordStats s, float* scratch) {
  WelfordStats* per_wave = reinterpret_cast<WelfordStats*>(scratch);
  s = wave_reduce(s);
  const int waves = (blockDim.x + RSD_WAVE - 1) / RSD_WAVE;
  if (lane_id() == 0) per_wave[wave_id()] = s;
  __syncthreads();
  WelfordStats r = per_wave[0];
  for (int w = 1; w < waves; ++w) r = welford_merge(r, per_wave[w]);
  __syncthreads();  // scratch may be reused by the caller
  return r;
}

// Sum of per-thread ShiftedSums that all use the same shift: plain additions, no Welford merges (a
// merge costs a division; at memory speed every instruction per element counts).
__device__ __forceinline__ ShiftedSums block_sum(ShiftedSums s, float* scratch) {
#pragma unroll
  for (int offset = RSD_WAVE / 2; offset > 0; offset /= 2) {
    s.sum += shfl_xor(s.sum, offset);
    s.sumsq += shfl_xor(s.sumsq, offset);
    s.n += shfl_xor(s.n, offset);
  }
  const int waves = (blockDim.x + RSD_WAVE - 1) / RSD_WAVE;
  if (lane_id() == 0) {
    scratch[3 * wave_id()] = s.sum;
    scratch[3 * wave_id() + 1] = s.sumsq;
    scratch[3 * wave_id() + 2] = s.n;
  }
  __syncthreads();
  s.sum = s.sumsq = s.n = 0.f;
  for (int w = 0; w < waves; ++w) {
    s.sum += scratch[3 * w];
    s.sumsq += scratch[3 * w + 1];
    s.n += scratch[3 * w + 2];
  }
  __syncthreads();
  return s;
}

__device__ __forceinline__ float silu(float y) { return y / (1.f + expf(-y)); }

// SiLU for 16-bit outputs. On NVIDIA: y * sigmoid(y) with sigmoid(y) = 0.5 + 0.5 tanh(y / 2), one
// hardware tanh (MUFU) instead of an exponential and a reciprocal (two MUFU): the MUFU pipe runs at
// 1/8 of the FMA rate, and at two per element it alone would cap a GroupNorm+SiLU near 86% of copy
// bandwidth on H100/H200. tanh.approx's error (~2^-11 relative) is an absolute error of at most
// ~2.5e-4 |y| in the result: half an fp16 ulp for y > 0, and within the tests' fp16 bound
// (DESIGN.md convention 7) where the output is small (y << 0). On AMD, exp and rcp are the
// hardware's transcendental ops.
__device__ __forceinline__ float silu_fast(float y) {
#if defined(RSD_PLATFORM_CUDA)
  float t;
  asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(0.5f * y));
  return y * fmaf(0.5f, t, 0.5f);
#else
  return __fdividef(y, 1.f + __expf(-y));
#endif
}

// n / d for 32-bit n < 2^31 and a divisor fixed per launch, with a multiply-high and a shift
// instead of the ~20-instruction integer division (Granlund and Montgomery, 1994).
struct FastDiv {
  uint32_t divisor, multiplier, shift;

  FastDiv() = default;
  __host__ __device__ explicit FastDiv(uint32_t d) : divisor(d), multiplier(0), shift(0) {
    while ((uint64_t(1) << shift) < d) ++shift;
    multiplier = uint32_t(((uint64_t(1) << 32) * ((uint64_t(1) << shift) - d)) / d + 1);
  }
  __device__ __forceinline__ uint32_t div(uint32_t n) const { return (__umulhi(n, multiplier) + n) >> shift; }
};

}  // namespace rsd
