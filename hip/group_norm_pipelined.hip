// GroupNorm(+SiLU), NCHW, in one launch with a lag between statistics and output: x travels from
// DRAM once (its second read comes from L2), y is written once.
//
// The tensor is cut into items of one register chunk each (group_norm_impl.h), numbered group after
// group. Block `ticket` (an atomic counter: tickets follow the order blocks start in)
//   1. loads item `ticket` for statistics and item `ticket - lag` for output, both in flight at once;
//   2. reduces the first to Welford partials and publishes them; the block that completes a group
//      (the last to arrive on its counter) merges the group's partials into (mean, rstd) and marks
//      the group ready;
//   3. waits until the group of its output item is ready (normally long since), then normalises
//      that item and writes y.
// The second read of an item comes `lag` items after the first, about lag * 16 KB of traffic later:
// the plan keeps that well inside L2. Compared with the resident path (group_norm_resident.hip), no
// block idles with data in registers waiting for the rest of its group to be loaded.
//
// Why this cannot deadlock, on any device and beside any other work: a block waits only for groups
// whose items all have smaller tickets (lag >= blocks_per_group), i.e. for blocks that have already
// started, and steps 1-2 never wait. So the block holding the smallest waiting ticket always finds
// its group's statistics complete or in progress without waits of their own.
#include "rocm_sd/device.h"
#include "rocm_sd/group_norm_impl.h"

namespace rsd {
namespace gn {
namespace {

constexpr int kThreads = kChunkThreads;
constexpr int64_t kLagBytes = int64_t(16) << 20;  // traffic between an item's two reads: inside L2

// counters[0]: next ticket; counters[1 + ng]: blocks of group ng that published partials, + 1 once
// (mean, rstd) of the group is written. Zeroed by the launcher before every launch.
template <class T, class P, int VEC, bool SILU>
__global__ void __launch_bounds__(kThreads)
    group_norm_pipelined_nchw(const T* __restrict__ x, T* __restrict__ y, const P* __restrict__ gamma,
                              const P* __restrict__ beta, uint32_t L, uint32_t hw, int cg, int groups,
                              uint32_t blocks_per_group, uint32_t items, uint32_t lag, float eps,
                              WelfordStats* __restrict__ partials, float2* __restrict__ mean_rstd,
                              unsigned* __restrict__ counters, bool streaming) {
  __shared__ WelfordStats scratch[RSD_MAX_WAVES_PER_BLOCK];
  __shared__ unsigned word;
  if (threadIdx.x == 0) word = atomicAdd(&counters[0], 1u);
  __syncthreads();
  const uint32_t ticket = word;
  __syncthreads();  // `word` is reused below
  const bool has_stats = ticket < items;
  const bool has_output = ticket >= lag && ticket - lag < items;
  const uint32_t stats_item = ticket, out_item = ticket - lag;

  RegisterChunk<T, VEC> in, out;
  if (has_stats) in.load(x + int64_t(stats_item / blocks_per_group) * L, stats_item % blocks_per_group, L);
  if (has_output) out.load(x + int64_t(out_item / blocks_per_group) * L, out_item % blocks_per_group, L);

  if (has_stats) {
    const uint32_t ng = stats_item / blocks_per_group;
    const WelfordStats s = block_reduce(in.sums(L).stats(), scratch);
    WelfordStats* group_partials = partials + int64_t(ng) * blocks_per_group;
    if (threadIdx.x == 0) {
      group_partials[stats_item % blocks_per_group] = s;
      word = arrive(&counters[1 + ng]) == blocks_per_group - 1;  // last of its group?
    }
    __syncthreads();
    if (word) {
      const WelfordStats merged = merge_partials(group_partials, blocks_per_group, scratch);
      if (threadIdx.x == 0) {
        mean_rstd[ng] = mean_rstd_of(merged, eps);
        arrive(&counters[1 + ng]);  // release: ready
      }
    }
  }

  if (has_output) {
    const uint32_t ng = out_item / blocks_per_group;
    if (threadIdx.x == 0 && !wait_at_least(&counters[1 + ng], blocks_per_group + 1)) trap();
    __syncthreads();
    const float* mr = reinterpret_cast<const float*>(mean_rstd + ng);
    out.template store<SILU>(y + int64_t(ng) * L, L, hw, int(ng % groups) * cg, gamma, beta,
                             make_float2(load_coherent(mr), load_coherent(mr + 1)), streaming);
  }
}

size_t counter_bytes(const GroupNormArgs& a) { return round_up(size_t(1 + a.n * a.groups) * sizeof(unsigned), 256); }
size_t partial_bytes(const GroupNormArgs& a, const PipelinedPlan& p) {
  return round_up(size_t(a.n * a.groups * p.blocks_per_group) * sizeof(WelfordStats), 256);
}

}  // namespace

bool pipelined_plan(const GroupNormArgs& a, PipelinedPlan* plan) {
  if (a.layout != Layout::nchw) return false;
  PipelinedPlan p;
  p.vec = pick_vec(a);
  const int64_t L = (a.c / a.groups) * a.hw;
  const int64_t chunk = kChunkThreads * kChunkBytesPerThread / elem_bytes(a.dtype);
  p.blocks_per_group = ceil_div(L, chunk);
  // kLagBytes of items: far more than the blocks in flight at once, so an output block rarely finds
  // its group unready, and well inside L2. At least a group (deadlock freedom); at most all items
  // (a larger lag would only add blocks that do nothing).
  const int64_t items = a.n * a.groups * p.blocks_per_group;
  p.lag = std::max(p.blocks_per_group, std::min(items, kLagBytes / (kChunkThreads * kChunkBytesPerThread)));
  if (items + p.lag >= (int64_t(1) << 31)) return false;
  *plan = p;
  return true;
}

size_t pipelined_workspace_bytes(const GroupNormArgs& a, const PipelinedPlan& p) {
  return counter_bytes(a) + partial_bytes(a, p) + size_t(a.n * a.groups) * sizeof(float2);
}

hipError_t pipelined_launch(const GroupNormArgs& a, const PipelinedPlan& p) {
  hipStream_t stream = static_cast<hipStream_t>(a.stream);
  char* ws = static_cast<char*>(a.workspace);
  auto* counters = reinterpret_cast<unsigned*>(ws);
  auto* partials = reinterpret_cast<WelfordStats*>(ws + counter_bytes(a));
  auto* mean_rstd = reinterpret_cast<float2*>(ws + counter_bytes(a) + partial_bytes(a, p));
  const hipError_t err = hipMemsetAsync(counters, 0, counter_bytes(a), stream);
  if (err != hipSuccess) return err;
  const uint32_t L = uint32_t((a.c / a.groups) * a.hw);
  const uint32_t items = uint32_t(a.n * a.groups * p.blocks_per_group);
  const bool streaming = streaming_output(a);
  with_dtype(a.dtype, [&](auto ttag) {
    using T = typename decltype(ttag)::type;
    with_vec<T>(p.vec, [&](auto vtag) {
      constexpr int VEC = decltype(vtag)::value;
      with_params<T>(a.param_dtype, [&](auto ptag) {
        using P = typename decltype(ptag)::type;
        with_bool(a.silu, [&](auto silu_tag) {
          group_norm_pipelined_nchw<T, P, VEC, decltype(silu_tag)::value><<<items + uint32_t(p.lag), kThreads, 0, stream>>>(
              static_cast<const T*>(a.x), static_cast<T*>(a.y), static_cast<const P*>(a.gamma),
              static_cast<const P*>(a.beta), L, uint32_t(a.hw), int(a.c / a.groups), a.groups,
              uint32_t(p.blocks_per_group), items, uint32_t(p.lag), a.eps, partials, mean_rstd, counters, streaming);
        });
      });
    });
  });
  return hipGetLastError();
}

}  // namespace gn
}  // namespace rsd
