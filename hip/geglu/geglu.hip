// GEGLU epilogue of the transformer feed-forward (diffusers' GEGLU after its projection):
//
//   y[m, j] = x[m, j] * gelu(x[m, D + j]),   x: (M, 2D) row-major, bias already added by the GEMM
//                                            y: (M, D),  gelu exact (erf), as torch.nn.functional.gelu
//
// PyTorch runs chunk -> gelu -> mul as two kernels over strided halves (the non-vectorised
// elementwise kernels of the profile in bench/notes/sd15.md) and writes the gelu in between; here
// each thread reads one vector of each half and writes one vector of y: 2 reads + 1 write per output
// element, the least there is. Math in fp32, one rounding at the end (torch rounds twice).
//
// With q and scale (optimize(precision="fp8"/"int8")), the row quantized as rocm_sd::quantize_rows would quantize y
// is written too: the output projection's 8-bit input without a pass over y. One block per row, sized to the row
// (kRowVectors vectors of y a thread, rounded up to whole waves), keeps the row's y in registers, reduces max |y|
// across its waves and encodes from the registers: x is read once, y and q written once. Few vectors a thread keep
// the registers, and so the blocks resident per compute unit, near the plain kernel's: a fixed 128-thread block holding
// up to 8 vectors a thread needed 115 registers on sm_90 and 163 VGPRs on gfx942, and ran no faster than the wave per
// row. Rows longer than kRowMaxThreads * kRowVectors vectors (beyond SD's: over 16384 fp16 features) take one wave
// per row, which reads its own writes of y back.
//
// Without y (y == nullptr, q given): only the quantized row is written, for an output projection that takes nothing
// else (rocm_sd::geglu_quantized): 2 reads and 1 one-byte write per output element, less than the plain kernel. The
// row block only: the wave-per-row kernel needs y to read back.
//
// With a bound (rocm_sd/quantize/api.h: one scale for the tensor) no row needs its maximum before encoding, so the
// quantized output is the plain kernel's elementwise grid with an encode: no row blocks, no reduction, and 16-element
// vectors where they fit.
//
// Where only the quantized rows are written, the GELU's erf is Abramowitz & Stegun 7.1.26 (one exponential, one
// reciprocal, five FMAs; gelu within 2.2e-7 absolute, 1.3e-5 relative where |gelu| > 0.01) instead of erff (two
// polynomials, selects and a branch): the kernels were instruction-bound on erff, and an 8-bit code's step is 2^-4
// relative, so erff's accuracy is wasted there. y, wherever it is written, keeps erff.
#include "rocm_sd/common.h"
#include "rocm_sd/compat.h"
#include "rocm_sd/quantize/encode.h"
#if !RSD_RTC  // host side; runtime compilation (rocm_sd/jit/) takes the kernels only (rocm_sd/rtc.h)
#include <algorithm>
#include <cstdint>
#include <string>

#include "rocm_sd/geglu/api.h"
#include "rocm_sd/launch.h"
#endif

namespace rsd {
namespace {

constexpr int kThreads = 256;
constexpr int kRowMaxThreads = 1024;  // the largest row block
constexpr int kRowVectors = 2;        // vectors of y a thread of a row block keeps in registers

__device__ __forceinline__ float gelu_erf(float g) { return 0.5f * g * (1.f + erff(g * 0.70710678118654752f)); }

// gelu(g) = g Phi(g) with Phi from erfc(|g| / sqrt 2) = t (a1 + t (a2 + ... a5 t)) exp(-g^2 / 2), t = 1 / (1 + p |g| /
// sqrt 2): no 1 + erf cancellation in the negative tail, where its relative error grows slowly (0.05% at g = -4, 0.4%
// at -6, 2% at -10), always far inside an 8-bit step of values that small. NaN stays NaN.
__device__ __forceinline__ float gelu_for_8bit(float g) {
  const float z = fabsf(g) * 0.70710678118654752f;
  const float t = __fdividef(1.f, fmaf(0.3275911f, z, 1.f));
  const float poly = t * fmaf(t, fmaf(t, fmaf(t, fmaf(t, 1.061405429f, -1.453152027f), 1.421413741f), -0.284496736f),
                              0.254829592f);
  const float half_erfc = 0.5f * poly * __expf(-z * z);
  return g * (g < 0.f ? half_erfc : 1.f - half_erfc);
}

// The GELU of a kernel that writes y (kRowsOnly false: erff, as torch) or only 8-bit rows.
template <bool kRowsOnly>
__device__ __forceinline__ float gelu(float g) {
  if constexpr (kRowsOnly) return gelu_for_8bit(g);
  else return gelu_erf(g);
}

// The v-th vector of y in the elementwise kernels: its row, its first column, and its values.
template <class T, int VEC>
struct GegluVector {
  int64_t row, col;
  Vec<T, VEC> y;
};

template <class T, int VEC, bool kRowsOnly = false>
__device__ __forceinline__ GegluVector<T, VEC> geglu_vector(const T* __restrict__ x, int64_t v, FastDiv vectors_per_row,
                                                            int64_t d) {
  GegluVector<T, VEC> out;
  // rows * D / VEC < 2^31 is checked on the host, so the row fits the 32-bit division.
  out.row = vectors_per_row.div(uint32_t(v));
  out.col = (v - out.row * vectors_per_row.divisor) * VEC;
  const T* in = x + out.row * 2 * d + out.col;
  const Vec<T, VEC> a = load_vec<T, VEC>(in);
  const Vec<T, VEC> g = load_vec<T, VEC>(in + d);
#pragma unroll
  for (int k = 0; k < VEC; ++k) out.y.v[k] = from_float<T>(to_float(a.v[k]) * gelu<kRowsOnly>(to_float(g.v[k])));
  return out;
}

template <class T, int VEC>
__global__ void __launch_bounds__(kThreads)
    geglu_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t vectors, FastDiv vectors_per_row, int64_t d) {
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int64_t v = int64_t(blockIdx.x) * kThreads + threadIdx.x; v < vectors; v += stride) {
    const GegluVector<T, VEC> out = geglu_vector<T, VEC>(x, v, vectors_per_row, d);
    store_vec(y + out.row * d + out.col, out.y, false);
  }
}

// The plain kernel writing q (and y where given) with the tensor's one scale; the first vector of a row writes the
// row's scale. kRowsOnly: y is nullptr.
template <class T, int VEC, bool kRowsOnly>
__global__ void __launch_bounds__(kThreads)
    geglu_bounded_quantized(const T* __restrict__ x, T* __restrict__ y, uint8_t* __restrict__ q,
                            float* __restrict__ scale, int64_t vectors, FastDiv vectors_per_row, int64_t d,
                            QuantFormat format, float bound) {
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  const float inv = scale_from_amax(bound, format, scale, false);  // the multiplier only: rows write their scale below
  for (int64_t v = int64_t(blockIdx.x) * kThreads + threadIdx.x; v < vectors; v += stride) {
    const GegluVector<T, VEC> out = geglu_vector<T, VEC, kRowsOnly>(x, v, vectors_per_row, d);
    if constexpr (!kRowsOnly) store_vec(y + out.row * d + out.col, out.y, false);
    store_vec(q + out.row * d + out.col, encode_vec(out.y, inv, format), false);
    if (out.col == 0) scale_from_amax(bound, format, scale + out.row, true);
  }
}

template <class T, int VEC>
__global__ void __launch_bounds__(kThreads)
    geglu_rows_quantized(const T* __restrict__ x, T* __restrict__ y, uint8_t* __restrict__ q, float* __restrict__ scale,
                         int64_t rows, int64_t d, QuantFormat format) {
  const int64_t row = int64_t(blockIdx.x) * (kThreads / RSD_WAVE) + wave_id();
  if (row >= rows) return;  // whole waves leave together
  const int64_t vectors = d / VEC;
  const T* in = x + row * 2 * d;
  T* yr = y + row * d;
  float amax = 0.f;
  for (int64_t j = lane_id(); j < vectors; j += RSD_WAVE) {
    const Vec<T, VEC> a = load_vec<T, VEC>(in + j * VEC);
    const Vec<T, VEC> g = load_vec<T, VEC>(in + d + j * VEC);
    Vec<T, VEC> out;
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      out.v[k] = from_float<T>(to_float(a.v[k]) * gelu_erf(to_float(g.v[k])));
      amax = absmax_nan(amax, to_float(out.v[k]));  // of y as stored: quantize_rows(y)
    }
    store_vec(yr + j * VEC, out, false);
  }
  const float inv = row_scale(amax, format, scale + row);
  uint8_t* qr = q + row * d;
  for (int64_t j = lane_id(); j < vectors; j += RSD_WAVE)  // the same elements this lane wrote
    store_vec(qr + j * VEC, encode_vec(load_vec<T, VEC>(yr + j * VEC), inv, format), false);
}

template <class T, int VEC, bool kRowsOnly>
__global__ void __launch_bounds__(kRowMaxThreads)
    geglu_row_block_quantized(const T* __restrict__ x, T* __restrict__ y, uint8_t* __restrict__ q,
                              float* __restrict__ scale, int64_t d, QuantFormat format) {
  __shared__ float wave_amax[kRowMaxThreads / 32];  // a wave is 32 or 64 lanes
  const int64_t row = blockIdx.x;
  const int64_t vectors = d / VEC;
  const T* in = x + row * 2 * d;
  Vec<T, VEC> a[kRowVectors], g[kRowVectors];
#pragma unroll
  for (int i = 0; i < kRowVectors; ++i) {  // every load first: the thread's loads in flight together
    const int64_t j = threadIdx.x + int64_t(i) * blockDim.x;
    if (j < vectors) {
      a[i] = load_vec<T, VEC>(in + j * VEC);
      g[i] = load_vec<T, VEC>(in + d + j * VEC);
    }
  }
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < kRowVectors; ++i) {
    const int64_t j = threadIdx.x + int64_t(i) * blockDim.x;
    if (j < vectors) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        a[i].v[k] = from_float<T>(to_float(a[i].v[k]) * gelu<kRowsOnly>(to_float(g[i].v[k])));  // y, kept in a
        amax = absmax_nan(amax, to_float(a[i].v[k]));  // of y as stored: quantize_rows(y)
      }
      if constexpr (!kRowsOnly) store_vec(y + row * d + j * VEC, a[i], false);
    }
  }
  amax = wave_absmax(amax);
  if (lane_id() == 0) wave_amax[wave_id()] = amax;
  __syncthreads();
  amax = 0.f;
  for (int w = 0; w < int(blockDim.x) / RSD_WAVE; ++w) amax = absmax_nan(amax, wave_amax[w]);
  const float inv = scale_from_amax(amax, format, scale + row, threadIdx.x == 0);
  uint8_t* qr = q + row * d;
#pragma unroll
  for (int i = 0; i < kRowVectors; ++i) {
    const int64_t j = threadIdx.x + int64_t(i) * blockDim.x;
    if (j < vectors) store_vec(qr + j * VEC, encode_vec(a[i], inv, format), false);
  }
}

#if !RSD_RTC
// The elementwise kernels' grid for vectors of vec: a grid-stride loop over rows * d / vec vectors.
struct ElementwiseGrid {
  int64_t vectors;
  unsigned blocks;
  FastDiv per_row;
  ElementwiseGrid(const GegluArgs& a, int vec)
      : vectors(a.rows * a.d / vec), blocks(grid_stride_blocks(a.device, vectors, kThreads)),
        per_row(uint32_t(a.d / vec)) {}
};

// The bounded kernel's vector: 16 fp16 / bf16 elements (two 16-byte loads of each half) where d and the pointers
// allow, so that each thread stores 16 bytes of q, not 8; the 8-byte stores left it further below a copy's bandwidth
// (bench/results/notes/2026-11-25-fp8-fusions-h200.md).
int bounded_vec(const GegluArgs& a, int vec) {
  return vec == 8 && a.d % 16 == 0 && aligned(a.x, 32) && aligned(a.y, 32) && aligned(a.q, 16) ? 16 : vec;
}

// The kernels that write q with the tensor's one scale, y only where given.
template <class T, bool kRowsOnly>
void launch_bounded(const GegluArgs& a, int vec, hipStream_t stream) {
  const T* x = static_cast<const T*>(a.x);
  T* y = static_cast<T*>(a.y);
  uint8_t* q = static_cast<uint8_t*>(a.q);
  vec = bounded_vec(a, vec);
  const ElementwiseGrid g(a, vec);
  switch (vec) {
    case 16:
      if constexpr (sizeof(T) == 2) geglu_bounded_quantized<T, 16, kRowsOnly><<<g.blocks, kThreads, 0, stream>>>(x, y, q, a.scale, g.vectors, g.per_row, a.d, a.format, a.bound);
      break;
    case 8: geglu_bounded_quantized<T, 8, kRowsOnly><<<g.blocks, kThreads, 0, stream>>>(x, y, q, a.scale, g.vectors, g.per_row, a.d, a.format, a.bound); break;
    case 4: geglu_bounded_quantized<T, 4, kRowsOnly><<<g.blocks, kThreads, 0, stream>>>(x, y, q, a.scale, g.vectors, g.per_row, a.d, a.format, a.bound); break;
    case 2: geglu_bounded_quantized<T, 2, kRowsOnly><<<g.blocks, kThreads, 0, stream>>>(x, y, q, a.scale, g.vectors, g.per_row, a.d, a.format, a.bound); break;
    default: geglu_bounded_quantized<T, 1, kRowsOnly><<<g.blocks, kThreads, 0, stream>>>(x, y, q, a.scale, g.vectors, g.per_row, a.d, a.format, a.bound); break;
  }
}

// The row blocks (one block a row, its maximum reduced across the block), y only where given.
template <class T, bool kRowsOnly>
void launch_row_block(const GegluArgs& a, int vec, int threads, hipStream_t stream) {
  const T* x = static_cast<const T*>(a.x);
  T* y = static_cast<T*>(a.y);
  uint8_t* q = static_cast<uint8_t*>(a.q);
  const unsigned blocks = unsigned(a.rows);  // rows * d < 2^31
  switch (vec) {
    case 8: geglu_row_block_quantized<T, 8, kRowsOnly><<<blocks, threads, 0, stream>>>(x, y, q, a.scale, a.d, a.format); break;
    case 4: geglu_row_block_quantized<T, 4, kRowsOnly><<<blocks, threads, 0, stream>>>(x, y, q, a.scale, a.d, a.format); break;
    case 2: geglu_row_block_quantized<T, 2, kRowsOnly><<<blocks, threads, 0, stream>>>(x, y, q, a.scale, a.d, a.format); break;
    default: geglu_row_block_quantized<T, 1, kRowsOnly><<<blocks, threads, 0, stream>>>(x, y, q, a.scale, a.d, a.format); break;
  }
}

template <class T>
void launch_quantized(const GegluArgs& a, int vec, hipStream_t stream) {
  const T* x = static_cast<const T*>(a.x);
  T* y = static_cast<T*>(a.y);
  uint8_t* q = static_cast<uint8_t*>(a.q);
  const bool rows_only = y == nullptr;
  if (a.bound > 0.f) {
    rows_only ? launch_bounded<T, true>(a, vec, stream) : launch_bounded<T, false>(a, vec, stream);
    return;
  }
  const int wave = device_attribute(a.device, Attr::wave_size, 32);
  if (const int threads = geglu_row_block_threads(a.d, vec, wave)) {
    if (rows_only)
      launch_row_block<T, true>(a, vec, threads, stream);
    else
      launch_row_block<T, false>(a, vec, threads, stream);
    return;
  }
  const unsigned blocks = unsigned(ceil_div(a.rows, kThreads / wave));
  switch (vec) {
    case 8: geglu_rows_quantized<T, 8><<<blocks, kThreads, 0, stream>>>(x, y, q, a.scale, a.rows, a.d, a.format); break;
    case 4: geglu_rows_quantized<T, 4><<<blocks, kThreads, 0, stream>>>(x, y, q, a.scale, a.rows, a.d, a.format); break;
    case 2: geglu_rows_quantized<T, 2><<<blocks, kThreads, 0, stream>>>(x, y, q, a.scale, a.rows, a.d, a.format); break;
    default: geglu_rows_quantized<T, 1><<<blocks, kThreads, 0, stream>>>(x, y, q, a.scale, a.rows, a.d, a.format); break;
  }
}

template <class T>
void launch(const GegluArgs& a, int vec, hipStream_t stream) {
  const T* x = static_cast<const T*>(a.x);
  T* y = static_cast<T*>(a.y);
  const ElementwiseGrid g(a, vec);
  switch (vec) {
    case 8:
      if constexpr (sizeof(T) == 2) geglu_kernel<T, 8><<<g.blocks, kThreads, 0, stream>>>(x, y, g.vectors, g.per_row, a.d);
      break;
    case 4: geglu_kernel<T, 4><<<g.blocks, kThreads, 0, stream>>>(x, y, g.vectors, g.per_row, a.d); break;
    case 2: geglu_kernel<T, 2><<<g.blocks, kThreads, 0, stream>>>(x, y, g.vectors, g.per_row, a.d); break;
    default: geglu_kernel<T, 1><<<g.blocks, kThreads, 0, stream>>>(x, y, g.vectors, g.per_row, a.d); break;
  }
}

#endif  // !RSD_RTC
}  // namespace

#if !RSD_RTC
int geglu_row_block_threads(int64_t d, int vec, int wave) {
  const int64_t threads = ceil_div(ceil_div(d / vec, int64_t(kRowVectors)), int64_t(wave)) * wave;
  return threads <= kRowMaxThreads ? int(threads) : 0;
}

namespace {
// The vector width of the quantized branch: the widest that d and the pointers' alignment allow.
int quantized_vec(const GegluArgs& a) {
  int vec = widest_vec(a.dtype, a.d, {a.x, a.y});  // D a multiple of vec keeps both halves aligned
  while (vec > 1 && !aligned(a.q, vec)) vec /= 2;  // q's vectors are vec bytes
  return vec;
}
}  // namespace

std::string geglu_check(const GegluArgs& a) {
  if (a.rows <= 0 || a.d <= 0) return "empty tensor";
  if (a.y == nullptr && a.q == nullptr) return "no output: y, or q and scale, are needed";
  if (!aligned(a.x, elem_bytes(a.dtype)) || !aligned(a.y, elem_bytes(a.dtype))) return "misaligned data pointer";
  if (a.rows * a.d >= (int64_t(1) << 31)) return "2^31 or more output elements";
  if ((a.q == nullptr) != (a.scale == nullptr)) return "q and scale come together";
  if (a.q) {
    if (a.format != QuantFormat::e4m3fn && a.format != QuantFormat::e4m3fnuz && a.format != QuantFormat::int8)
      return "unknown format code " + std::to_string(int(a.format));
    if (elem_bytes(a.dtype) != 2) return "quantized output needs fp16 or bf16 activations";
    if (!aligned(a.scale, 4)) return "misaligned scale pointer";
    if (!bound_ok(a.bound, a.format)) return bound_problem(a.bound);
    if (a.y == nullptr && a.bound == 0.f && !geglu_row_block_threads(a.d, quantized_vec(a), device_attribute(a.device, Attr::wave_size, 32)))
      return "rows of " + std::to_string(a.d) + " features are quantized by a wave that reads y back: y is needed";
  }
  return std::string();
}

std::string geglu_forward(const GegluArgs& a) {
  std::string why = geglu_check(a);
  if (!why.empty()) return why;
  DeviceGuard guard(a.device);
  if (!guard.error().empty()) return guard.error();
  hipStream_t stream = static_cast<hipStream_t>(a.stream);
  if (a.q) {
    const int vec = quantized_vec(a);
    if (a.dtype == DType::f16)
      launch_quantized<__half>(a, vec, stream);
    else
      launch_quantized<bf16>(a, vec, stream);
  } else {
    const int vec = widest_vec(a.dtype, a.d, {a.x, a.y});  // D a multiple of vec keeps both halves aligned
    switch (a.dtype) {
      case DType::f32: launch<float>(a, vec, stream); break;
      case DType::f16: launch<__half>(a, vec, stream); break;
      case DType::bf16: launch<bf16>(a, vec, stream); break;
    }
  }
  const hipError_t err = hipGetLastError();
  if (err != hipSuccess) return std::string("geglu launch failed: ") + hipGetErrorString(err);
  return std::string();
}

#endif  // !RSD_RTC

}  // namespace rsd
