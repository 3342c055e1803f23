// GroupNorm(+SiLU), NCHW, in one launch with a lag between statistics and output: x travels from
// DRAM once (its second read comes from L2), y is written once.
//
// The tensor is cut into items of one register chunk each (group_norm_impl.h), numbered group after
// group. Block `ticket` (an atomic counter: tickets follow the order blocks start in)
//   1. loads item `ticket` for statistics and item `ticket - lag` for output, both in flight at once;
//   2. meanwhile checks that all partials of the output item's group are published (normally long
//      since) and merges them into (mean, rstd), every block in the same order: identical results;
//   3. reduces its statistics item to Welford partials and publishes them (store + release count);
//   4. normalises the output item and writes y.
// Each step's round trips overlap the data loads of step 1, and no block idles holding data while a
// group is still being loaded (the resident path's cost at large groups). The second read of an
// item comes about lag * 16 KB of traffic after the first: the plan keeps that inside L2.
//
// Why this cannot deadlock, on any device and beside any other work: a block waits only for groups
// whose items all have smaller tickets (lag >= blocks_per_group), i.e. for blocks that have already
// started. The waiting block with the smallest ticket therefore waits on blocks that do not wait,
// which publish in finite time.
#include <cstdlib>

#include "rocm_sd/device.h"
#include "rocm_sd/group_norm_impl.h"

namespace rsd {
namespace gn {
namespace {

constexpr int kThreads = kChunkThreads;
constexpr int64_t kLagBytes = int64_t(16) << 20;  // traffic between an item's two reads: inside L2

// counters[0]: next ticket; counters[1 + ng]: blocks of group ng that have published their partials.
// Zeroed by the launcher before every launch (a memset node under graph capture).
template <class T, class P, int VEC, bool SILU, int BYTES>
__global__ void __launch_bounds__(kThreads)
    group_norm_pipelined_nchw(const T* __restrict__ x, T* __restrict__ y, const P* __restrict__ gamma,
                              const P* __restrict__ beta, uint32_t L, FastDiv hw, int cg, int groups,
                              uint32_t blocks_per_group, uint32_t items, uint32_t lag, float eps,
                              WelfordStats* __restrict__ partials, unsigned* __restrict__ counters, bool streaming) {
  __shared__ float scratch[kReduceScratchFloats];
  __shared__ unsigned ticket_shared;
  if (threadIdx.x == 0) ticket_shared = atomicAdd(&counters[0], 1u);
  __syncthreads();
  const uint32_t ticket = ticket_shared;
  const bool has_stats = ticket < items;
  const bool has_output = ticket >= lag && ticket - lag < items;
  const uint32_t stats_group = ticket / blocks_per_group;
  const uint32_t out_item = ticket - lag, out_group = out_item / blocks_per_group;

  RegisterChunk<T, VEC, BYTES> in, out;
  if (has_stats) in.load(x + int64_t(stats_group) * L, ticket % blocks_per_group, L);
  if (has_output) out.load(x + int64_t(out_group) * L, out_item % blocks_per_group, L);

  float2 mean_rstd = make_float2(0.f, 0.f);
  if (has_output) {
    if (threadIdx.x == 0 && !wait_at_least(&counters[1 + out_group], blocks_per_group)) trap();
    __syncthreads();
    const WelfordStats s = merge_partials(partials + int64_t(out_group) * blocks_per_group, blocks_per_group, scratch);
    mean_rstd = mean_rstd_of(s, eps);
  }
  if (has_stats) {
    const uint32_t first = (ticket % blocks_per_group) * uint32_t(RegisterChunk<T, VEC, BYTES>::kElems);
    const float shift = to_float(x[int64_t(stats_group) * L + first]);  // one value of the chunk, for all threads
    const WelfordStats s = block_sum(in.sums(L, shift), scratch).stats();
    if (threadIdx.x == 0) {
      partials[ticket] = s;  // items are numbered group after group: partial `ticket` of the array
      arrive_release(&counters[1 + stats_group]);
    }
  }
  if (has_output) {
    out.template store<SILU>(y + int64_t(out_group) * L, L, hw, int(out_group % groups) * cg, gamma, beta, mean_rstd,
                             streaming);
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
  const char* exp_bytes = getenv("RSD_EXP_BYTES");  // EXPERIMENT
  p.bytes = exp_bytes ? atoi(exp_bytes) : 64;
  const int64_t chunk = kChunkThreads * p.bytes / elem_bytes(a.dtype);
  p.blocks_per_group = ceil_div(L, chunk);
  // kLagBytes of items: far more than the blocks in flight at once, so an output block rarely finds
  // its group unready, and well inside L2. At least a group (deadlock freedom); at most all items
  // (a larger lag would only add blocks that do nothing).
  const int64_t items = a.n * a.groups * p.blocks_per_group;
  const char* exp_lag = getenv("RSD_EXP_LAG_MB");  // EXPERIMENT
  const int64_t lag_bytes = exp_lag ? (int64_t(atoi(exp_lag)) << 20) : kLagBytes;
  p.lag = std::max(p.blocks_per_group, std::min(items, lag_bytes / (kChunkThreads * p.bytes)));
  if (items + p.lag >= (int64_t(1) << 31)) return false;
  *plan = p;
  return true;
}

size_t pipelined_workspace_bytes(const GroupNormArgs& a, const PipelinedPlan& p) {
  return counter_bytes(a) + partial_bytes(a, p);
}

hipError_t pipelined_launch(const GroupNormArgs& a, const PipelinedPlan& p) {
  hipStream_t stream = static_cast<hipStream_t>(a.stream);
  char* ws = static_cast<char*>(a.workspace);
  auto* counters = reinterpret_cast<unsigned*>(ws);
  auto* partials = reinterpret_cast<WelfordStats*>(ws + counter_bytes(a));
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
          auto kernel = p.bytes == 128 ? group_norm_pipelined_nchw<T, P, VEC, decltype(silu_tag)::value, 128>
                                       : group_norm_pipelined_nchw<T, P, VEC, decltype(silu_tag)::value, 64>;
          kernel<<<items + uint32_t(p.lag), kThreads, 0, stream>>>(
              static_cast<const T*>(a.x), static_cast<T*>(a.y), static_cast<const P*>(a.gamma),
              static_cast<const P*>(a.beta), L, FastDiv(uint32_t(a.hw)), int(a.c / a.groups), a.groups,
              uint32_t(p.blocks_per_group), items, uint32_t(p.lag), a.eps, partials, counters, streaming);
        });
      });
    });
  });
  return hipGetLastError();
}

}  // namespace gn
}  // namespace rsd
