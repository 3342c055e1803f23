// The AdaLN-Zero modulation of diffusion transformers (SD3 / SD3.5 MMDiT, Flux), one row group per row, the row in
// registers:
//
//   out[m, :] = (x[m, :] - mean_m) * rstd_m * (1 + scale[b, :]) + shift[b, :]      b = m / tokens
//
// and its gated-residual form, the block's "h = h + gate * attn_out; norm2(h) * (1 + scale) + shift" as one pass:
//
//   h[m, :]   = x[m, :] + gate[b, :] * y[m, :]     (in fp32, rounded once to the storage type)
//   out[m, :] = the above of h[m, :]                (statistics of the rounded h, as the op's reference of it)
//
// DiT rows are long (C = 1536..3072: 3-6 KB in 16 bits) and there are few of them (B * L ~ 4-16k), so a row is
// spread over a row group of 1-16 waves (a block's barrier joins the waves' sums) holding about two 16-byte vectors
// a lane: each thread keeps 16-32 bytes of x (and as much of y) in flight, a block of a few hundred threads holds a
// row, and a multiprocessor runs enough of them to cover DRAM latency on MI300 (2048 threads a CU) and Hopper. Short
// rows (C < 2 vectors a lane of one wave) take one wave each, several rows a block, as layer_norm.hip.
// Statistics are two-pass from the registers (exact, no E[x^2] cancellation); one read of x (and y), one write of
// out (and h). scale / shift / gate are (batch, C) at any strides (chunks of one embedding); their rows are read per
// element group and stay in cache across the row's tokens. 16-byte accesses where every row and parameter pointer
// allows them, scalar ones otherwise (C = 33, transposed parameters).
//
// With q and scale and no out (optimize(precision="fp8"/"int8"): every consumer of the modulated row is an 8-bit
// projection), the modulated row, still in registers, is quantized per row as rocm_sd::quantize_rows would quantize
// out, and only the 8-bit row and its scale are written (and h): the projections' input without writing out and
// reading it back. The row group's max |out| joins the waves through the block's barrier as the sums do.
#include "rocm_sd/common.h"
#include "rocm_sd/compat.h"
#include "rocm_sd/quantize/encode.h"
#if !RSD_RTC  // host side; runtime compilation (rocm_sd/jit/) takes the kernels only (rocm_sd/rtc.h)
#include <algorithm>
#include <cstdint>
#include <string>

#include "rocm_sd/ada_layer_norm/api.h"
#include "rocm_sd/launch.h"
#endif

namespace rsd {
namespace {

constexpr int kMaxThreads = 512;     // a block at most: its launch bound leaves 128 registers a thread on NVIDIA
constexpr int kBlockThreads = 256;   // rows of one wave share blocks of this size
constexpr int kMaxVecsPerLane = 8;
constexpr int kTargetVecsPerLane = 2;
// The quantized output is instantiated for 16-bit activations in 16-byte vectors only (DiT widths are multiples of 64):
// every other call quantizes out with rocm_sd::quantize_rows instead (the op's check says so).
constexpr int kQuantizeVec = 8;

struct QuantizedOut {
  uint8_t* q;
  float* scale;
  QuantFormat format;
  float bound;  // > 0: the tensor's one scale (rocm_sd/quantize/api.h)
};

// VEC consecutive parameters of channel ch: one access at a channel stride of 1 (VEC > 1: the launcher's rule),
// else one element at any stride.
template <class T, int VEC>
__device__ __forceinline__ Vec<T, VEC> load_param(const T* p, int64_t batch_offset, int channel_stride, int ch) {
  if constexpr (VEC > 1) {
    return load_vec<T, VEC>(p + batch_offset + ch);
  } else {
    Vec<T, 1> r;
    r.v[0] = p[batch_offset + int64_t(ch) * channel_stride];
    return r;
  }
}

// Sum over the row group (row_threads consecutive threads, a multiple of the wave); every thread of the block calls
// it (barrier), with its own `partial` array per use (no second barrier before the next).
__device__ __forceinline__ float row_sum(float v, int row_threads, float* partial) {
  v = wave_sum(v);
  if (row_threads <= RSD_WAVE) return v;  // uniform over the launch
  if (lane_id() == 0) partial[wave_id()] = v;
  __syncthreads();
  const int waves = row_threads / RSD_WAVE;
  const int first = int(threadIdx.x) / row_threads * waves;
  float total = 0.f;
  for (int w = 0; w < waves; ++w) total += partial[first + w];
  return total;
}

// Max |v| over the row group, NaN kept (absmax_nan); called as row_sum.
__device__ __forceinline__ float row_absmax(float v, int row_threads, float* partial) {
  v = wave_absmax(v);
  if (row_threads <= RSD_WAVE) return v;
  if (lane_id() == 0) partial[wave_id()] = v;
  __syncthreads();
  const int waves = row_threads / RSD_WAVE;
  const int first = int(threadIdx.x) / row_threads * waves;
  float total = 0.f;
  for (int w = 0; w < waves; ++w) total = absmax_nan(total, partial[first + w]);
  return total;
}

template <class T, int VEC, int VECS, bool kGate, bool kQuantize>
__global__ void __launch_bounds__(kMaxThreads)
    ada_layer_norm_rows(const T* __restrict__ x, const T* __restrict__ y, const T* __restrict__ gate,
                        const T* __restrict__ scale, const T* __restrict__ shift, T* __restrict__ h,
                        T* __restrict__ out, int64_t rows, int tokens, int c, int gate_batch_stride,
                        int gate_channel_stride, int scale_batch_stride, int scale_channel_stride,
                        int shift_batch_stride, int shift_channel_stride, float eps, int row_threads,
                        QuantizedOut quantized) {
  __shared__ float partial_sum[RSD_MAX_WAVES_PER_BLOCK];
  __shared__ float partial_m2[RSD_MAX_WAVES_PER_BLOCK];
  __shared__ float partial_amax[kQuantize ? RSD_MAX_WAVES_PER_BLOCK : 1];
  const int group = int(threadIdx.x) / row_threads;
  const int t = int(threadIdx.x) - group * row_threads;
  const int64_t row = int64_t(blockIdx.x) * (int(blockDim.x) / row_threads) + group;
  const bool active = row < rows;  // an idle row group still joins the barriers
  const int vectors = active ? c / VEC : 0;
  const int64_t b = active ? row / tokens : 0;
  const int64_t offset = row * c;
  Vec<T, VEC> v[VECS];
  float sum = 0.f;
#pragma unroll
  for (int k = 0; k < VECS; ++k) {
    const int j = t + k * row_threads;
    if (j < vectors) {
      v[k] = load_vec<T, VEC>(x + offset + j * VEC);
      if constexpr (kGate) {
        const Vec<T, VEC> r = load_vec<T, VEC>(y + offset + j * VEC);
        const Vec<T, VEC> g = load_param<T, VEC>(gate, b * gate_batch_stride, gate_channel_stride, j * VEC);
#pragma unroll
        for (int e = 0; e < VEC; ++e)
          v[k].v[e] = from_float<T>(fmaf(to_float(g.v[e]), to_float(r.v[e]), to_float(v[k].v[e])));
        store_vec(h + offset + j * VEC, v[k], false);
      }
#pragma unroll
      for (int e = 0; e < VEC; ++e) sum += to_float(v[k].v[e]);
    }
  }
  const float mean = row_sum(sum, row_threads, partial_sum) / float(c);
  float m2 = 0.f;
#pragma unroll
  for (int k = 0; k < VECS; ++k) {
    if (t + k * row_threads < vectors) {
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const float d = to_float(v[k].v[e]) - mean;
        m2 = fmaf(d, d, m2);
      }
    }
  }
  const float rstd = rsqrtf(row_sum(m2, row_threads, partial_m2) / float(c) + eps);  // biased variance, as torch
  float amax = 0.f;
#pragma unroll
  for (int k = 0; k < VECS; ++k) {
    const int j = t + k * row_threads;
    if (j < vectors) {
      const Vec<T, VEC> s = load_param<T, VEC>(scale, b * scale_batch_stride, scale_channel_stride, j * VEC);
      const Vec<T, VEC> sh = load_param<T, VEC>(shift, b * shift_batch_stride, shift_channel_stride, j * VEC);
      Vec<T, VEC> o;
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        o.v[e] = from_float<T>(fmaf((to_float(v[k].v[e]) - mean) * rstd, 1.f + to_float(s.v[e]), to_float(sh.v[e])));
        if constexpr (kQuantize) amax = absmax_nan(amax, to_float(o.v[e]));  // of out as stored: quantize_rows(out)
      }
      if constexpr (kQuantize) v[k] = o;
      else store_vec(out + offset + j * VEC, o, false);
    }
  }
  if constexpr (kQuantize) {
    // the bound is the launch's: uniform, so either every thread joins the barrier or none does
    if (quantized.bound <= 0.f) amax = row_absmax(amax, row_threads, partial_amax);
    const float inv = scale_from_amax(quantized.bound > 0.f ? quantized.bound : amax, quantized.format,
                                      quantized.scale + row, active && t == 0);
#pragma unroll
    for (int k = 0; k < VECS; ++k) {
      const int j = t + k * row_threads;
      if (j < vectors) store_vec(quantized.q + offset + j * VEC, encode_vec(v[k], inv, quantized.format), false);
    }
  }
}

#if !RSD_RTC
// What the launcher decides: vector width, vectors a lane (an instantiated count), threads a row and rows a block.
struct Plan {
  int vec, vecs, row_threads, rows_per_block;
};

// The widest vector that a (batch, channel)-strided parameter allows: a channel stride of 1, the pointer and the
// batch stride aligned for it.
int param_vec(int vec, DType dtype, const void* p, const int64_t (&stride)[2]) {
  if (stride[1] != 1) return 1;
  while (vec > 1 && (!aligned(p, vec * elem_bytes(dtype)) || stride[0] % vec != 0)) vec /= 2;
  return vec;
}

Plan plan_launch(const AdaLayerNormArgs& a) {
  int vec = widest_vec(a.dtype, a.c, {a.x, a.out, a.y, a.h});
  vec = param_vec(param_vec(vec, a.dtype, a.scale, a.scale_stride), a.dtype, a.shift, a.shift_stride);
  if (a.gate) vec = param_vec(vec, a.dtype, a.gate, a.gate_stride);
  // 64 when the runtime cannot say: a row group of whole waves of 64 is whole waves of 32 too
  const int wave = device_attribute(a.device, Attr::wave_size, 64);
  const int64_t vectors = a.c / vec;
  const int64_t wanted = ceil_div(ceil_div(vectors, kTargetVecsPerLane), wave) * wave;
  const int row_threads = int(std::min<int64_t>(std::max<int64_t>(wanted, wave), kMaxThreads));
  const int64_t need = ceil_div(vectors, row_threads);
  int vecs = 1;
  while (vecs < need && vecs <= kMaxVecsPerLane) vecs *= 2;  // past kMaxVecsPerLane: refused by the check
  return {vec, vecs, row_threads, std::max(1, kBlockThreads / row_threads)};
}

template <class T, int VEC, bool kGate, bool kQuantize>
void launch_vecs(const AdaLayerNormArgs& a, const Plan& p, hipStream_t stream) {
  const unsigned blocks = unsigned(ceil_div(a.batch * a.tokens, p.rows_per_block));
  const int threads = p.row_threads * p.rows_per_block;
  const T* x = static_cast<const T*>(a.x);
  const T* y = static_cast<const T*>(a.y);
  const T* g = static_cast<const T*>(a.gate);
  const T* s = static_cast<const T*>(a.scale);
  const T* sh = static_cast<const T*>(a.shift);
  T* h = static_cast<T*>(a.h);
  T* out = static_cast<T*>(a.out);
  const int64_t rows = a.batch * a.tokens;
  const int tokens = int(a.tokens), c = int(a.c);
  const int gb = int(a.gate_stride[0]), gc = int(a.gate_stride[1]), sb = int(a.scale_stride[0]);
  const int sc = int(a.scale_stride[1]), hb = int(a.shift_stride[0]), hc = int(a.shift_stride[1]);
  const QuantizedOut qo{static_cast<uint8_t*>(a.q), a.q_scale, a.format, a.bound};
  switch (p.vecs) {
    case 1: ada_layer_norm_rows<T, VEC, 1, kGate, kQuantize><<<blocks, threads, 0, stream>>>(x, y, g, s, sh, h, out, rows, tokens, c, gb, gc, sb, sc, hb, hc, a.eps, p.row_threads, qo); break;
    case 2: ada_layer_norm_rows<T, VEC, 2, kGate, kQuantize><<<blocks, threads, 0, stream>>>(x, y, g, s, sh, h, out, rows, tokens, c, gb, gc, sb, sc, hb, hc, a.eps, p.row_threads, qo); break;
    case 4: ada_layer_norm_rows<T, VEC, 4, kGate, kQuantize><<<blocks, threads, 0, stream>>>(x, y, g, s, sh, h, out, rows, tokens, c, gb, gc, sb, sc, hb, hc, a.eps, p.row_threads, qo); break;
    default: ada_layer_norm_rows<T, VEC, 8, kGate, kQuantize><<<blocks, threads, 0, stream>>>(x, y, g, s, sh, h, out, rows, tokens, c, gb, gc, sb, sc, hb, hc, a.eps, p.row_threads, qo); break;
  }
}

template <class T, int VEC, bool kGate>
void launch_quantized_or_not(const AdaLayerNormArgs& a, const Plan& p, hipStream_t stream) {
  if constexpr (VEC == kQuantizeVec && sizeof(T) == 2) {
    if (a.q) return launch_vecs<T, VEC, kGate, true>(a, p, stream);
  }
  launch_vecs<T, VEC, kGate, false>(a, p, stream);
}

template <class T, int VEC>
void launch_vecs(const AdaLayerNormArgs& a, const Plan& p, hipStream_t stream) {
  if (a.y)
    launch_quantized_or_not<T, VEC, true>(a, p, stream);
  else
    launch_quantized_or_not<T, VEC, false>(a, p, stream);
}

template <class T>
void launch(const AdaLayerNormArgs& a, hipStream_t stream) {
  const Plan p = plan_launch(a);
  switch (p.vec) {
    case 8: if constexpr (sizeof(T) == 2) launch_vecs<T, 8>(a, p, stream); break;
    case 4: launch_vecs<T, 4>(a, p, stream); break;
    case 2: launch_vecs<T, 2>(a, p, stream); break;
    default: launch_vecs<T, 1>(a, p, stream); break;
  }
}

#endif  // !RSD_RTC
}  // namespace

#if !RSD_RTC
std::string ada_layer_norm_check(const AdaLayerNormArgs& a) {
  if (a.batch <= 0 || a.tokens <= 0 || a.c <= 0) return "empty tensor";
  if ((a.y == nullptr) != (a.gate == nullptr) || (a.y == nullptr) != (a.h == nullptr))
    return "y, gate and h come together";
  if ((a.q == nullptr) != (a.q_scale == nullptr)) return "q and scale come together";
  if ((a.q == nullptr) == (a.out == nullptr)) return "one output: out, or q and scale";
  if (a.q) {
    if (a.format != QuantFormat::e4m3fn && a.format != QuantFormat::e4m3fnuz && a.format != QuantFormat::int8)
      return "unknown format code " + std::to_string(int(a.format));
    if (!bound_ok(a.bound, a.format)) return bound_problem(a.bound);
    if (elem_bytes(a.dtype) != 2 || plan_launch(a).vec != kQuantizeVec || !aligned(a.q, kQuantizeVec) ||
        !aligned(a.q_scale, 4))
      return "quantized output needs fp16/bf16 rows of a multiple of 8 channels and parameters, 16-byte aligned";
  }
  for (const void* ptr : {a.x, static_cast<const void*>(a.out), a.scale, a.shift, a.y, a.gate,
                          static_cast<const void*>(a.h)})
    if (!aligned(ptr, elem_bytes(a.dtype))) return "misaligned data pointer";
  if (a.tokens >= (int64_t(1) << 31) || a.batch * a.tokens * a.c >= (int64_t(1) << 40)) return "tensor too large";
  for (const int64_t* stride : {a.scale_stride, a.shift_stride, a.gate_stride})
    if (stride[0] < 0 || stride[1] < 0 || stride[0] >= (int64_t(1) << 31) || stride[1] >= (int64_t(1) << 31))
      return "parameter strides out of range";
  if (plan_launch(a).vecs > kMaxVecsPerLane)
    return "normalized size " + std::to_string(a.c) + " is too large for the kernel's row of " +
           std::to_string(kMaxThreads) + " threads";
  return std::string();
}

std::string ada_layer_norm_forward(const AdaLayerNormArgs& a) {
  std::string why = ada_layer_norm_check(a);
  if (!why.empty()) return why;
  DeviceGuard guard(a.device);
  if (!guard.error().empty()) return guard.error();
  hipStream_t stream = static_cast<hipStream_t>(a.stream);
  switch (a.dtype) {
    case DType::f32: launch<float>(a, stream); break;
    case DType::f16: launch<__half>(a, stream); break;
    case DType::bf16: launch<bf16>(a, stream); break;
  }
  const hipError_t err = hipGetLastError();
  if (err != hipSuccess) return std::string("ada_layer_norm launch failed: ") + hipGetErrorString(err);
  return std::string();
}

#endif  // !RSD_RTC

}  // namespace rsd
