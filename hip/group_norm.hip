// GroupNorm with optional fused SiLU, for NCHW-contiguous and NHWC (channels_last) tensors.
//
//   y = act((x - mean[n,g]) * rstd[n,g] * gamma[c] + beta[c]),  act = SiLU or identity
//
// Three launches, statistics in fp32:
//   1. stats:    each block reduces one chunk of one group (NCHW) or one pixel range of one image
//                (NHWC, all groups at once) to Welford partials (count, mean, M2);
//   2. finalize: one wave per (n, g) merges the partials into mean and 1/sqrt(var + eps);
//   3. apply:    normalises, scales, shifts, activates and writes y.
// Traffic: x is read twice and y written once. The apply pass walks the chunks in the reverse
// order of the stats pass, so it starts with the chunks that pass read last, which are still in
// L2; for tensors that fit in L2 the second read costs no DRAM traffic at all. Outputs larger than
// L2 are written with streaming stores so that they do not evict the input lines still to come.
// Why not one kernel: torch's GroupNorm runs one block per (n, g) for its statistics, which is 64
// blocks for an SD batch of 2 and 32 for the VAE at batch 1, far too few to fill a GPU; splitting
// a group over many blocks needs a grid-wide exchange of partial statistics, and a second launch
// is the portable way to get one (no cooperative-launch requirements, graph-capture safe).
//
// References: Chan, Golub, LeVeque, "Algorithms for computing the sample variance" (1983);
// torch's GroupNorm (aten/src/ATen/native/cuda/group_norm_kernel.cu) for the semantics.
#include <algorithm>
#include <type_traits>

#include "rocm_sd/api.h"
#include "rocm_sd/common.h"
#include "rocm_sd/compat.h"

namespace rsd {
namespace {

constexpr int kThreads = 256;         // threads per block of the NCHW kernels
constexpr int kUnroll = 4;            // independent vector loads in flight per thread
constexpr int64_t kChunkElems = 16384;  // elements per block: 32 KB of fp16, 16 vectors a thread
constexpr int kMinBlocksPerSm = 2;    // split groups further until the grid covers the GPU twice
// NHWC blocks hold one pixel row of C / vec threads at least. Rows up to 512 threads use kernels
// compiled for 512-thread blocks (128 registers a thread, no spills); wider rows, up to 1024
// threads, use a second instantiation under the 64-register cap of 1024-thread blocks.
constexpr int kMaxThreadsNhwc = 1024;
constexpr int64_t kPlaneMin = 2048;   // NCHW planes at least this large are applied plane by plane

struct Plan {
  int vec = 1;                // elements per access
  int threads = kThreads;     // threads per block
  int threads_per_row = 0;    // NHWC: C / vec
  int rows_per_iter = 0;      // NHWC: pixel rows a block covers per iteration
  int64_t chunk = 0;          // NCHW: elements of a group per block; NHWC: pixels per block
  int64_t splits = 0;         // blocks per (n, g) for NCHW, per n for NHWC
  int64_t partial_count = 0;  // n * groups * splits
  bool planes = false;        // NCHW apply over (n, c) planes instead of group chunks
  int64_t plane_chunk = 0;    // elements of a plane per apply block
  int64_t plane_splits = 0;   // apply blocks per plane
  bool streaming = false;     // write y with streaming stores
};

int elem_bytes(DType d) { return d == DType::f32 ? 4 : 2; }

// Device attributes are fixed for the life of the process: ask the runtime once per device. The
// fallbacks are safe choices when it cannot answer (64 is the larger wave: the finalize launch then
// has more blocks than needed, never too few).
enum class Attr : int { multiprocessors = 0, wave_size, l2_bytes, count };

int device_attribute(int device, Attr which, int fallback) {
  static int cached[64][int(Attr::count)] = {};
  if (device < 0 || device >= 64) return fallback;
  int& slot = cached[device][int(which)];
  if (slot == 0) {
    int v = 0;
    hipError_t err = hipSuccess;
    switch (which) {
      case Attr::multiprocessors: err = hipDeviceGetAttribute(&v, hipDeviceAttributeMultiprocessorCount, device); break;
      case Attr::wave_size: err = hipDeviceGetAttribute(&v, hipDeviceAttributeWarpSize, device); break;
      default: err = hipDeviceGetAttribute(&v, hipDeviceAttributeL2CacheSize, device); break;
    }
    if (err != hipSuccess || v <= 0) {
      (void)hipGetLastError();
      v = fallback;
    }
    slot = v;
  }
  return slot;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

bool aligned(const void* p, int bytes) { return (reinterpret_cast<uintptr_t>(p) % bytes) == 0; }

// Widest access (at most 16 bytes) such that every vector stays inside one channel (NCHW) or
// one group (NHWC) and x and y are aligned for it.
int pick_vec(const GroupNormArgs& a) {
  const int eb = elem_bytes(a.dtype);
  const int64_t cg = a.c / a.groups;
  const int64_t unit = a.layout == Layout::nchw ? a.hw : cg;
  for (int vec = 16 / eb; vec > 1; vec /= 2) {
    if (unit % vec == 0 && aligned(a.x, vec * eb) && aligned(a.y, vec * eb)) return vec;
  }
  return 1;
}

Plan make_plan(const GroupNormArgs& a) {
  Plan p;
  p.vec = pick_vec(a);
  const int64_t ng = a.n * a.groups;
  const int64_t want_blocks = int64_t(kMinBlocksPerSm) * device_attribute(a.device, Attr::multiprocessors, 80);
  if (a.layout == Layout::nchw) {
    const int64_t L = (a.c / a.groups) * a.hw;
    const int64_t max_splits = std::max<int64_t>(1, L / (int64_t(p.vec) * kThreads));
    int64_t splits = ceil_div(L, kChunkElems);
    if (ng * splits < want_blocks) splits = ceil_div(want_blocks, ng);
    splits = std::max<int64_t>(1, std::min(splits, max_splits));
    p.chunk = ceil_div(ceil_div(L, splits), p.vec) * p.vec;
    p.splits = ceil_div(L, p.chunk);
    // Plane-wise apply only for tensors larger than L2: below that, applying in the same chunks as
    // the stats pass (in reverse) re-reads x from L2, which measured faster (bench/notes/group_norm.md).
    // The plane grid has n * c rows in its y dimension, at most 65535.
    p.planes = a.hw >= kPlaneMin && a.n * a.c <= 65535 &&
               a.n * a.c * a.hw * elem_bytes(a.dtype) > device_attribute(a.device, Attr::l2_bytes, 32 << 20);
    if (p.planes) {
      p.plane_splits = ceil_div(a.hw, kChunkElems);
      p.plane_chunk = ceil_div(ceil_div(a.hw, p.plane_splits), p.vec) * p.vec;
      p.plane_splits = ceil_div(a.hw, p.plane_chunk);
    }
  } else {
    p.threads_per_row = int(a.c / p.vec);
    p.rows_per_iter = std::max(1, kThreads / p.threads_per_row);
    p.threads = p.threads_per_row * p.rows_per_iter;
    int64_t rows = std::max<int64_t>(p.rows_per_iter, kChunkElems / a.c);
    int64_t splits = ceil_div(a.hw, rows);
    if (a.n * splits < want_blocks) splits = ceil_div(want_blocks, a.n);
    splits = std::max<int64_t>(1, std::min(splits, ceil_div(a.hw, p.rows_per_iter)));
    p.chunk = ceil_div(ceil_div(a.hw, splits), p.rows_per_iter) * p.rows_per_iter;
    p.splits = ceil_div(a.hw, p.chunk);
  }
  p.partial_count = ng * p.splits;
  // Streaming stores only pay when y cannot stay in L2 for its consumer anyway.
  p.streaming = a.n * a.c * a.hw * elem_bytes(a.dtype) > (int64_t(32) << 20);
  return p;
}

size_t round_up(size_t v, size_t m) { return (v + m - 1) / m * m; }

// ------------------------------------------------------------------------------------------------
// kernels

__device__ __forceinline__ float2 mean_rstd_of(const WelfordStats& s, float eps) {
  const float var = s.n > 0.f ? s.m2 / s.n : 0.f;  // biased variance, as torch
  return make_float2(s.mean, rsqrtf(var + eps));
}

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

template <class T, int VEC>
__device__ __forceinline__ void accumulate(ShiftedSums& acc, const Vec<T, VEC>& v) {
#pragma unroll
  for (int k = 0; k < VEC; ++k) acc.add(to_float(v.v[k]));
}

// Grid (splits, n * groups). x: (N, C, HW) contiguous, group (n, g) = L contiguous elements.
template <class T, int VEC>
__global__ void __launch_bounds__(kThreads) group_norm_stats_nchw(const T* __restrict__ x, int64_t L, int64_t chunk,
                                                                  WelfordStats* __restrict__ partials,
                                                                  float2* __restrict__ final_out, float eps) {
  __shared__ WelfordStats scratch[RSD_MAX_WAVES_PER_BLOCK];
  const int64_t ng = blockIdx.y;
  const int64_t begin = int64_t(blockIdx.x) * chunk;
  const int64_t end = min64(begin + chunk, L);
  const T* base = x + ng * L;
  ShiftedSums acc;
  acc.shift = to_float(base[begin]);  // one value of the chunk: keeps the per-thread sums small
  const int64_t stride = int64_t(blockDim.x) * VEC;
  int64_t i = begin + int64_t(threadIdx.x) * VEC;
  for (; i + (kUnroll - 1) * stride < end; i += kUnroll * stride) {
    Vec<T, VEC> v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = load_vec<T, VEC>(base + i + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) accumulate(acc, v[u]);
  }
  for (; i < end; i += stride) accumulate(acc, load_vec<T, VEC>(base + i));
  const WelfordStats s = block_reduce(acc.stats(), scratch);
  if (threadIdx.x == 0) {
    if (final_out != nullptr)  // one block per group: no finalize launch needed
      final_out[ng] = mean_rstd_of(s, eps);
    else
      partials[ng * gridDim.x + blockIdx.x] = s;
  }
}

// Grid (splits, n). x: (N, HW, C). Thread (row r, column t) reads channels [t*VEC, t*VEC+VEC) of
// pixels r, r + rows_per_iter, ...: its vectors all lie in one group (VEC divides C / groups).
template <class T, int VEC, int MAX_THREADS>
__global__ void __launch_bounds__(MAX_THREADS) group_norm_stats_nhwc(const T* __restrict__ x, int64_t hw, int c, int groups,
                                                              int64_t chunk, int threads_per_row, int rows_per_iter,
                                                              WelfordStats* __restrict__ partials) {
  __shared__ WelfordStats per_thread[MAX_THREADS];
  const int64_t n = blockIdx.y;
  const int col = threadIdx.x % threads_per_row;
  const int row = threadIdx.x / threads_per_row;
  const int64_t begin = int64_t(blockIdx.x) * chunk;
  const int64_t end = min64(begin + chunk, hw);
  const T* base = x + n * hw * c + col * VEC;
  ShiftedSums acc;
  acc.shift = to_float(base[begin * c]);
  int64_t r = begin + row;
  const int64_t step = rows_per_iter;
  for (; r + (kUnroll - 1) * step < end; r += kUnroll * step) {
    Vec<T, VEC> v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = load_vec<T, VEC>(base + (r + u * step) * c);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) accumulate(acc, v[u]);
  }
  for (; r < end; r += step) accumulate(acc, load_vec<T, VEC>(base + r * c));
  per_thread[threadIdx.x] = acc.stats();
  __syncthreads();
  // One thread per group merges the (rows_per_iter x cols_per_group) thread results of the group.
  const int cols_per_group = c / groups / VEC;
  for (int g = threadIdx.x; g < groups; g += blockDim.x) {
    WelfordStats s = {0.f, 0.f, 0.f};
    for (int rr = 0; rr < rows_per_iter; ++rr)
      for (int k = 0; k < cols_per_group; ++k)
        s = welford_merge(s, per_thread[rr * threads_per_row + g * cols_per_group + k]);
    partials[(n * groups + g) * gridDim.x + blockIdx.x] = s;
  }
}

// One wave per (n, g): merge `splits` partials into (mean, rstd).
__global__ void group_norm_finalize(const WelfordStats* __restrict__ partials, int64_t splits, int64_t ng_count,
                                    float eps, float2* __restrict__ mean_rstd) {
  const int64_t ng = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / RSD_WAVE;
  if (ng >= ng_count) return;  // whole waves leave together: ng is uniform within a wave
  WelfordStats s = {0.f, 0.f, 0.f};
  for (int64_t i = lane_id(); i < splits; i += RSD_WAVE) s = welford_merge(s, partials[ng * splits + i]);
  s = wave_reduce(s);
  if (lane_id() == 0) mean_rstd[ng] = mean_rstd_of(s, eps);
}

template <class P>
__device__ __forceinline__ void scale_shift(const P* gamma, const P* beta, int ch, float2 mr, float& a, float& b) {
  const float gm = gamma ? to_float(gamma[ch]) : 1.f;
  const float bt = beta ? to_float(beta[ch]) : 0.f;
  a = mr.y * gm;
  b = bt - mr.x * a;
}

template <class T, bool SILU>
__device__ __forceinline__ T activate(float y) {
  if constexpr (SILU) y = std::is_same<T, float>::value ? silu(y) : silu_fast(y);
  return from_float<T>(y);
}

// y = act(x * a + b) for one vector; A and B are scalars (one channel) or per-element arrays.
template <class T, int VEC, bool SILU, class A, class B>
__device__ __forceinline__ Vec<T, VEC> normalize(const Vec<T, VEC>& v, const A& a, const B& b) {
  Vec<T, VEC> out;
#pragma unroll
  for (int k = 0; k < VEC; ++k) {
    if constexpr (std::is_array<A>::value)
      out.v[k] = activate<T, SILU>(fmaf(to_float(v.v[k]), a[k], b[k]));
    else
      out.v[k] = activate<T, SILU>(fmaf(to_float(v.v[k]), a, b));
  }
  return out;
}

// Reversed block order (see the header comment): block 0 takes the last chunk of the stats pass.
__device__ __forceinline__ int64_t reversed_block() {
  const int64_t count = int64_t(gridDim.x) * gridDim.y;
  return count - 1 - (int64_t(blockIdx.y) * gridDim.x + blockIdx.x);
}

template <class T, class P, int VEC, bool SILU>
__global__ void __launch_bounds__(kThreads) group_norm_apply_nchw(const T* __restrict__ x, T* __restrict__ y,
                                                                  const P* __restrict__ gamma, const P* __restrict__ beta,
                                                                  const float2* __restrict__ mean_rstd, int64_t L,
                                                                  int hw, int cg, int groups, int64_t chunk,
                                                                  bool streaming) {
  const int64_t block = reversed_block();
  const int64_t split = block % gridDim.x;
  const int64_t ng = block / gridDim.x;
  const int g = int(ng % groups);
  const float2 mr = mean_rstd[ng];
  const int64_t begin = split * chunk;
  const int64_t end = min64(begin + chunk, L);
  const T* xb = x + ng * L;
  T* yb = y + ng * L;
  for (int64_t i = begin + int64_t(threadIdx.x) * VEC; i < end; i += int64_t(blockDim.x) * VEC) {
    const Vec<T, VEC> v = load_vec<T, VEC>(xb + i);
    const int ch = g * cg + int(i) / hw;  // VEC divides hw: one channel per vector; L < 2^31
    float a, b;
    scale_shift(gamma, beta, ch, mr, a, b);
    store_vec(yb + i, normalize<T, VEC, SILU>(v, a, b), streaming);
  }
}

// Grid (segments, n * c) over (n, c) planes of hw elements: scale and shift are per block, and
// kUnroll vectors are in flight per thread. Used when planes are large (hw >= kPlaneMin).
template <class T, class P, int VEC, bool SILU>
__global__ void __launch_bounds__(kThreads) group_norm_apply_planes(const T* __restrict__ x, T* __restrict__ y,
                                                                    const P* __restrict__ gamma, const P* __restrict__ beta,
                                                                    const float2* __restrict__ mean_rstd, int64_t hw,
                                                                    int c, int cg, int64_t chunk, bool streaming) {
  const int64_t block = reversed_block();
  const int64_t segment = block % gridDim.x;
  const int64_t plane = block / gridDim.x;  // n * c + channel
  const int ch = int(plane % c);
  const float2 mr = mean_rstd[(plane / c) * (c / cg) + ch / cg];
  float a, b;
  scale_shift(gamma, beta, ch, mr, a, b);
  const int64_t begin = segment * chunk;
  const int64_t end = min64(begin + chunk, hw);
  const T* xb = x + plane * hw;
  T* yb = y + plane * hw;
  const int64_t stride = int64_t(blockDim.x) * VEC;
  int64_t i = begin + int64_t(threadIdx.x) * VEC;
  for (; i + (kUnroll - 1) * stride < end; i += kUnroll * stride) {
    Vec<T, VEC> v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = load_vec<T, VEC>(xb + i + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) store_vec(yb + i + u * stride, normalize<T, VEC, SILU>(v[u], a, b), streaming);
  }
  for (; i < end; i += stride) {
    store_vec(yb + i, normalize<T, VEC, SILU>(load_vec<T, VEC>(xb + i), a, b), streaming);
  }
}

template <class T, class P, int VEC, bool SILU, int MAX_THREADS>
__global__ void __launch_bounds__(MAX_THREADS) group_norm_apply_nhwc(const T* __restrict__ x, T* __restrict__ y,
                                                              const P* __restrict__ gamma, const P* __restrict__ beta,
                                                              const float2* __restrict__ mean_rstd, int64_t hw, int c,
                                                              int groups, int64_t chunk, int threads_per_row,
                                                              int rows_per_iter, bool streaming) {
  const int64_t block = reversed_block();
  const int64_t split = block % gridDim.x;
  const int64_t n = block / gridDim.x;
  const int col = threadIdx.x % threads_per_row;
  const int row = threadIdx.x / threads_per_row;
  const int c0 = col * VEC;
  const float2 mr = mean_rstd[n * groups + c0 / (c / groups)];
  float a[VEC], b[VEC];
#pragma unroll
  for (int k = 0; k < VEC; ++k) scale_shift(gamma, beta, c0 + k, mr, a[k], b[k]);
  const int64_t begin = split * chunk;
  const int64_t end = min64(begin + chunk, hw);
  const int64_t offset = n * hw * c + c0;
  const int64_t step = rows_per_iter;
  int64_t r = begin + row;
  for (; r + (kUnroll - 1) * step < end; r += kUnroll * step) {
    Vec<T, VEC> v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = load_vec<T, VEC>(x + offset + (r + u * step) * c);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      store_vec(y + offset + (r + u * step) * c, normalize<T, VEC, SILU>(v[u], a, b), streaming);
  }
  for (; r < end; r += step) {
    store_vec(y + offset + r * c, normalize<T, VEC, SILU>(load_vec<T, VEC>(x + offset + r * c), a, b), streaming);
  }
}

// ------------------------------------------------------------------------------------------------
// host-side dispatch

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

template <class F>
void with_vec(int vec, F&& f) {
  switch (vec) {
    case 8: f(IntC<8>{}); break;
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

}  // namespace

std::string group_norm_check(const GroupNormArgs& a) {
  if (a.n <= 0 || a.c <= 0 || a.hw <= 0) return "empty tensor";
  if (a.groups <= 0 || a.c % a.groups != 0) return "channels must be divisible by groups";
  if (a.param_dtype != a.dtype && a.param_dtype != DType::f32) return "weight/bias dtype must be the input's or float32";
  if (!aligned(a.x, elem_bytes(a.dtype)) || !aligned(a.y, elem_bytes(a.dtype))) return "misaligned data pointer";
  if ((a.c / a.groups) * a.hw >= (int64_t(1) << 31)) return "a group holds 2^31 or more elements";
  if (a.hw >= (int64_t(1) << 31)) return "spatial size of 2^31 or more";
  if (a.layout == Layout::nchw) {
    if (a.n * a.groups > 65535) return "batch * groups exceeds 65535";
  } else {
    if (a.n > 65535) return "batch exceeds 65535";
    // vec divides C/groups, so C / vec threads in a row, all in one block.
    if (a.c / pick_vec(a) > kMaxThreadsNhwc) return "channels_last with C / vector width > 1024";
  }
  return std::string();
}

size_t group_norm_workspace_bytes(const GroupNormArgs& a) {
  const Plan p = make_plan(a);
  return round_up(size_t(p.partial_count) * sizeof(WelfordStats), 256) + size_t(a.n * a.groups) * sizeof(float2);
}

std::string group_norm_forward(const GroupNormArgs& a) {
  std::string why = group_norm_check(a);
  if (!why.empty()) return why;
  int previous = -1;
  if (hipGetDevice(&previous) != hipSuccess) return hipGetErrorString(hipGetLastError());
  if (previous != a.device && hipSetDevice(a.device) != hipSuccess) return hipGetErrorString(hipGetLastError());

  const Plan p = make_plan(a);
  const int64_t ng = a.n * a.groups;
  auto* partials = static_cast<WelfordStats*>(a.workspace);
  auto* mean_rstd = reinterpret_cast<float2*>(static_cast<char*>(a.workspace) +
                                              round_up(size_t(p.partial_count) * sizeof(WelfordStats), 256));
  hipStream_t stream = static_cast<hipStream_t>(a.stream);
  const int cg = int(a.c / a.groups);

  with_dtype(a.dtype, [&](auto ttag) {
    using T = typename decltype(ttag)::type;
    const T* x = static_cast<const T*>(a.x);
    T* y = static_cast<T*>(a.y);
    with_vec(p.vec, [&](auto vtag) {
      constexpr int VEC = decltype(vtag)::value;
      if constexpr (VEC * sizeof(T) <= 16) {
        const bool single_block_groups = a.layout == Layout::nchw && p.splits == 1;
        if (a.layout == Layout::nchw) {
          group_norm_stats_nchw<T, VEC><<<dim3(unsigned(p.splits), unsigned(ng)), kThreads, 0, stream>>>(
              x, cg * a.hw, p.chunk, partials, single_block_groups ? mean_rstd : nullptr, a.eps);
        } else {
          auto stats = p.threads <= 512 ? group_norm_stats_nhwc<T, VEC, 512> : group_norm_stats_nhwc<T, VEC, 1024>;
          stats<<<dim3(unsigned(p.splits), unsigned(a.n)), p.threads, 0, stream>>>(
              x, a.hw, int(a.c), a.groups, p.chunk, p.threads_per_row, p.rows_per_iter, partials);
        }
        if (!single_block_groups) {
          const int finalize_threads = 256;
          const int64_t waves_per_block = finalize_threads / device_attribute(a.device, Attr::wave_size, 64);
          group_norm_finalize<<<unsigned(ceil_div(ng, waves_per_block)), finalize_threads, 0, stream>>>(
              partials, p.splits, ng, a.eps, mean_rstd);
        }
        with_bool(a.silu, [&](auto silu_tag) {
          constexpr bool SILU = decltype(silu_tag)::value;
          auto launch_apply = [&](auto ptag) {
            using P = typename decltype(ptag)::type;
            const P* gamma = static_cast<const P*>(a.gamma);
            const P* beta = static_cast<const P*>(a.beta);
            if (a.layout == Layout::nchw && p.planes) {
              group_norm_apply_planes<T, P, VEC, SILU>
                  <<<dim3(unsigned(p.plane_splits), unsigned(a.n * a.c)), kThreads, 0, stream>>>(
                      x, y, gamma, beta, mean_rstd, a.hw, int(a.c), cg, p.plane_chunk, p.streaming);
            } else if (a.layout == Layout::nchw) {
              group_norm_apply_nchw<T, P, VEC, SILU><<<dim3(unsigned(p.splits), unsigned(ng)), kThreads, 0, stream>>>(
                  x, y, gamma, beta, mean_rstd, cg * a.hw, int(a.hw), cg, a.groups, p.chunk, p.streaming);
            } else {
              auto apply = p.threads <= 512 ? group_norm_apply_nhwc<T, P, VEC, SILU, 512>
                                            : group_norm_apply_nhwc<T, P, VEC, SILU, 1024>;
              apply<<<dim3(unsigned(p.splits), unsigned(a.n)), p.threads, 0, stream>>>(
                  x, y, gamma, beta, mean_rstd, a.hw, int(a.c), a.groups, p.chunk, p.threads_per_row, p.rows_per_iter,
                  p.streaming);
            }
          };
          if (a.param_dtype == DType::f32)
            launch_apply(Tag<float>{});
          else
            launch_apply(Tag<T>{});
        });
      }
    });
  });

  const hipError_t err = hipGetLastError();
  if (previous != a.device) (void)hipSetDevice(previous);
  if (err != hipSuccess) return std::string("group_norm launch failed: ") + hipGetErrorString(err);
  return std::string();
}

}  // namespace rsd
