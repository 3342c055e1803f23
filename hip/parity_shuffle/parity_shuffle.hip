// The pixel shuffle of a folded upsampling convolution (rocm_sd/patch/upsample.py), with its bias:
//
//   out[n, 2i + a, 2j + b, c] = parities[n, i + a, j + b, (2a + b) C + c] + bias[c]      (NHWC, both)
//
// parities is the (N, H + 1, W + 1, 4C) output of the folded 2x2 convolution (block 2a + b holds output
// parity (a, b)), out the (N, 2H, 2W, C) upsampled image. One pass: every output vector is written once,
// consecutive threads write consecutive 16-byte vectors of a pixel row, and each reads the same channels
// of one parity pixel (C contiguous elements): both sides coalesced. Replaces four strided copies and the
// convolution's separate bias pass.
#include "rocm_sd/common.h"
#include "rocm_sd/compat.h"
#if !RSD_RTC  // host side; runtime compilation (rocm_sd/jit/) takes the kernels only (rocm_sd/rtc.h)
#include <cstdint>
#include <string>

#include "rocm_sd/launch.h"
#include "rocm_sd/parity_shuffle/api.h"
#endif

namespace rsd {
namespace {

constexpr int kThreads = 256;

template <class T, int VEC>
__global__ void __launch_bounds__(kThreads)
    parity_shuffle_kernel(const T* __restrict__ parities, const T* __restrict__ bias, T* __restrict__ out,
                          int64_t vectors, FastDiv vectors_per_pixel, FastDiv out_width, FastDiv out_height, int h,
                          int w, int c) {
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int64_t v = int64_t(blockIdx.x) * kThreads + threadIdx.x; v < vectors; v += stride) {
    const uint32_t vi = uint32_t(v);  // vectors < 2^31, checked on the host
    const uint32_t pixel = vectors_per_pixel.div(vi);
    const int c0 = int(vi - pixel * vectors_per_pixel.divisor) * VEC;
    const uint32_t row = out_width.div(pixel);           // n * 2H + y
    const int x = int(pixel - row * out_width.divisor);
    const uint32_t n = out_height.div(row);
    const int y = int(row - n * out_height.divisor);
    const int a = y & 1, b = x & 1;
    const int64_t src_pixel = (int64_t(n) * (h + 1) + (y >> 1) + a) * (w + 1) + (x >> 1) + b;
    const Vec<T, VEC> in = load_vec<T, VEC>(parities + src_pixel * 4 * c + (2 * a + b) * c + c0);
    Vec<T, VEC> result;
#pragma unroll
    for (int k = 0; k < VEC; ++k)
      result.v[k] = from_float<T>(to_float(in.v[k]) + (bias ? to_float(bias[c0 + k]) : 0.f));
    store_vec(out + int64_t(pixel) * c + c0, result, false);
  }
}

#if !RSD_RTC
template <class T, int VEC>
void launch_vec(const ParityShuffleArgs& a, hipStream_t stream) {
  const int64_t vectors = a.n * 4 * a.h * a.w * a.c / VEC;
  const unsigned blocks = grid_stride_blocks(a.device, vectors, kThreads);
  parity_shuffle_kernel<T, VEC><<<blocks, kThreads, 0, stream>>>(
      static_cast<const T*>(a.parities), static_cast<const T*>(a.bias), static_cast<T*>(a.out), vectors,
      FastDiv(uint32_t(a.c / VEC)), FastDiv(uint32_t(2 * a.w)), FastDiv(uint32_t(2 * a.h)), int(a.h), int(a.w),
      int(a.c));
}

template <class T>
void launch(const ParityShuffleArgs& a, int vec, hipStream_t stream) {
  switch (vec) {
    case 8: if constexpr (sizeof(T) == 2) launch_vec<T, 8>(a, stream); break;
    case 4: launch_vec<T, 4>(a, stream); break;
    case 2: launch_vec<T, 2>(a, stream); break;
    default: launch_vec<T, 1>(a, stream); break;
  }
}

#endif  // !RSD_RTC
}  // namespace

#if !RSD_RTC
std::string parity_shuffle_check(const ParityShuffleArgs& a) {
  if (a.n <= 0 || a.h <= 0 || a.w <= 0 || a.c <= 0) return "empty tensor";
  const int eb = elem_bytes(a.dtype);
  if (!aligned(a.parities, eb) || !aligned(a.out, eb) || !aligned(a.bias, eb)) return "misaligned data pointer";
  if (a.n * 4 * (a.h + 1) * (a.w + 1) * a.c >= (int64_t(1) << 31) || a.n * 4 * a.h * a.w * a.c >= (int64_t(1) << 31))
    return "2^31 or more elements";
  return std::string();
}

std::string parity_shuffle_forward(const ParityShuffleArgs& a) {
  std::string why = parity_shuffle_check(a);
  if (!why.empty()) return why;
  DeviceGuard guard(a.device);
  if (!guard.error().empty()) return guard.error();
  // A vector is VEC channels of one pixel on both sides: vec divides C (every parity block and pixel then
  // starts on a vector boundary).
  const int vec = widest_vec(a.dtype, a.c, {a.parities, a.out});
  hipStream_t stream = static_cast<hipStream_t>(a.stream);
  switch (a.dtype) {
    case DType::f32: launch<float>(a, vec, stream); break;
    case DType::f16: launch<__half>(a, vec, stream); break;
    case DType::bf16: launch<bf16>(a, vec, stream); break;
  }
  const hipError_t err = hipGetLastError();
  if (err != hipSuccess) return std::string("parity_shuffle launch failed: ") + hipGetErrorString(err);
  return std::string();
}

#endif  // !RSD_RTC

}  // namespace rsd
