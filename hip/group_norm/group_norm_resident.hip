// GroupNorm(+SiLU), NCHW, in one launch: x is read once and y written once, the traffic of a copy.
//
// Group (n, g) is L = (C / groups) * HW contiguous elements, cut into blocks_per_group chunks of
// kThreads * kBytesPerThread bytes. Each block
//   1. takes a ticket (atomic counter) that names its (group, chunk), loads the chunk into registers
//      and reduces it to Welford partials (count, mean, M2);
//   2. publishes its partials, counts itself in on its group's arrival counter and waits until all
//      blocks of the group have arrived;
//   3. merges the group's partials (every block in the same order, so all get identical statistics),
//      normalises the chunk still held in registers and writes y.
// Groups of one block skip step 2 (no exchange, no counters).
//
// Why this cannot deadlock: a block only waits for blocks of its own group. Tickets are handed out in
// the order blocks start, so every group whose tickets were all handed out has all its blocks running
// or done, and completes; only the group holding the newest tickets can be waiting on blocks not yet
// started, and those start as soon as any resident block finishes. That needs room for one group on
// the device: the plan requires blocks_per_group <= half of the resident blocks (the other half is
// margin for kernels running beside this one). Tickets instead of blockIdx make this independent of
// the order in which the hardware dispatches blocks. If a wait still exceeds seconds (a device
// partitioned below what the runtime reports), the kernel traps: an error, not a hang.
#include "rocm_sd/grid_sync.h"
#include "rocm_sd/group_norm/impl.h"
#if !RSD_RTC  // host side; runtime compilation (rocm_sd/jit/) takes the kernels only (rocm_sd/rtc.h)
#include "rocm_sd/device.h"
#endif

namespace rsd {
namespace gn {
namespace {

constexpr int kThreads = kChunkThreads;
constexpr int kMinFreeFraction = 2;  // blocks_per_group <= resident blocks / 2

// counters[0]: next ticket; counters[1 + ng]: blocks of group ng that have published their partials.
// Zeroed by the launcher before every launch (a memset node under graph capture).
template <class T, class P, int VEC, bool SILU>
__global__ void __launch_bounds__(kThreads)
    group_norm_resident_nchw(const T* __restrict__ x, T* __restrict__ y, const P* __restrict__ gamma,
                             const P* __restrict__ beta, uint32_t L, FastDiv hw, int cg, int groups,
                             uint32_t blocks_per_group, float eps, const T* __restrict__ input_bias,
                             WelfordStats* __restrict__ partials, unsigned* __restrict__ counters, bool streaming) {
  __shared__ float scratch[kReduceScratchFloats];
  __shared__ unsigned ticket_shared;
  const bool exchange = blocks_per_group > 1;
  unsigned ticket = blockIdx.x;
  if (exchange) {
    if (threadIdx.x == 0) ticket_shared = atomicAdd(&counters[0], 1u);
    __syncthreads();
    ticket = ticket_shared;
  }
  const int64_t ng = ticket / blocks_per_group;
  const uint32_t part = ticket % blocks_per_group;
  RegisterChunk<T, VEC> chunk;
  const T* xg = x + ng * L;
  chunk.load(xg, part, L);
  const int channel0 = int(ng % groups) * cg;
  const T* bias_row = input_bias ? input_bias + (ng / groups) * int64_t(groups) * cg : nullptr;
  const float shift = to_float(xg[part * uint32_t(kChunkElems<T>)]);  // one value of the chunk (16-bit types)
  WelfordStats s = block_stats<T>(chunk.sums(L, shift, hw, channel0, bias_row), scratch);

  if (exchange) {
    WelfordStats* group_partials = partials + ng * blocks_per_group;
    unsigned* arrived = counters + 1 + ng;
    if (threadIdx.x == 0) {
      group_partials[part] = s;
      arrive_release(arrived);
      if (!wait_at_least(arrived, blocks_per_group)) trap();
    }
    __syncthreads();
    s = merge_partials(group_partials, blocks_per_group, scratch);
  }
  chunk.template store<SILU>(y + ng * L, L, hw, channel0, gamma, beta, bias_row, mean_rstd_of(s, eps), streaming);
}

#if !RSD_RTC  // the plan and launcher: mirrored by rocm_sd/jit/group_norm_plan.py
template <class T, class P, int VEC, bool SILU>
constexpr auto kernel_of() {
  return &group_norm_resident_nchw<T, P, VEC, SILU>;
}

// Blocks of the least occupant instance for this dtype and width that fit on the device at once.
template <class T, int VEC>
int64_t resident_capacity(int device) {
  static int64_t cached[64] = {};
  if (device < 0 || device >= 64) return 0;
  if (cached[device] == 0)  // 0 (unknown) is asked again next time
    cached[device] = least_resident_blocks(device, kThreads, kernel_of<T, T, VEC, false>(), kernel_of<T, T, VEC, true>(),
                                           kernel_of<T, float, VEC, false>(), kernel_of<T, float, VEC, true>());
  return cached[device];
}

size_t counter_bytes(const GroupNormArgs& a) { return round_up(size_t(1 + a.n * a.groups) * sizeof(unsigned), 256); }
#endif  // !RSD_RTC

}  // namespace

#if !RSD_RTC

bool resident_plan(const GroupNormArgs& a, ResidentPlan* plan) {
  if (a.layout != Layout::nchw) return resident_nhwc_plan(a, plan);
  ResidentPlan p;
  p.vec = pick_vec(a);
  const int64_t L = (a.c / a.groups) * a.hw;
  int64_t capacity = 0;
  with_dtype(a.dtype, [&](auto ttag) {
    using T = typename decltype(ttag)::type;
    p.blocks_per_group = ceil_div(L, kChunkElems<T>);
    with_vec<T>(p.vec, [&](auto vtag) { capacity = resident_capacity<T, decltype(vtag)::value>(a.device); });
  });
  if (p.blocks_per_group > 1 && p.blocks_per_group > capacity / kMinFreeFraction) return false;
  if (a.n * a.groups * p.blocks_per_group > (int64_t(1) << 31)) return false;  // grid x and tickets
  *plan = p;
  return true;
}

size_t resident_workspace_bytes(const GroupNormArgs& a, const ResidentPlan& p) {
  if (a.layout != Layout::nchw) return resident_nhwc_workspace_bytes(a, p);
  if (p.blocks_per_group == 1) return 0;
  return counter_bytes(a) + size_t(a.n * a.groups * p.blocks_per_group) * sizeof(WelfordStats);
}

hipError_t resident_launch(const GroupNormArgs& a, const ResidentPlan& p) {
  if (a.layout != Layout::nchw) return resident_nhwc_launch(a, p);
  hipStream_t stream = static_cast<hipStream_t>(a.stream);
  auto* counters = static_cast<unsigned*>(a.workspace);
  auto* partials = reinterpret_cast<WelfordStats*>(static_cast<char*>(a.workspace) + counter_bytes(a));
  if (p.blocks_per_group > 1) {
    const hipError_t err = hipMemsetAsync(counters, 0, counter_bytes(a), stream);
    if (err != hipSuccess) return err;
  }
  const uint32_t L = uint32_t((a.c / a.groups) * a.hw);
  const unsigned blocks = unsigned(a.n * a.groups * p.blocks_per_group);
  const bool streaming = streaming_output(a);
  with_dtype(a.dtype, [&](auto ttag) {
    using T = typename decltype(ttag)::type;
    with_vec<T>(p.vec, [&](auto vtag) {
      constexpr int VEC = decltype(vtag)::value;
      with_params<T>(a.param_dtype, [&](auto ptag) {
        using P = typename decltype(ptag)::type;
        with_bool(a.silu, [&](auto silu_tag) {
          kernel_of<T, P, VEC, decltype(silu_tag)::value>()<<<blocks, kThreads, 0, stream>>>(
              static_cast<const T*>(a.x), static_cast<T*>(a.y), static_cast<const P*>(a.gamma),
              static_cast<const P*>(a.beta), L, FastDiv(uint32_t(a.hw)), int(a.c / a.groups), a.groups,
              uint32_t(p.blocks_per_group), a.eps, static_cast<const T*>(a.input_bias), partials, counters, streaming);
        });
      });
    });
  });
  return hipGetLastError();
}
#endif  // !RSD_RTC

}  // namespace gn
}  // namespace rsd
