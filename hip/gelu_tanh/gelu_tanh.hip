// The diffusion transformers' feed-forward activation (SD3 / SD3.5 and Flux: GELU with the tanh approximation) where
// the GEMM before it has no bias+GELU epilogue to fold it into:
//
//   y[m, j] = gelu_tanh(x[m, j] + bias[j]),  x: (M, D) row-major (the GEMM's output without its bias), bias (D,) or none
//
// gelu_tanh(v) = 0.5 v (1 + tanh(u)), u = sqrt(2 / pi) (v + 0.044715 v^3), computed as v / (1 + exp(-2u)): the same
// function (1 + tanh(u) = 2 / (1 + exp(-2u))) in one exponential and one division, with no cancellation in either tail.
// PyTorch runs the bias add and the GELU as two passes and rounds between them; here one read of x, one write of y,
// math in fp32 and one rounding.
//
// With q and scale instead of y (optimize(precision="fp8"/"int8"): the output projection multiplies 8-bit rows), the
// row is quantized as rocm_sd::quantize_rows would quantize y, and only the 8-bit row and its scale are written: one
// block per row, sized to the row (kRowVectors vectors a thread, rounded up to whole waves), keeps the row in
// registers and reduces max |y| across its waves, as geglu.hip's row block. 2 bytes read and 1 written per element,
// where the two passes and quantize_rows move 9.
#include "rocm_sd/common.h"
#include "rocm_sd/compat.h"
#include "rocm_sd/quantize/encode.h"
#if !RSD_RTC  // host side; runtime compilation (rocm_sd/jit/) takes the kernels only (rocm_sd/rtc.h)
#include <algorithm>
#include <cstdint>
#include <string>

#include "rocm_sd/gelu_tanh/api.h"
#include "rocm_sd/launch.h"
#endif

namespace rsd {
namespace {

constexpr int kThreads = 256;
constexpr int kRowMaxThreads = 1024;  // the largest row block
// Vectors of y a thread of a row block keeps in registers: 4, so that a DiT row (9728-12288 features) takes 320-384
// threads and a multiprocessor holds several rows at once; with 2 (768 threads a row) the rows' barriers left too
// few loads in flight (bench/results/notes/2026-12-02-dit-fp8-fusions-h200.md).
constexpr int kRowVectors = 4;
constexpr int kQuantizeVec = 8;       // the quantized rows' one vector width (16-bit rows of a multiple of 8)

__device__ __forceinline__ float gelu_tanh(float v) {
  const float u = 0.79788456080286536f * fmaf(0.044715f * v, v * v, v);
  return __fdividef(v, 1.f + __expf(-2.f * u));  // 1 + exp beyond 2^126: 0 (the true value is below 2^-119)
}

template <class T, int VEC, bool kBias>
__device__ __forceinline__ Vec<T, VEC> activated(const T* __restrict__ x, const T* __restrict__ bias, int64_t offset,
                                                  int64_t col) {
  const Vec<T, VEC> v = load_vec<T, VEC>(x + offset);
  Vec<T, VEC> b;
  if constexpr (kBias) b = load_vec<T, VEC>(bias + col);
  Vec<T, VEC> out;
#pragma unroll
  for (int k = 0; k < VEC; ++k) out.v[k] = from_float<T>(gelu_tanh(to_float(v.v[k]) + (kBias ? to_float(b.v[k]) : 0.f)));
  return out;
}

template <class T, int VEC, bool kBias>
__global__ void __launch_bounds__(kThreads)
    gelu_tanh_kernel(const T* __restrict__ x, const T* __restrict__ bias, T* __restrict__ y, int64_t vectors,
                     FastDiv vectors_per_row) {
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int64_t v = int64_t(blockIdx.x) * kThreads + threadIdx.x; v < vectors; v += stride) {
    // rows * D / VEC < 2^31 is checked on the host, so the vector index fits the 32-bit division.
    const int64_t row = vectors_per_row.div(uint32_t(v));
    const int64_t col = (v - row * vectors_per_row.divisor) * VEC;
    store_vec(y + v * VEC, activated<T, VEC, kBias>(x, bias, v * VEC, col), false);
  }
}

template <class T, int VEC, bool kBias>
__global__ void __launch_bounds__(kRowMaxThreads)
    gelu_tanh_row_block_quantized(const T* __restrict__ x, const T* __restrict__ bias, uint8_t* __restrict__ q,
                                  float* __restrict__ scale, int64_t d, QuantFormat format) {
  __shared__ float wave_amax[kRowMaxThreads / 32];  // a wave is 32 or 64 lanes
  const int64_t row = blockIdx.x;
  const int64_t vectors = d / VEC;
  Vec<T, VEC> y[kRowVectors];
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < kRowVectors; ++i) {
    const int64_t j = threadIdx.x + int64_t(i) * blockDim.x;
    if (j < vectors) {
      y[i] = activated<T, VEC, kBias>(x, bias, row * d + j * VEC, j * VEC);
#pragma unroll
      for (int k = 0; k < VEC; ++k) amax = absmax_nan(amax, to_float(y[i].v[k]));  // of y as stored: quantize_rows(y)
    }
  }
  amax = wave_absmax(amax);
  if (lane_id() == 0) wave_amax[wave_id()] = amax;
  __syncthreads();
  amax = 0.f;
  for (int w = 0; w < int(blockDim.x) / RSD_WAVE; ++w) amax = absmax_nan(amax, wave_amax[w]);
  const float inv = scale_from_amax(amax, format, scale + row, threadIdx.x == 0);
#pragma unroll
  for (int i = 0; i < kRowVectors; ++i) {
    const int64_t j = threadIdx.x + int64_t(i) * blockDim.x;
    if (j < vectors) store_vec(q + row * d + j * VEC, encode_vec(y[i], inv, format), false);
  }
}

#if !RSD_RTC
template <class T, bool kBias>
void launch(const GeluTanhArgs& a, int vec, hipStream_t stream) {
  const T* x = static_cast<const T*>(a.x);
  const T* bias = static_cast<const T*>(a.bias);
  if (a.q) {
    if constexpr (sizeof(T) == 2) {
      const int threads = gelu_tanh_row_block_threads(a.d, kQuantizeVec, device_attribute(a.device, Attr::wave_size, 32));
      gelu_tanh_row_block_quantized<T, kQuantizeVec, kBias><<<unsigned(a.rows), threads, 0, stream>>>(
          x, bias, static_cast<uint8_t*>(a.q), a.scale, a.d, a.format);
    }
    return;
  }
  T* y = static_cast<T*>(a.y);
  const int64_t vectors = a.rows * a.d / vec;
  const unsigned blocks = grid_stride_blocks(a.device, vectors, kThreads);
  const FastDiv per_row(uint32_t(a.d / vec));
  switch (vec) {
    case 8:
      if constexpr (sizeof(T) == 2) gelu_tanh_kernel<T, 8, kBias><<<blocks, kThreads, 0, stream>>>(x, bias, y, vectors, per_row);
      break;
    case 4: gelu_tanh_kernel<T, 4, kBias><<<blocks, kThreads, 0, stream>>>(x, bias, y, vectors, per_row); break;
    case 2: gelu_tanh_kernel<T, 2, kBias><<<blocks, kThreads, 0, stream>>>(x, bias, y, vectors, per_row); break;
    default: gelu_tanh_kernel<T, 1, kBias><<<blocks, kThreads, 0, stream>>>(x, bias, y, vectors, per_row); break;
  }
}

template <class T>
void launch(const GeluTanhArgs& a, int vec, hipStream_t stream) {
  if (a.bias)
    launch<T, true>(a, vec, stream);
  else
    launch<T, false>(a, vec, stream);
}

int pick_vec(const GeluTanhArgs& a) { return widest_vec(a.dtype, a.d, {a.x, a.bias, a.y}); }
#endif  // !RSD_RTC
}  // namespace

#if !RSD_RTC
int gelu_tanh_row_block_threads(int64_t d, int vec, int wave) {
  const int64_t threads = ceil_div(ceil_div(d / vec, int64_t(kRowVectors)), int64_t(wave)) * wave;
  return threads <= kRowMaxThreads ? int(threads) : 0;
}

std::string gelu_tanh_check(const GeluTanhArgs& a) {
  if (a.rows <= 0 || a.d <= 0) return "empty tensor";
  if ((a.q == nullptr) != (a.scale == nullptr)) return "q and scale come together";
  if ((a.q == nullptr) == (a.y == nullptr)) return "one output: y, or q and scale";
  for (const void* ptr : {a.x, a.bias, static_cast<const void*>(a.y)})
    if (!aligned(ptr, elem_bytes(a.dtype))) return "misaligned data pointer";
  if (a.rows * a.d >= (int64_t(1) << 31)) return "2^31 or more elements";
  if (a.q) {
    if (a.format != QuantFormat::e4m3fn && a.format != QuantFormat::e4m3fnuz && a.format != QuantFormat::int8)
      return "unknown format code " + std::to_string(int(a.format));
    if (a.bound != 0.f) return "quantized output takes a scale per row only (bound 0)";
    if (elem_bytes(a.dtype) != 2 || pick_vec(a) != kQuantizeVec || !aligned(a.q, kQuantizeVec) || !aligned(a.scale, 4))
      return "quantized output needs fp16/bf16 rows of a multiple of 8 features, 16-byte aligned";
    if (!gelu_tanh_row_block_threads(a.d, kQuantizeVec, device_attribute(a.device, Attr::wave_size, 32)))
      return "quantized output: rows of " + std::to_string(a.d) + " features are longer than one block holds";
  }
  return std::string();
}

std::string gelu_tanh_forward(const GeluTanhArgs& a) {
  std::string why = gelu_tanh_check(a);
  if (!why.empty()) return why;
  DeviceGuard guard(a.device);
  if (!guard.error().empty()) return guard.error();
  hipStream_t stream = static_cast<hipStream_t>(a.stream);
  const int vec = pick_vec(a);
  switch (a.dtype) {
    case DType::f32: launch<float>(a, vec, stream); break;
    case DType::f16: launch<__half>(a, vec, stream); break;
    case DType::bf16: launch<bf16>(a, vec, stream); break;
  }
  const hipError_t err = hipGetLastError();
  if (err != hipSuccess) return std::string("gelu_tanh launch failed: ") + hipGetErrorString(err);
  return std::string();
}

#endif  // !RSD_RTC

}  // namespace rsd
