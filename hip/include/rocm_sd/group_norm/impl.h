// Internals shared by the GroupNorm(+SiLU) kernels: argument helpers, the per-element math, and the
// two launch paths that hip/group_norm/group_norm.hip chooses between.
//   resident (group_norm_resident.hip, NCHW; group_norm_resident_nhwc.hip, NHWC): one launch; every block
//       holds its chunk of x in registers while the blocks sharing statistics (a group's in NCHW, an
//       image's in NHWC) exchange partials: x is read once, y written once.
//   split (group_norm_split.hip): stats / finalize / apply launches; x is read twice.
#pragma once

#include "rocm_sd/common.h"
#include "rocm_sd/compat.h"
#include "rocm_sd/grid_sync.h"
#if !RSD_RTC  // host side; runtime compilation (rocm_sd/jit/) takes the kernels only (rocm_sd/rtc.h)
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "rocm_sd/device.h"
#include "rocm_sd/group_norm/api.h"
#include "rocm_sd/launch.h"
#endif

namespace rsd {
namespace gn {

#if !RSD_RTC  // the launchers' plans (mirrored by rocm_sd/jit/group_norm_plan.py)
inline int64_t tensor_bytes(const GroupNormArgs& a) { return a.n * a.c * a.hw * elem_bytes(a.dtype); }

// Widest access (at most 16 bytes) such that every vector stays inside one channel (NCHW) or
// one group (NHWC) and x and y are aligned for it.
inline int pick_vec(const GroupNormArgs& a) {
  return widest_vec(a.dtype, a.layout == Layout::nchw ? a.hw : a.c / a.groups, {a.x, a.y});
}

// Streaming stores only pay when y cannot stay in L2 for its consumer anyway.
inline bool streaming_output(const GroupNormArgs& a) { return tensor_bytes(a) > (int64_t(32) << 20); }

// ---- the two paths ----
struct ResidentPlan {
  int vec = 1;
  // NCHW (group_norm_resident.hip): blocks sharing one group's statistics.
  int64_t blocks_per_group = 0;
  // NHWC (group_norm_resident_nhwc.hip): blocks of `threads` (rows_per_iter rows of threads_per_row) each
  // hold rows_per_block pixel rows of one image; an image's blocks share its statistics.
  int threads = 0, threads_per_row = 0, rows_per_iter = 0;
  int64_t rows_per_block = 0, blocks_per_image = 0;
  bool tickets = true;  // blocks take their chunk from an atomic counter (see the kernel) or from blockIdx
};
// False when the blocks sharing statistics (a group's in NCHW, an image's in NHWC) cannot all be
// resident on the device at once.
bool resident_plan(const GroupNormArgs& a, ResidentPlan* plan);
size_t resident_workspace_bytes(const GroupNormArgs& a, const ResidentPlan& p);
// Enqueue on a.stream; the first launch error, if any.
hipError_t resident_launch(const GroupNormArgs& a, const ResidentPlan& p);
// The NHWC halves of the three above, which dispatch to them by layout.
bool resident_nhwc_plan(const GroupNormArgs& a, ResidentPlan* plan);
size_t resident_nhwc_workspace_bytes(const GroupNormArgs& a, const ResidentPlan& p);
hipError_t resident_nhwc_launch(const GroupNormArgs& a, const ResidentPlan& p);

// Blocks of `threads` threads that fit on the device at once for the least occupant of `kernels` (the
// instances one launch may pick among: the resident paths size their exchange by it), or 0 when the runtime
// cannot tell, in which case the resident paths are refused, never guessed. Callers cache the answer.
template <class... Kernels>
int64_t least_resident_blocks(int device, int threads, Kernels... kernels) {
  int least = 1 << 30;
  for (const void* kernel : {reinterpret_cast<const void*>(kernels)...}) {
    int blocks = 0;
    if (hipOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, 0) != hipSuccess) {
      (void)hipGetLastError();
      blocks = 0;
    }
    least = std::min(least, blocks);
  }
  return int64_t(least) * device_attribute(device, Attr::multiprocessors, 0);
}

// The split path's channels_last kernels hold a pixel row (C / vec threads) in one block.
constexpr int kMaxThreadsNhwc = 1024;
size_t split_workspace_bytes(const GroupNormArgs& a);
int split_vec(const GroupNormArgs& a);  // the split path's vector width (NHWC vectors may span two groups)
hipError_t split_launch(const GroupNormArgs& a);
#endif  // !RSD_RTC

// ---- device math ----
__device__ __forceinline__ float2 mean_rstd_of(const WelfordStats& s, float eps) {
  const float var = s.n > 0.f ? s.m2 / s.n : 0.f;  // biased variance, as torch
  return make_float2(s.mean, rsqrtf(var + eps));
}

// y = x * a + b folds the input bias, the normalisation and the affine transform of channel `ch`:
// ((x + in_bias) - mean) * rstd * gamma + beta.
// The same from gamma[ch] and beta[ch] already loaded (the kernels that load them before their statistics
// are known).
__device__ __forceinline__ void scale_shift_of(float gm, float bt, float2 mr, float& a, float& b, float in_bias = 0.f) {
  a = mr.y * gm;
  b = fmaf(in_bias - mr.x, a, bt);
}

template <class P>
__device__ __forceinline__ void scale_shift(const P* gamma, const P* beta, int ch, float2 mr, float& a, float& b,
                                            float in_bias = 0.f) {
  scale_shift_of(gamma ? to_float(gamma[ch]) : 1.f, beta ? to_float(beta[ch]) : 0.f, mr, a, b, in_bias);
}

// The input bias of channel `ch` of one image (a row of the (N, C) input_bias), 0 without one.
template <class T>
__device__ __forceinline__ float input_bias_of(const T* row, int ch) {
  return row ? to_float(row[ch]) : 0.f;
}

template <class T, bool SILU>
__device__ __forceinline__ T activate(float y) {
  if constexpr (SILU) y = std::is_same<T, float>::value ? silu(y) : silu_fast(y);
  return from_float<T>(y);
}

// Whether normalize's A is a per-element array (<type_traits>' is_array, which neither runtime compiler has).
template <class A>
struct per_element {
  static constexpr bool value = false;
};
template <class E, int N>
struct per_element<E[N]> {
  static constexpr bool value = true;
};

// y = act(x * a + b) for one vector; A and B are scalars (one channel) or per-element arrays.
template <class T, int VEC, bool SILU, class A, class B>
__device__ __forceinline__ Vec<T, VEC> normalize(const Vec<T, VEC>& v, const A& a, const B& b) {
  Vec<T, VEC> out;
#pragma unroll
  for (int k = 0; k < VEC; ++k) {
    if constexpr (per_element<A>::value)
      out.v[k] = activate<T, SILU>(fmaf(to_float(v.v[k]), a[k], b[k]));
    else
      out.v[k] = activate<T, SILU>(fmaf(to_float(v.v[k]), a, b));
  }
  return out;
}

// Merges `count` partials other blocks wrote (read through coherent loads), always in the same
// order, so that every block of a group gets bit-identical statistics. The first wave does the work
// (Welford merges cost a division each); the result is broadcast through `scratch`. Contains
// __syncthreads: call from all threads.
__device__ __forceinline__ WelfordStats merge_partials(const WelfordStats* partials, uint32_t count,
                                                       float* scratch) {
  if (wave_id() == 0) {
    WelfordStats merged = {0.f, 0.f, 0.f};
    for (uint32_t j = lane_id(); j < count; j += RSD_WAVE) {
      const float* p = reinterpret_cast<const float*>(partials + j);
      merged = welford_merge(merged, WelfordStats{load_coherent(p), load_coherent(p + 1), load_coherent(p + 2)});
    }
    merged = wave_reduce(merged);
    if (lane_id() == 0) *reinterpret_cast<WelfordStats*>(scratch) = merged;
  }
  __syncthreads();
  const WelfordStats r = *reinterpret_cast<const WelfordStats*>(scratch);
  __syncthreads();  // scratch may be reused by the caller
  return r;
}

// Merges `count` Welford partials `stride` apart (all threads of the block take part) into (mean, rstd):
// fp64 sums S1 = sum n_b mean_b and S2 = sum M2_b + n_b mean_b^2, each thread loading its partials at once,
// then a fixed shuffle tree and the waves in order, so every bit is the same on every run. In fp64,
// var = S2/N - (S1/N)^2 loses ~log2(mean^2 / var) of 53 bits, harmless for any 16-bit or fp32 activation,
// and the additions need no division (a Welford merge does one: a chain of them is what made a wave per
// group slow at thousands of partials). Partials other blocks of the same launch wrote are read through
// coherent loads. Only whole waves take part in the shuffles (every lane must be active: blocks of at least
// one wave). `scratch`: kMergeScratchDoubles doubles of shared memory. Contains __syncthreads.
constexpr int kMergeScratchDoubles = 3 * RSD_MAX_WAVES_PER_BLOCK;

__device__ __forceinline__ float2 merge_partials_fp64(const WelfordStats* first, uint32_t count, int64_t stride,
                                                      float eps, double* scratch) {
  const int waves = int(blockDim.x / RSD_WAVE);
  if (wave_id() < waves) {
    double n = 0.0, s1 = 0.0, s2 = 0.0;
#pragma unroll 2
    for (uint32_t j = threadIdx.x; j < count; j += uint32_t(waves * RSD_WAVE)) {
      const float* p = reinterpret_cast<const float*>(first + int64_t(j) * stride);
      const double nb = load_coherent(p), mean = load_coherent(p + 1), m2 = load_coherent(p + 2);
      n += nb;
      s1 += nb * mean;
      s2 += m2 + nb * mean * mean;
    }
#pragma unroll
    for (int offset = RSD_WAVE / 2; offset > 0; offset /= 2) {
      n += shfl_xor(n, offset);
      s1 += shfl_xor(s1, offset);
      s2 += shfl_xor(s2, offset);
    }
    if (lane_id() == 0) {
      scratch[3 * wave_id()] = n;
      scratch[3 * wave_id() + 1] = s1;
      scratch[3 * wave_id() + 2] = s2;
    }
  }
  __syncthreads();
  double n = 0.0, s1 = 0.0, s2 = 0.0;
  for (int w = 0; w < waves; ++w) {
    n += scratch[3 * w];
    s1 += scratch[3 * w + 1];
    s2 += scratch[3 * w + 2];
  }
  __syncthreads();  // scratch may be reused
  const double mean = n > 0.0 ? s1 / n : 0.0;
  const double var = n > 0.0 ? fmax(s2 / n - mean * mean, 0.0) : 0.0;  // biased, as torch
  return make_float2(float(mean), rsqrtf(float(var) + eps));
}

// ---- block statistics of NCHW chunks ----
// What the sums of a thread are shifted by. fp32 inputs: each thread's own first value, the threads' results
// then combined by Welford merges (block_reduce): a single outlier as the shift of a whole block's sums would
// cost the variance up to ~log2(block elements) ~ 14 of fp32's 24 bits, ten times PyTorch's error in fp32
// results. 16-bit inputs: one value shared by the block, the threads' sums added plainly (block_sum, no
// divisions: ~6% faster at the VAE's largest shapes on H200); the worst case leaves ~10 bits, about what a
// 16-bit output holds, and only when the chunk's first value is far outside the rest.
template <class T>
__host__ __device__ constexpr bool per_thread_shift() {
  return std::is_same<T, float>::value;
}

template <class T>
__device__ __forceinline__ WelfordStats block_stats(const ShiftedSums& acc, float* scratch) {
  if constexpr (per_thread_shift<T>())
    return block_reduce(acc.stats(), scratch);
  else
    return block_sum(acc, scratch).stats();
}

// ---- a chunk of one NCHW group held in registers (the single-pass kernels) ----
// kChunkThreads threads, each holding kChunkBytesPerThread bytes: vector u of a thread starts at
// element first + u * kChunkThreads * VEC, so each load instruction of the block covers consecutive
// vectors (coalesced), and, VEC dividing hw, every vector lies in one channel.
constexpr int kChunkThreads = 256;
constexpr int kChunkBytesPerThread = 64;  // four 16-byte vectors (or more narrower ones)
template <class T>
constexpr int kChunkElems = kChunkThreads * kChunkBytesPerThread / int(sizeof(T));

template <class T, int VEC>
struct RegisterChunk {
  static constexpr int kLoads = kChunkBytesPerThread / (VEC * int(sizeof(T)));
  static constexpr uint32_t kElems = kChunkElems<T>;
  static constexpr uint32_t kStride = kChunkThreads * VEC;
  Vec<T, VEC> v[kLoads];
  uint32_t first;  // element offset in the group of this thread's first vector

  // Part `part` of a group of L elements (L < 2^31, checked on the host, so offsets fit in 32 bits).
  __device__ __forceinline__ void load(const T* group_x, uint32_t part, uint32_t L) {
    first = part * kElems + threadIdx.x * VEC;
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      if (first + u * kStride < L) v[u] = load_vec<T, VEC>(group_x + first + u * kStride);
    }
  }

  // Sums of the loaded elements plus their channel's input bias (bias_row: the image's row of input_bias,
  // nullptr for none), about `shift` or, with per_thread_shift<T>, about the thread's first value.
  __device__ __forceinline__ ShiftedSums sums(uint32_t L, float shift, FastDiv hw, int channel0,
                                              const T* bias_row) const {
    ShiftedSums acc;
    acc.shift = shift;
    if (per_thread_shift<T>() && first < L)
      acc.shift = to_float(v[0].v[0]) + (bias_row ? input_bias_of(bias_row, channel0 + int(hw.div(first))) : 0.f);
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const uint32_t i = first + u * kStride;
      if (i < L) acc.add(v[u], bias_row ? input_bias_of(bias_row, channel0 + int(hw.div(i))) : 0.f);
    }
    return acc;
  }

  template <bool SILU, class P>
  __device__ __forceinline__ void store(T* group_y, uint32_t L, FastDiv hw, int channel0, const P* gamma,
                                        const P* beta, const T* bias_row, float2 mean_rstd, bool streaming) const {
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const uint32_t i = first + u * kStride;
      if (i < L) {
        const int ch = channel0 + int(hw.div(i));
        float a, b;
        scale_shift(gamma, beta, ch, mean_rstd, a, b, input_bias_of(bias_row, ch));
        store_vec(group_y + i, normalize<T, VEC, SILU>(v[u], a, b), streaming);
      }
    }
  }
};

#if !RSD_RTC
// ---- compile-time dispatch of runtime choices ----
template <class T>
struct Tag {
  using type = T;
};

template <class F>
void with_dtype(DType d, F&& f) {
  switch (d) {
    case DType::f32: f(Tag<float>{}); break;
    case DType::f16: f(Tag<__half>{}); break;
    case DType::bf16: f(Tag<bf16>{}); break;
  }
}

template <int V>
using IntC = std::integral_constant<int, V>;

// Only widths of at most 16 bytes of T are instantiated.
template <class T, class F>
void with_vec(int vec, F&& f) {
  switch (vec) {
    case 8: if constexpr (sizeof(T) <= 2) f(IntC<8>{}); break;
    case 4: f(IntC<4>{}); break;
    case 2: f(IntC<2>{}); break;
    default: f(IntC<1>{}); break;
  }
}

template <class F>
void with_bool(bool b, F&& f) {
  if (b)
    f(std::true_type{});
  else
    f(std::false_type{});
}

// gamma/beta are of the input's type or fp32.
template <class T, class F>
void with_params(DType param_dtype, F&& f) {
  if (param_dtype == DType::f32)
    f(Tag<float>{});
  else
    f(Tag<T>{});
}
#endif  // !RSD_RTC

}  // namespace gn
}  // namespace rsd
