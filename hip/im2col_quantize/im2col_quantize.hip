// im2col_quantize (rocm_sd/im2col_quantize/api.h): a convolution's input patches, quantized with one scale, as the
// A operand of an FP8 GEMM. torch has no FP8 convolution; an FP8 GEMM over these rows runs the convolution at the
// FP8 rate of hipBLASLt / cuBLASLt, at the price of writing the patches (kh * kw bytes per input element).
//
// Elementwise over the output: each thread encodes one vector of one tap of one pixel. A tap is c contiguous channels
// of x (channels_last), so reads and writes are both contiguous runs; the kh * kw reads of each input pixel mostly
// hit L2. Four divisions by launch constants (FastDiv) place a vector: its row (pixel), its tap, the pixel's wo, ho.
#include "rocm_sd/common.h"
#include "rocm_sd/compat.h"
#include "rocm_sd/quantize/encode.h"
#if !RSD_RTC  // host side; runtime compilation (rocm_sd/jit/) takes the kernels only (rocm_sd/rtc.h)
#include <cmath>
#include <cstdint>
#include <string>

#include "rocm_sd/im2col_quantize/api.h"
#include "rocm_sd/launch.h"
#endif

namespace rsd {
namespace {

constexpr int kThreads = 256;

struct Im2colShape {
  int h, w, c, kw, stride_h, stride_w, pad_h, pad_w;
  FastDiv vectors_per_row, vectors_per_tap, wo, ho;  // (kh * kw * c) / VEC, c / VEC, output width, output height
};

template <class T, int VEC>
__global__ void __launch_bounds__(kThreads)
    im2col_quantize_kernel(const T* __restrict__ x, uint8_t* __restrict__ q, float* __restrict__ scale,
                           int64_t vectors, Im2colShape s, QuantFormat format, float bound) {
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  const float inv = scale_from_amax(bound, format, scale, blockIdx.x == 0 && threadIdx.x == 0);
  // vectors < 2^31 is checked on the host, so every numerator fits the 32-bit divisions.
  for (int64_t v = int64_t(blockIdx.x) * kThreads + threadIdx.x; v < vectors; v += stride) {
    const uint32_t pixel = s.vectors_per_row.div(uint32_t(v));
    const uint32_t in_row = uint32_t(v) - pixel * s.vectors_per_row.divisor;
    const uint32_t tap = s.vectors_per_tap.div(in_row);
    const int ch = int(in_row - tap * s.vectors_per_tap.divisor) * VEC;
    const uint32_t wide = s.wo.div(pixel);  // n * ho + ho_index
    const int wo = int(pixel - wide * s.wo.divisor);
    const uint32_t image = s.ho.div(wide);
    const int ho = int(wide - image * s.ho.divisor);
    const int i = int(tap) / s.kw, j = int(tap) - i * s.kw;  // the window is a handful of taps
    const int hi = ho * s.stride_h - s.pad_h + i, wi = wo * s.stride_w - s.pad_w + j;
    Vec<T, VEC> in;
    if (hi >= 0 && hi < s.h && wi >= 0 && wi < s.w) {
      in = load_vec<T, VEC>(x + ((int64_t(image) * s.h + hi) * s.w + wi) * s.c + ch);
    } else {
#pragma unroll
      for (int e = 0; e < VEC; ++e) in.v[e] = from_float<T>(0.f);
    }
    store_vec(q + v * VEC, encode_vec(in, inv, format), false);
  }
}

#if !RSD_RTC
template <class T>
void launch(const Im2colQuantizeArgs& a, int vec, hipStream_t stream) {
  const int64_t ho = im2col_out_size(a.h, a.kh, a.stride_h, a.pad_h), wo = im2col_out_size(a.w, a.kw, a.stride_w, a.pad_w);
  const Im2colShape s{int(a.h), int(a.w), int(a.c), a.kw, a.stride_h, a.stride_w, a.pad_h, a.pad_w,
                      FastDiv(uint32_t(a.kh * a.kw * a.c / vec)), FastDiv(uint32_t(a.c / vec)), FastDiv(uint32_t(wo)),
                      FastDiv(uint32_t(ho))};
  const int64_t vectors = a.n * ho * wo * a.kh * a.kw * a.c / vec;
  const unsigned blocks = grid_stride_blocks(a.device, vectors, kThreads);
  const T* x = static_cast<const T*>(a.x);
  uint8_t* q = static_cast<uint8_t*>(a.q);
  switch (vec) {
    case 16:
      if constexpr (sizeof(T) == 2) im2col_quantize_kernel<T, 16><<<blocks, kThreads, 0, stream>>>(x, q, a.scale, vectors, s, a.format, a.bound);
      break;
    case 8:
      if constexpr (sizeof(T) == 2) im2col_quantize_kernel<T, 8><<<blocks, kThreads, 0, stream>>>(x, q, a.scale, vectors, s, a.format, a.bound);
      break;
    case 4: im2col_quantize_kernel<T, 4><<<blocks, kThreads, 0, stream>>>(x, q, a.scale, vectors, s, a.format, a.bound); break;
    case 2: im2col_quantize_kernel<T, 2><<<blocks, kThreads, 0, stream>>>(x, q, a.scale, vectors, s, a.format, a.bound); break;
    default: im2col_quantize_kernel<T, 1><<<blocks, kThreads, 0, stream>>>(x, q, a.scale, vectors, s, a.format, a.bound); break;
  }
}

// The widest vector of x's that divides c and keeps x and q aligned (q's vectors are VEC bytes); 16 fp16 / bf16
// elements (two 16-byte loads) where they fit, so that each thread stores 16 bytes of q, not 8: the patches are most
// of the kernel's traffic.
int pick_vec(const Im2colQuantizeArgs& a) {
  int vec = widest_vec(a.dtype, a.c, {a.x});
  if (vec == 8 && a.c % 16 == 0 && aligned(a.x, 32)) vec = 16;
  while (vec > 1 && !aligned(a.q, vec)) vec /= 2;
  return vec;
}
#endif  // !RSD_RTC
}  // namespace

#if !RSD_RTC
int64_t im2col_out_size(int64_t in, int kernel, int stride, int pad) {
  return stride > 0 ? (in + 2 * int64_t(pad) - kernel) / stride + 1 : 0;
}

std::string im2col_quantize_check(const Im2colQuantizeArgs& a) {
  if (a.n <= 0 || a.h <= 0 || a.w <= 0 || a.c <= 0) return "empty tensor";
  if (a.format != QuantFormat::e4m3fn && a.format != QuantFormat::e4m3fnuz)
    return "format code " + std::to_string(int(a.format)) + " is not an fp8 format (one scale per tensor needs one)";
  if (!(std::isfinite(a.bound) && a.bound > 0.f)) return "bound " + std::to_string(a.bound) + " is not finite and positive";
  if (a.kh <= 0 || a.kw <= 0 || a.kh * a.kw > 64) return "a kernel window of " + std::to_string(a.kh) + "x" +
                                                          std::to_string(a.kw) + " is not 1 to 64 taps";
  if (a.stride_h <= 0 || a.stride_w <= 0 || a.pad_h < 0 || a.pad_w < 0 || a.pad_h >= a.kh || a.pad_w >= a.kw)
    return "stride must be positive and padding smaller than the window";
  const int64_t ho = im2col_out_size(a.h, a.kh, a.stride_h, a.pad_h), wo = im2col_out_size(a.w, a.kw, a.stride_w, a.pad_w);
  if (ho <= 0 || wo <= 0) return "the window does not fit the input";
  if (!aligned(a.x, elem_bytes(a.dtype)) || !aligned(a.scale, 4)) return "misaligned data pointer";
  if (a.h >= (int64_t(1) << 20) || a.w >= (int64_t(1) << 20) || a.c >= (int64_t(1) << 24))
    return "input dimensions too large";
  if (a.n * ho * wo * a.kh * a.kw * a.c >= (int64_t(1) << 31)) return "too many elements (2^31 or more patches' values)";
  return std::string();
}

std::string im2col_quantize_forward(const Im2colQuantizeArgs& a) {
  std::string why = im2col_quantize_check(a);
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
  if (err != hipSuccess) return std::string("im2col_quantize launch failed: ") + hipGetErrorString(err);
  return std::string();
}
#endif  // !RSD_RTC

}  // namespace rsd
