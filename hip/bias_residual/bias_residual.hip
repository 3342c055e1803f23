// Bias + residual epilogue of a convolution, in one pass:
//
//   y = (x + residual + bias[c]) * scale        x, residual, y: same shape and layout, NCHW or NHWC
//
// ResnetBlock2D ends with conv2 (whose bias PyTorch adds in a separate broadcast kernel on the cuDNN
// path), then `(input + h) / output_scale_factor`: up to three passes over the activation, here one.
#include "rocm_sd/common.h"
#include "rocm_sd/compat.h"
#if !RSD_RTC  // host side; runtime compilation (rocm_sd/jit/) takes the kernels only (rocm_sd/rtc.h)
#include <algorithm>
#include <cstdint>
#include <string>

#include "rocm_sd/bias_residual/api.h"
#include "rocm_sd/launch.h"
#endif

namespace rsd {
namespace {

constexpr int kThreads = 256;

// NCHW: channel of element i = (i / hw) % C; NHWC: i % C, and VEC consecutive channels per vector.
template <class T, int VEC, bool NHWC>
__global__ void __launch_bounds__(kThreads)
    bias_residual_kernel(const T* __restrict__ x, const T* __restrict__ residual, const T* __restrict__ bias,
                         T* __restrict__ y, int64_t vectors, FastDiv hw, FastDiv c, float scale) {
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int64_t v = int64_t(blockIdx.x) * kThreads + threadIdx.x; v < vectors; v += stride) {
    const uint32_t i = uint32_t(v * VEC);  // numel < 2^31 is checked on the host
    const Vec<T, VEC> a = load_vec<T, VEC>(x + i);
    const Vec<T, VEC> r = load_vec<T, VEC>(residual + i);
    Vec<T, VEC> out;
    if constexpr (NHWC) {
      const uint32_t ch = i - c.div(i) * c.divisor;
#pragma unroll
      for (int k = 0; k < VEC; ++k)
        out.v[k] = from_float<T>((to_float(a.v[k]) + to_float(r.v[k]) + to_float(bias[ch + k])) * scale);
    } else {
      const uint32_t plane = hw.div(i);
      const float b = to_float(bias[plane - c.div(plane) * c.divisor]);
#pragma unroll
      for (int k = 0; k < VEC; ++k) out.v[k] = from_float<T>((to_float(a.v[k]) + to_float(r.v[k]) + b) * scale);
    }
    store_vec(y + i, out, false);
  }
}

#if !RSD_RTC
template <class T, int VEC>
void launch_vec(const BiasResidualArgs& a, unsigned blocks, int64_t vectors, hipStream_t stream) {
  const T* x = static_cast<const T*>(a.x);
  const T* r = static_cast<const T*>(a.residual);
  const T* b = static_cast<const T*>(a.bias);
  T* y = static_cast<T*>(a.y);
  const FastDiv hw(uint32_t(a.hw)), c(uint32_t(a.c));
  if (a.layout == Layout::nhwc)
    bias_residual_kernel<T, VEC, true><<<blocks, kThreads, 0, stream>>>(x, r, b, y, vectors, hw, c, a.scale);
  else
    bias_residual_kernel<T, VEC, false><<<blocks, kThreads, 0, stream>>>(x, r, b, y, vectors, hw, c, a.scale);
}

template <class T>
void launch(const BiasResidualArgs& a, int vec, unsigned blocks, int64_t vectors, hipStream_t stream) {
  switch (vec) {
    case 8: if constexpr (sizeof(T) == 2) launch_vec<T, 8>(a, blocks, vectors, stream); break;
    case 4: launch_vec<T, 4>(a, blocks, vectors, stream); break;
    case 2: launch_vec<T, 2>(a, blocks, vectors, stream); break;
    default: launch_vec<T, 1>(a, blocks, vectors, stream); break;
  }
}

#endif  // !RSD_RTC
}  // namespace

#if !RSD_RTC
std::string bias_residual_check(const BiasResidualArgs& a) {
  if (a.n <= 0 || a.c <= 0 || a.hw <= 0) return "empty tensor";
  const int eb = elem_bytes(a.dtype);
  if (!aligned(a.x, eb) || !aligned(a.residual, eb) || !aligned(a.y, eb) || !aligned(a.bias, eb))
    return "misaligned data pointer";
  if (a.n * a.c * a.hw >= (int64_t(1) << 31)) return "2^31 or more elements";
  return std::string();
}

std::string bias_residual_forward(const BiasResidualArgs& a) {
  std::string why = bias_residual_check(a);
  if (!why.empty()) return why;
  DeviceGuard guard(a.device);
  if (!guard.error().empty()) return guard.error();
  // A vector stays inside one channel (NCHW: vec divides hw) or starts at a multiple of vec channels
  // (NHWC: vec divides C); the bias is read element by element.
  const int vec = widest_vec(a.dtype, a.layout == Layout::nchw ? a.hw : a.c, {a.x, a.residual, a.y});
  const int64_t vectors = a.n * a.c * a.hw / vec;
  const unsigned blocks = grid_stride_blocks(a.device, vectors, kThreads);
  hipStream_t stream = static_cast<hipStream_t>(a.stream);
  switch (a.dtype) {
    case DType::f32: launch<float>(a, vec, blocks, vectors, stream); break;
    case DType::f16: launch<__half>(a, vec, blocks, vectors, stream); break;
    case DType::bf16: launch<bf16>(a, vec, blocks, vectors, stream); break;
  }
  const hipError_t err = hipGetLastError();
  if (err != hipSuccess) return std::string("bias_residual launch failed: ") + hipGetErrorString(err);
  return std::string();
}

#endif  // !RSD_RTC

}  // namespace rsd
