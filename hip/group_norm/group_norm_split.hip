// GroupNorm(+SiLU) in three launches: the automatic path wherever a group (NCHW) or an image (NHWC) spans
// more than one block (group_norm.hip's choose()).
//   1. stats:    each block reduces one chunk of one group (NCHW) or one pixel range of one image
//                (NHWC, all groups at once) to Welford partials (count, mean, M2);
//   2. finalize: one block per (n, g) merges the partials (fp64 sums, fixed order) into mean and
//                1/sqrt(var + eps); skipped when every NCHW group is one block;
//   3. apply:    normalises, scales, shifts, activates and writes y.
// Traffic: x is read twice and y written once. The apply pass walks the chunks in the reverse
// order of the stats pass, so it starts with the chunks that pass read last, which are still in
// L2; for tensors that fit in L2 the second read costs no DRAM traffic at all. Outputs larger than
// L2 are written with streaming stores so that they do not evict the input lines still to come.
//
// References: Chan, Golub, LeVeque, "Algorithms for computing the sample variance" (1983);
// torch's GroupNorm (aten/src/ATen/native/cuda/group_norm_kernel.cu) for the semantics.
#include "rocm_sd/group_norm/impl.h"
#if !RSD_RTC  // host side; runtime compilation (rocm_sd/jit/) takes the kernels only (rocm_sd/rtc.h)
#include "rocm_sd/device.h"
#endif

namespace rsd {
namespace gn {
namespace {

constexpr int kThreads = 256;         // threads per block of the NCHW kernels
constexpr int kUnroll = 4;            // independent vector loads in flight per thread
// channels_last rows read vectors no wider than a group: SD's 10-channel groups (C 320, 960) take 4-byte
// vectors, so the NHWC kernels keep kBytesInFlight per thread in flight instead (16 loads of 4 bytes),
// enough outstanding reads to cover DRAM latency; not in the 1024-thread instantiations, whose 64
// registers a thread would spill.
constexpr int kBytesInFlight = 64;
__host__ __device__ constexpr int nhwc_unroll(int vec_bytes, int max_threads) {
  return max_threads <= 512 && kBytesInFlight / vec_bytes > kUnroll ? kBytesInFlight / vec_bytes : kUnroll;
}
#if !RSD_RTC  // the plan's constants and make_plan: mirrored by rocm_sd/jit/group_norm_plan.py (split_plan)
// Which instantiation (512 or 1024 threads at most) a channels_last plan launches.
constexpr int nhwc_max_threads(int threads) { return threads <= 512 ? 512 : 1024; }
constexpr int64_t kChunkElems = 16384;  // elements per block: 32 KB of fp16, 16 vectors a thread
constexpr int kMinBlocksPerSm = 2;    // NCHW and tiny NHWC images: split further until the grid covers the GPU twice
// channels_last: the grid is this many blocks per multiprocessor, each covering hw / splits rows. Measured on
// H200 against 2 and 8 (bench/results/2026-11-22-group_norm-nhwc-grid-*): fewer blocks leave the UNet's images
// latency-bound (13% of warps active at 2 per SM), more give large images thousands of partials per group
// to merge: (2, 320, 64, 64) 16.3 -> 13.0 us, (1, 128, 1024, 1024) 315 -> 223 us.
constexpr int kBlocksPerSmNhwc = 4;
// NHWC blocks hold one pixel row of C / vec threads at least (kMaxThreadsNhwc in rocm_sd/group_norm/impl.h).
// Rows up to 512 threads use kernels compiled for 512-thread blocks (128 registers a thread, no
// spills); wider rows use a second instantiation under the 64-register cap of 1024-thread blocks.
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
  int groups_per_vec = 1;     // NHWC: groups a vector spans (2: twice the widest vector inside a group)
};

// channels_last vectors may span two groups where a group is narrower than the widest access: the VAE's
// largest tensors have 4 channels a group (C = 128, 32 groups), which alone would allow 8-byte vectors.
// Twice a group's width, when that is at most 16 bytes, divides C and the pointers are aligned for it.
void pick_nhwc_vec(const GroupNormArgs& a, Plan* p) {
  const int64_t cg = a.c / a.groups;
  const int eb = elem_bytes(a.dtype);
  p->vec = pick_vec(a);
  p->groups_per_vec = 1;
  const int64_t wider = 2 * cg;
  if (p->vec == cg && wider * eb <= 16 && a.c % wider == 0 && a.c / wider <= 512 && aligned(a.x, int(wider) * eb) &&
      aligned(a.y, int(wider) * eb)) {
    p->vec = int(wider);
    p->groups_per_vec = 2;
  }
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
               tensor_bytes(a) > device_attribute(a.device, Attr::l2_bytes, 32 << 20);
    if (p.planes) {
      p.plane_splits = ceil_div(a.hw, kChunkElems);
      p.plane_chunk = ceil_div(ceil_div(a.hw, p.plane_splits), p.vec) * p.vec;
      p.plane_splits = ceil_div(a.hw, p.plane_chunk);
    }
  } else {
    pick_nhwc_vec(a, &p);
    p.threads_per_row = int(a.c / p.vec);
    p.rows_per_iter = std::max(1, kThreads / p.threads_per_row);
    p.threads = p.threads_per_row * p.rows_per_iter;
    // A grid of kBlocksPerSmNhwc blocks per multiprocessor (see the constant), but never blocks smaller than
    // one full round of loads (rows_per_iter x unroll rows): below that the threads hold fewer bytes in flight,
    // which cost the wide rows of the up blocks (C 960 / 1920 at 16x16 and 32x32) up to 50% when tried.
    // Tiny images (the UNet's 8x8: fewer full-round blocks than half the multiprocessors) take more, smaller
    // blocks instead, to occupy the GPU: (2, 1280, 8, 8) 7.8 us against 10.1 us with full rounds.
    const int64_t sms = device_attribute(a.device, Attr::multiprocessors, 80);
    const int64_t round_rows =
        int64_t(p.rows_per_iter) * nhwc_unroll(p.vec * elem_bytes(a.dtype), nhwc_max_threads(p.threads));
    int64_t splits = std::min(ceil_div(kBlocksPerSmNhwc * sms, a.n), ceil_div(a.hw, round_rows));
    if (2 * a.n * ceil_div(a.hw, round_rows) < sms) splits = ceil_div(kMinBlocksPerSm * sms, a.n);
    splits = std::max<int64_t>(1, std::min(splits, ceil_div(a.hw, p.rows_per_iter)));
    p.chunk = ceil_div(ceil_div(a.hw, splits), p.rows_per_iter) * p.rows_per_iter;
    p.splits = ceil_div(a.hw, p.chunk);
  }
  p.partial_count = ng * p.splits;
  p.streaming = streaming_output(a);
  return p;
}
#endif  // !RSD_RTC

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// Grid (splits, n * groups). x: (N, C, HW) contiguous, group (n, g) = L contiguous elements.
// input_bias: (N, C) or nullptr; with one, each vector's channel is found by a multiply-shift.
template <class T, int VEC>
__global__ void __launch_bounds__(kThreads) group_norm_stats_nchw(const T* __restrict__ x, int64_t L, int64_t chunk,
                                                                  WelfordStats* __restrict__ partials,
                                                                  float2* __restrict__ final_out, float eps,
                                                                  const T* __restrict__ input_bias, FastDiv hw,
                                                                  int cg, int groups) {
  __shared__ float scratch[kReduceScratchFloats];
  const int64_t ng = blockIdx.y;
  const T* bias_row = input_bias ? input_bias + (ng / groups) * int64_t(groups) * cg + (ng % groups) * cg : nullptr;
  const int64_t begin = int64_t(blockIdx.x) * chunk;
  const int64_t end = min64(begin + chunk, L);
  const T* base = x + ng * L;
  ShiftedSums acc;
  const int64_t stride = int64_t(blockDim.x) * VEC;
  int64_t i = begin + int64_t(threadIdx.x) * VEC;
  // One value of the chunk keeps the sums small: the block's first, or the thread's (per_thread_shift).
  acc.shift = to_float(base[begin]);
  if (per_thread_shift<T>() && i < end)
    acc.shift = to_float(base[i]) + (bias_row ? input_bias_of(bias_row, int(hw.div(uint32_t(i)))) : 0.f);
  for (; i + (kUnroll - 1) * stride < end; i += kUnroll * stride) {
    Vec<T, VEC> v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = load_vec<T, VEC>(base + i + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      acc.add(v[u], bias_row ? input_bias_of(bias_row, int(hw.div(uint32_t(i + u * stride)))) : 0.f);
    }
  }
  for (; i < end; i += stride) {
    acc.add(load_vec<T, VEC>(base + i), bias_row ? input_bias_of(bias_row, int(hw.div(uint32_t(i)))) : 0.f);
  }
  const WelfordStats s = block_stats<T>(acc, scratch);
  if (threadIdx.x == 0) {
    if (final_out != nullptr)  // one block per group: no finalize launch needed
      final_out[ng] = mean_rstd_of(s, eps);
    else
      partials[ng * gridDim.x + blockIdx.x] = s;
  }
}

// Adds a vector of GPV groups' channels (VEC / GPV each) plus their input biases to one accumulator per group.
template <class T, int VEC, int GPV>
__device__ __forceinline__ void add_by_group(ShiftedSums (&acc)[GPV], const Vec<T, VEC>& v, const float (&bias)[VEC]) {
  acc[0].template add<0, VEC / GPV>(v, bias);
  if constexpr (GPV == 2) acc[1].template add<VEC / 2, VEC / 2>(v, bias);
}

// Grid (splits, n). x: (N, HW, C). Thread (row r, column t) reads channels [t*VEC, t*VEC+VEC) of
// pixels r, r + rows_per_iter, ...: its vectors lie in one group (VEC divides C / groups), or in two
// (GPV = 2: VEC = 2 C / groups), each with its own accumulator.
template <class T, int VEC, int GPV, int MAX_THREADS>
__global__ void __launch_bounds__(MAX_THREADS) group_norm_stats_nhwc(const T* __restrict__ x, int64_t hw, int c, int groups,
                                                              int64_t chunk, int threads_per_row, int rows_per_iter,
                                                              WelfordStats* __restrict__ partials,
                                                              const T* __restrict__ input_bias) {
  __shared__ WelfordStats per_thread[MAX_THREADS * GPV];
  const int64_t n = blockIdx.y;
  const int col = threadIdx.x % threads_per_row;
  const int row = threadIdx.x / threads_per_row;
  const int64_t begin = int64_t(blockIdx.x) * chunk;
  const int64_t end = min64(begin + chunk, hw);
  const T* base = x + n * hw * c + col * VEC;
  ShiftedSums acc[GPV];
#pragma unroll
  for (int j = 0; j < GPV; ++j) acc[j].shift = to_float(base[begin * c + j * (VEC / GPV)]);
  float bias[VEC];  // this thread's channels are fixed: their input biases are loaded once
#pragma unroll
  for (int k = 0; k < VEC; ++k) bias[k] = input_bias_of(input_bias ? input_bias + n * c : nullptr, col * VEC + k);
  int64_t r = begin + row;
  const int64_t step = rows_per_iter;
  constexpr int kU = nhwc_unroll(VEC * int(sizeof(T)), MAX_THREADS);
  for (; r < end; r += kU * step) {  // the last round predicated, not a loop of single loads: kU in flight
    Vec<T, VEC> v[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u)
      if (r + u * step < end) v[u] = load_vec<T, VEC>(base + (r + u * step) * c);
#pragma unroll
    for (int u = 0; u < kU; ++u)
      if (r + u * step < end) add_by_group(acc, v[u], bias);
  }
#pragma unroll
  for (int j = 0; j < GPV; ++j) per_thread[threadIdx.x * GPV + j] = acc[j].stats();
  __syncthreads();
  // One thread per group merges the (rows_per_iter x cols_per_group) thread results of the group.
  const int cols_per_group = GPV > 1 ? 1 : c / groups / VEC;
  for (int g = threadIdx.x; g < groups; g += blockDim.x) {
    const int first_col = (g / GPV) * cols_per_group, j = g % GPV;
    WelfordStats s = {0.f, 0.f, 0.f};
    for (int rr = 0; rr < rows_per_iter; ++rr)
      for (int k = 0; k < cols_per_group; ++k)
        s = welford_merge(s, per_thread[(rr * threads_per_row + first_col + k) * GPV + j]);
    partials[(n * groups + g) * gridDim.x + blockIdx.x] = s;
  }
}

// One block per (n, g): merge `splits` partials into (mean, rstd). A wave per (n, g) with Welford merges was
// a chain of divisions and L2 round trips: 11.6 us for the 528 partials a group of a 512x512 VAE image has,
// 5 us at the UNet's 128 (Nsight Compute, H200; bench/notes/group_norm.md).
constexpr int kFinalizeThreads = 256;
__global__ void __launch_bounds__(kFinalizeThreads) group_norm_finalize(const WelfordStats* __restrict__ partials,
                                                                       int64_t splits, float eps,
                                                                       float2* __restrict__ mean_rstd) {
  __shared__ double scratch[kMergeScratchDoubles];
  const int64_t ng = blockIdx.x;
  const float2 mr = merge_partials_fp64(partials + ng * splits, uint32_t(splits), 1, eps, scratch);
  if (threadIdx.x == 0) mean_rstd[ng] = mr;
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
                                                                  FastDiv hw, int cg, int groups, int64_t chunk,
                                                                  bool streaming, const T* __restrict__ input_bias) {
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
    const int ch = g * cg + int(hw.div(uint32_t(i)));  // VEC divides hw: one channel per vector; L < 2^31
    float a, b;
    scale_shift(gamma, beta, ch, mr, a, b, input_bias_of(input_bias ? input_bias + (ng / groups) * cg * groups : nullptr, ch));
    store_vec(yb + i, normalize<T, VEC, SILU>(v, a, b), streaming);
  }
}

// Grid (segments, n * c) over (n, c) planes of hw elements: scale and shift are per block, and
// kUnroll vectors are in flight per thread. Used when planes are large (hw >= kPlaneMin).
template <class T, class P, int VEC, bool SILU>
__global__ void __launch_bounds__(kThreads) group_norm_apply_planes(const T* __restrict__ x, T* __restrict__ y,
                                                                    const P* __restrict__ gamma, const P* __restrict__ beta,
                                                                    const float2* __restrict__ mean_rstd, int64_t hw,
                                                                    int c, int cg, int64_t chunk, bool streaming,
                                                                    const T* __restrict__ input_bias) {
  const int64_t block = reversed_block();
  const int64_t segment = block % gridDim.x;
  const int64_t plane = block / gridDim.x;  // n * c + channel
  const int ch = int(plane % c);
  const float2 mr = mean_rstd[(plane / c) * (c / cg) + ch / cg];
  float a, b;
  scale_shift(gamma, beta, ch, mr, a, b, input_bias ? to_float(input_bias[plane]) : 0.f);  // plane = n * c + ch
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
                                                              int rows_per_iter, bool streaming,
                                                              const T* __restrict__ input_bias) {
  const int64_t block = reversed_block();
  const int64_t split = block % gridDim.x;
  const int64_t n = block / gridDim.x;
  const int col = threadIdx.x % threads_per_row;
  const int row = threadIdx.x / threads_per_row;
  const int c0 = col * VEC;
  const int cg = c / groups;
  float a[VEC], b[VEC];
#pragma unroll
  for (int k = 0; k < VEC; ++k) {  // a vector may span two groups (see pick_nhwc_vec)
    scale_shift(gamma, beta, c0 + k, mean_rstd[n * groups + (c0 + k) / cg], a[k], b[k],
                input_bias_of(input_bias ? input_bias + n * c : nullptr, c0 + k));
  }
  const int64_t begin = split * chunk;
  const int64_t end = min64(begin + chunk, hw);
  const int64_t offset = n * hw * c + c0;
  const int64_t step = rows_per_iter;
  int64_t r = begin + row;
  constexpr int kU = nhwc_unroll(VEC * int(sizeof(T)), MAX_THREADS);
  for (; r < end; r += kU * step) {  // the last round predicated, as in the stats pass
    Vec<T, VEC> v[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u)
      if (r + u * step < end) v[u] = load_vec<T, VEC>(x + offset + (r + u * step) * c);
#pragma unroll
    for (int u = 0; u < kU; ++u)
      if (r + u * step < end) store_vec(y + offset + (r + u * step) * c, normalize<T, VEC, SILU>(v[u], a, b), streaming);
  }
}

}  // namespace

#if !RSD_RTC  // the launcher: mirrored by rocm_sd/jit/group_norm_plan.py (split_launches)
int split_vec(const GroupNormArgs& a) { return make_plan(a).vec; }

size_t split_workspace_bytes(const GroupNormArgs& a) {
  const Plan p = make_plan(a);
  return round_up(size_t(p.partial_count) * sizeof(WelfordStats), 256) + size_t(a.n * a.groups) * sizeof(float2);
}

hipError_t split_launch(const GroupNormArgs& a) {
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
    const T* input_bias = static_cast<const T*>(a.input_bias);
    with_vec<T>(p.vec, [&](auto vtag) {
      constexpr int VEC = decltype(vtag)::value;
      {
        const bool single_block_groups = a.layout == Layout::nchw && p.splits == 1;
        if (a.layout == Layout::nchw) {
          group_norm_stats_nchw<T, VEC><<<dim3(unsigned(p.splits), unsigned(ng)), kThreads, 0, stream>>>(
              x, cg * a.hw, p.chunk, partials, single_block_groups ? mean_rstd : nullptr, a.eps, input_bias,
              FastDiv(uint32_t(a.hw)), cg, a.groups);
        } else {
          auto stats = nhwc_max_threads(p.threads) == 1024 ? group_norm_stats_nhwc<T, VEC, 1, 1024>
                       : p.groups_per_vec == 1 ? group_norm_stats_nhwc<T, VEC, 1, 512>
                                               : group_norm_stats_nhwc<T, VEC, VEC >= 2 ? 2 : 1, 512>;
          stats<<<dim3(unsigned(p.splits), unsigned(a.n)), p.threads, 0, stream>>>(
              x, a.hw, int(a.c), a.groups, p.chunk, p.threads_per_row, p.rows_per_iter, partials, input_bias);
        }
        if (!single_block_groups) {
          group_norm_finalize<<<unsigned(ng), kFinalizeThreads, 0, stream>>>(partials, p.splits, a.eps, mean_rstd);
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
                      x, y, gamma, beta, mean_rstd, a.hw, int(a.c), cg, p.plane_chunk, p.streaming, input_bias);
            } else if (a.layout == Layout::nchw) {
              group_norm_apply_nchw<T, P, VEC, SILU><<<dim3(unsigned(p.splits), unsigned(ng)), kThreads, 0, stream>>>(
                  x, y, gamma, beta, mean_rstd, cg * a.hw, FastDiv(uint32_t(a.hw)), cg, a.groups, p.chunk, p.streaming,
                  input_bias);
            } else {
              auto apply = nhwc_max_threads(p.threads) == 512 ? group_norm_apply_nhwc<T, P, VEC, SILU, 512>
                                            : group_norm_apply_nhwc<T, P, VEC, SILU, 1024>;
              apply<<<dim3(unsigned(p.splits), unsigned(a.n)), p.threads, 0, stream>>>(
                  x, y, gamma, beta, mean_rstd, a.hw, int(a.c), a.groups, p.chunk, p.threads_per_row, p.rows_per_iter,
                  p.streaming, input_bias);
            }
          };
          with_params<T>(a.param_dtype, launch_apply);
        });
      }
    });
  });

  return hipGetLastError();
}
#endif  // !RSD_RTC

}  // namespace gn
}  // namespace rsd
