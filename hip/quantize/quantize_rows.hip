// Per-row symmetric quantization into 8-bit GEMM operands (rocm_sd/quantize/api.h), one wave per row:
//
//   pass 1: the wave reads its row and reduces max |x| (shuffles, no shared memory, no barrier)
//   pass 2: it reads the row again (now from L2: rows are at most a few KB) and writes one byte per element
//
// Rows of any length: unlike LayerNorm's (rocm_sd/layer_norm/), the row is not held in registers, so the
// feed-forward's 5120-wide GEGLU output takes the same kernel as a 320-wide projection input.
//
// x's rows may come in batches at a stride (rows_per_batch contiguous rows, then a gap): the image rows of a joint
// attention's output, x[:, :L] of (B, L + L_txt, C), are quantized where they lie, without the copy a reshape makes.
#include "rocm_sd/common.h"
#include "rocm_sd/compat.h"
#include "rocm_sd/quantize/api.h"
#include "rocm_sd/quantize/encode.h"
#if !RSD_RTC  // host side; runtime compilation (rocm_sd/jit/) takes the kernels only (rocm_sd/rtc.h)
#include <algorithm>
#include <cstdint>
#include <string>

#include "rocm_sd/launch.h"
#endif

namespace rsd {
namespace {

constexpr int kThreads = 256;

template <class T, int VEC>
__global__ void __launch_bounds__(kThreads)
    quantize_rows_kernel(const T* __restrict__ x, uint8_t* __restrict__ q, float* __restrict__ scale, int64_t rows,
                         int64_t k, QuantFormat format, int64_t rows_per_batch, int64_t batch_stride) {
  const int64_t row = int64_t(blockIdx.x) * (kThreads / RSD_WAVE) + wave_id();
  if (row >= rows) return;  // whole waves leave together
  const int64_t vectors = k / VEC;
  const int64_t batch = row / rows_per_batch;  // once a row: a wave's division, not an element's
  const T* xr = x + batch * batch_stride + (row - batch * rows_per_batch) * k;
  float amax = 0.f;
  for (int64_t j = lane_id(); j < vectors; j += RSD_WAVE) {
    const Vec<T, VEC> v = load_vec<T, VEC>(xr + j * VEC);
#pragma unroll
    for (int e = 0; e < VEC; ++e) amax = absmax_nan(amax, to_float(v.v[e]));
  }
  const float inv = row_scale(amax, format, scale + row);
  uint8_t* qr = q + row * k;
  for (int64_t j = lane_id(); j < vectors; j += RSD_WAVE)
    store_vec(qr + j * VEC, encode_vec(load_vec<T, VEC>(xr + j * VEC), inv, format), false);
}

#if !RSD_RTC
template <class T>
void launch(const QuantizeRowsArgs& a, int vec, hipStream_t stream) {
  const unsigned blocks = unsigned(ceil_div(a.rows, kThreads / device_attribute(a.device, Attr::wave_size, 32)));
  const T* x = static_cast<const T*>(a.x);
  uint8_t* q = static_cast<uint8_t*>(a.q);
  const int64_t per_batch = a.rows_per_batch > 0 ? a.rows_per_batch : a.rows;
  const int64_t stride = a.rows_per_batch > 0 ? a.batch_stride : a.rows * a.k;
  switch (vec) {
    case 8:
      if constexpr (sizeof(T) == 2) quantize_rows_kernel<T, 8><<<blocks, kThreads, 0, stream>>>(x, q, a.scale, a.rows, a.k, a.format, per_batch, stride);
      break;
    case 4: quantize_rows_kernel<T, 4><<<blocks, kThreads, 0, stream>>>(x, q, a.scale, a.rows, a.k, a.format, per_batch, stride); break;
    case 2: quantize_rows_kernel<T, 2><<<blocks, kThreads, 0, stream>>>(x, q, a.scale, a.rows, a.k, a.format, per_batch, stride); break;
    default: quantize_rows_kernel<T, 1><<<blocks, kThreads, 0, stream>>>(x, q, a.scale, a.rows, a.k, a.format, per_batch, stride); break;
  }
}

// Vector width: the widest of x's that divides k and keeps x and q aligned (q's vectors are VEC bytes).
int pick_vec(const QuantizeRowsArgs& a) {
  int vec = widest_vec(a.dtype, a.k, {a.x});
  while (vec > 1 && (!aligned(a.q, vec) || a.batch_stride % vec != 0)) vec /= 2;
  return vec;
}

#endif  // !RSD_RTC
}  // namespace

#if !RSD_RTC
std::string quantize_rows_check(const QuantizeRowsArgs& a) {
  if (a.rows <= 0 || a.k <= 0) return "empty tensor";
  if (a.format != QuantFormat::e4m3fn && a.format != QuantFormat::e4m3fnuz && a.format != QuantFormat::int8)
    return "unknown format code " + std::to_string(int(a.format));
  if (!aligned(a.x, elem_bytes(a.dtype)) || !aligned(a.scale, 4)) return "misaligned data pointer";
  if (a.rows >= (int64_t(1) << 31) / (kThreads / 32)) return "too many rows";
  if (a.rows_per_batch < 0 || (a.rows_per_batch > 0 && (a.rows % a.rows_per_batch != 0 ||
                                                         a.batch_stride < a.rows_per_batch * a.k)))
    return "batches of rows: rows_per_batch must divide rows, and batch_stride hold a batch's rows";
  return std::string();
}

std::string quantize_rows_forward(const QuantizeRowsArgs& a) {
  std::string why = quantize_rows_check(a);
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
  if (err != hipSuccess) return std::string("quantize_rows launch failed: ") + hipGetErrorString(err);
  return std::string();
}

#endif  // !RSD_RTC

}  // namespace rsd
