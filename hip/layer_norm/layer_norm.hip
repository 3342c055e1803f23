// LayerNorm over the last dimension, one wave per row, the row held in registers:
//
//   y[m, :] = (x[m, :] - mean_m) * rstd_m * gamma + beta        x: (M, C) rows, C <= 16 vectors a lane
//
// and its residual form (SkipLayerNorm), the transformer block's "h = attn_out + h; norm2(h)" as one pass:
//
//   sum[m, :] = x[m, :] + residual[m, :]   (rounded to the storage type, as torch's add)
//   y[m, :]   = LayerNorm(sum[m, :])        (statistics of the rounded sum, as torch's layer_norm of it)
//
// The transformer blocks of SD normalise (B * HW, C) activations with C = 320..1280: rows of 0.6-2.5 KB.
// A wave loads its row once (up to kMaxVecsPerLane 16-byte vectors a lane), reduces the mean with
// shuffles, then the variance about that mean from the same registers (two-pass: exact, no E[x^2]
// cancellation), and writes the row: one read and one write, no shared memory, no block barrier.
//
// With q and scale (optimize(precision="fp8"/"int8")), the normalised row, still in registers, is also quantized
// per row as rocm_sd::quantize_rows would quantize y: the 8-bit input of the projections that follow, without
// a second pass over y. Without y (y == nullptr, q given) only the quantized row is written (and the sum): for a norm
// whose every consumer multiplies its 8-bit rows (rocm_sd::layer_norm_quantized / add_layer_norm_quantized).
#include "rocm_sd/common.h"
#include "rocm_sd/compat.h"
#include "rocm_sd/quantize/encode.h"
#if !RSD_RTC  // host side; runtime compilation (rocm_sd/jit/) takes the kernels only (rocm_sd/rtc.h)
#include <algorithm>
#include <cstdint>
#include <string>

#include "rocm_sd/launch.h"
#include "rocm_sd/layer_norm/api.h"
#endif

namespace rsd {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxVecsPerLane = 16;

#if !RSD_RTC
int pick_vec(const LayerNormArgs& a) { return widest_vec(a.dtype, a.c, {a.x, a.y, a.residual, a.sum}); }
#endif

// The quantized output is instantiated for 16-bit activations in 16-byte vectors only (SD's C = 320..1280):
// every other call quantizes y with rocm_sd::quantize_rows instead (the op's check says so).
constexpr int kQuantizeVec = 8;
constexpr int kMaxQuantizedVecsPerLane = 8;

struct QuantizedOut {
  uint8_t* q;
  float* scale;
  QuantFormat format;
  float bound;  // > 0: the tensor's one scale (rocm_sd/quantize/api.h)
};

template <class T, class P, int VEC, int VECS, bool kResidual, bool kQuantize>
__global__ void __launch_bounds__(kThreads)
    layer_norm_rows(const T* __restrict__ x, const T* __restrict__ residual, T* __restrict__ sum_out, T* __restrict__ y,
                    const P* __restrict__ gamma, const P* __restrict__ beta, int64_t rows, int c, float eps,
                    QuantizedOut quantized) {
  const int waves_per_block = kThreads / RSD_WAVE;
  const int64_t row = int64_t(blockIdx.x) * waves_per_block + wave_id();
  if (row >= rows) return;  // whole waves leave together: row is uniform within a wave
  const int vectors = c / VEC;
  const T* xr = x + row * c;
  Vec<T, VEC> v[VECS];
  float sum = 0.f;
#pragma unroll
  for (int k = 0; k < VECS; ++k) {
    const int j = lane_id() + k * RSD_WAVE;
    if (j < vectors) {
      v[k] = load_vec<T, VEC>(xr + j * VEC);
      if constexpr (kResidual) {
        const Vec<T, VEC> r = load_vec<T, VEC>(residual + row * c + j * VEC);
#pragma unroll
        for (int e = 0; e < VEC; ++e) v[k].v[e] = from_float<T>(to_float(v[k].v[e]) + to_float(r.v[e]));
        store_vec(sum_out + row * c + j * VEC, v[k], false);
      }
#pragma unroll
      for (int e = 0; e < VEC; ++e) sum += to_float(v[k].v[e]);
    }
  }
  const float mean = wave_sum(sum) / float(c);
  float m2 = 0.f;
#pragma unroll
  for (int k = 0; k < VECS; ++k) {
    if (lane_id() + k * RSD_WAVE < vectors) {
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const float d = to_float(v[k].v[e]) - mean;
        m2 = fmaf(d, d, m2);
      }
    }
  }
  const float rstd = rsqrtf(wave_sum(m2) / float(c) + eps);  // biased variance, as torch
  T* yr = y != nullptr ? y + row * c : nullptr;
  float amax = 0.f;
#pragma unroll
  for (int k = 0; k < VECS; ++k) {
    const int j = lane_id() + k * RSD_WAVE;
    if (j < vectors) {
      Vec<T, VEC> out;
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const int ch = j * VEC + e;
        const float g = gamma ? to_float(gamma[ch]) : 1.f;
        const float b = beta ? to_float(beta[ch]) : 0.f;
        out.v[e] = from_float<T>(fmaf((to_float(v[k].v[e]) - mean) * rstd, g, b));
        if constexpr (kQuantize) amax = absmax_nan(amax, to_float(out.v[e]));  // of y as stored: quantize_rows(y)
      }
      if (!kQuantize || y != nullptr) store_vec(yr + j * VEC, out, false);
      if constexpr (kQuantize) v[k] = out;
    }
  }
  if constexpr (kQuantize) {
    const float inv = row_scale(amax, quantized.format, quantized.scale + row, quantized.bound);
    uint8_t* qr = quantized.q + row * c;
#pragma unroll
    for (int k = 0; k < VECS; ++k) {
      const int j = lane_id() + k * RSD_WAVE;
      if (j < vectors) store_vec(qr + j * VEC, encode_vec(v[k], inv, quantized.format), false);
    }
  }
}

// Vectors a lane must hold for this row length, rounded up to an instantiated count (1, 2, 4, 8, 16).
#if !RSD_RTC
int vecs_per_lane(const LayerNormArgs& a, int vec) {
  const int wave = device_attribute(a.device, Attr::wave_size, 32);  // 32 is the safe guess: more vectors a lane
  const int64_t need = (a.c / vec + wave - 1) / wave;
  int count = 1;
  while (count < need) count *= 2;
  return count;
}

template <class T, class P, int VEC, bool kResidual, bool kQuantize>
void launch_vecs(const LayerNormArgs& a, int vecs, hipStream_t stream) {
  const int waves = kThreads / device_attribute(a.device, Attr::wave_size, 32);
  const unsigned blocks = unsigned((a.rows + waves - 1) / waves);
  const T* x = static_cast<const T*>(a.x);
  const T* r = static_cast<const T*>(a.residual);
  T* sum = static_cast<T*>(a.sum);
  T* y = static_cast<T*>(a.y);
  const P* g = static_cast<const P*>(a.gamma);
  const P* b = static_cast<const P*>(a.beta);
  const int c = int(a.c);
  const QuantizedOut qo{static_cast<uint8_t*>(a.q), a.scale, a.format, a.bound};
  switch (vecs) {
    case 1: layer_norm_rows<T, P, VEC, 1, kResidual, kQuantize><<<blocks, kThreads, 0, stream>>>(x, r, sum, y, g, b, a.rows, c, a.eps, qo); break;
    case 2: layer_norm_rows<T, P, VEC, 2, kResidual, kQuantize><<<blocks, kThreads, 0, stream>>>(x, r, sum, y, g, b, a.rows, c, a.eps, qo); break;
    case 4: layer_norm_rows<T, P, VEC, 4, kResidual, kQuantize><<<blocks, kThreads, 0, stream>>>(x, r, sum, y, g, b, a.rows, c, a.eps, qo); break;
    case 8: layer_norm_rows<T, P, VEC, 8, kResidual, kQuantize><<<blocks, kThreads, 0, stream>>>(x, r, sum, y, g, b, a.rows, c, a.eps, qo); break;
    default:  // 16: the quantized rows are held to 8 vectors a lane (16 spill on RDNA3.5/4: layer_norm_check)
      if constexpr (!kQuantize) layer_norm_rows<T, P, VEC, 16, kResidual, false><<<blocks, kThreads, 0, stream>>>(x, r, sum, y, g, b, a.rows, c, a.eps, qo);
      break;
  }
}

template <class T, class P, int VEC, bool kResidual>
void launch_quantized_or_not(const LayerNormArgs& a, int vecs, hipStream_t stream) {
  if constexpr (VEC == kQuantizeVec && sizeof(T) == 2) {
    if (a.q) return launch_vecs<T, P, VEC, kResidual, true>(a, vecs, stream);
  }
  launch_vecs<T, P, VEC, kResidual, false>(a, vecs, stream);
}

template <class T, class P, int VEC>
void launch_vecs(const LayerNormArgs& a, int vecs, hipStream_t stream) {
  if (a.residual)
    launch_quantized_or_not<T, P, VEC, true>(a, vecs, stream);
  else
    launch_quantized_or_not<T, P, VEC, false>(a, vecs, stream);
}

template <class T, class P>
void launch(const LayerNormArgs& a, hipStream_t stream) {
  const int vec = pick_vec(a);
  const int vecs = vecs_per_lane(a, vec);
  switch (vec) {
    case 8: if constexpr (sizeof(T) == 2) launch_vecs<T, P, 8>(a, vecs, stream); break;
    case 4: launch_vecs<T, P, 4>(a, vecs, stream); break;
    case 2: launch_vecs<T, P, 2>(a, vecs, stream); break;
    default: launch_vecs<T, P, 1>(a, vecs, stream); break;
  }
}

template <class T>
void launch_params(const LayerNormArgs& a, hipStream_t stream) {
  if (a.param_dtype == DType::f32)
    launch<T, float>(a, stream);
  else
    launch<T, T>(a, stream);
}

#endif  // !RSD_RTC
}  // namespace

#if !RSD_RTC
std::string layer_norm_check(const LayerNormArgs& a) {
  if (a.rows <= 0 || a.c <= 0) return "empty tensor";
  if (a.param_dtype != a.dtype && a.param_dtype != DType::f32) return "weight/bias dtype must be the input's or float32";
  if ((a.residual == nullptr) != (a.sum == nullptr)) return "residual and sum come together";
  if ((a.q == nullptr) != (a.scale == nullptr)) return "q and scale come together";
  if (a.y == nullptr && a.q == nullptr) return "no output: y, or q and scale, are needed";
  if (a.q) {
    if (a.format != QuantFormat::e4m3fn && a.format != QuantFormat::e4m3fnuz && a.format != QuantFormat::int8)
      return "unknown format code " + std::to_string(int(a.format));
    if (!bound_ok(a.bound, a.format)) return bound_problem(a.bound);
    if (elem_bytes(a.dtype) != 2 || pick_vec(a) != kQuantizeVec || !aligned(a.q, kQuantizeVec) || !aligned(a.scale, 4))
      return "quantized output needs fp16/bf16 rows of a multiple of 8 channels, 16-byte aligned";
    if (vecs_per_lane(a, kQuantizeVec) > kMaxQuantizedVecsPerLane)
      return "quantized output: normalized size " + std::to_string(a.c) + " is over 8 vectors a lane";
  }
  for (const void* ptr : {a.x, static_cast<const void*>(a.y), a.residual, static_cast<const void*>(a.sum)})
    if (!aligned(ptr, elem_bytes(a.dtype))) return "misaligned data pointer";
  if (a.rows * a.c >= (int64_t(1) << 40)) return "tensor too large";
  if (vecs_per_lane(a, pick_vec(a)) > kMaxVecsPerLane)
    return "normalized size " + std::to_string(a.c) + " is too large for the one-wave-per-row kernel";
  return std::string();
}

std::string layer_norm_forward(const LayerNormArgs& a) {
  std::string why = layer_norm_check(a);
  if (!why.empty()) return why;
  DeviceGuard guard(a.device);
  if (!guard.error().empty()) return guard.error();
  hipStream_t stream = static_cast<hipStream_t>(a.stream);
  switch (a.dtype) {
    case DType::f32: launch_params<float>(a, stream); break;
    case DType::f16: launch_params<__half>(a, stream); break;
    case DType::bf16: launch_params<bf16>(a, stream); break;
  }
  const hipError_t err = hipGetLastError();
  if (err != hipSuccess) return std::string("layer_norm launch failed: ") + hipGetErrorString(err);
  return std::string();
}

#endif  // !RSD_RTC

}  // namespace rsd
