// GroupNorm(+SiLU), NHWC (channels_last), in one launch: x is read once and y written once.
//
// In NHWC every pixel holds channels of every group, so a group's statistics span the whole image:
// the exchange is per image, not per group as in the NCHW resident kernel. Image n is hw rows of C
// elements, cut into blocks_per_image chunks of rows_per_block whole rows. Each block
//   1. takes a ticket (atomic counter) naming its (image, chunk) and loads the chunk into registers:
//      thread (row, col) holds channels [col*VEC, col*VEC + VEC) of rows row, row + rows_per_iter, ...,
//      so all its elements lie in one group (VEC divides C / groups);
//   2. reduces the chunk to one Welford partial per group and publishes them;
//   3. counts itself in on the image's arrival counter and waits until every block of the image has;
//   4. merges the partials of the groups it owns (group g belongs to chunk g mod blocks_per_image): all
//      its threads load the group's partials at once and reduce them in fp64 in a fixed order, so the
//      result is the same on every run whichever block arrives last; publishes mean and 1/sqrt(var + eps)
//      and counts itself in on the image's ready counter;
//   5. waits until every owner has published, normalises the chunk it still holds and writes y.
// The merges are spread over the image's blocks because their latency is on every block's critical path:
// one block merging all groups measured 15-40 us at SD shapes (a chain of L2 round trips per group),
// against ~8-16 us for the whole split path.
// Deadlock freedom is the NCHW resident kernel's argument (group_norm_resident.hip) with "image" for
// "group": tickets are handed out in start order, so only the image holding the newest tickets can
// wait on blocks that have not started, and the plan keeps blocks_per_image <= half of the resident
// blocks. A wait past seconds traps instead of hanging.
//
// Built for the UNet's small images (0.3-5 MB), where the three launches of the split path cost more than
// the data; measured on H200 it is on par with split there (the two grid-wide waits cost what the launches
// did), faster at some shapes and slower at others, so it runs where the tuner measured it faster, or
// when an image fits one block (no exchange): bench/notes/group_norm.md.
#include "rocm_sd/grid_sync.h"
#include "rocm_sd/group_norm/impl.h"
#if !RSD_RTC  // host side; runtime compilation (rocm_sd/jit/) takes the kernels only (rocm_sd/rtc.h)
#include "rocm_sd/device.h"
#endif

namespace rsd {
namespace gn {
namespace {

constexpr int kMaxThreads = 512;       // threads_per_row = C / vec <= kMaxThreads
constexpr int kTargetThreads = 256;    // rows_per_iter rows of C / vec threads, up to this many
constexpr int kBytesPerThread = 64;    // held in registers: 16 loads of 4 bytes or 4 of 16 bytes
constexpr int kMinFreeFraction = 2;    // blocks_per_image <= resident blocks / 2

template <class T, int VEC>
constexpr int kLoads = kBytesPerThread / (VEC * int(sizeof(T)));

// Workspace: [ticket, arrived[n], ready[n]] (zeroed by the launcher before every launch, a memset node
// under graph capture), then the (image, chunk, group) Welford partials, then (image, group) mean/rstd.
struct Workspace {
  unsigned* ticket;
  unsigned* arrived;
  unsigned* ready;
  WelfordStats* partials;
  float2* mean_rstd;
};

#if !RSD_RTC  // workspace layout: mirrored by rocm_sd/jit/group_norm_plan.py
size_t counter_bytes(const GroupNormArgs& a) { return round_up(size_t(1 + 2 * a.n) * sizeof(unsigned), 256); }
size_t partial_bytes(const GroupNormArgs& a, const ResidentPlan& p) {
  return round_up(size_t(a.n * p.blocks_per_image * a.groups) * sizeof(WelfordStats), 256);
}

Workspace workspace_of(const GroupNormArgs& a, const ResidentPlan& p) {
  char* base = static_cast<char*>(a.workspace);
  auto* counters = reinterpret_cast<unsigned*>(base);
  return Workspace{counters, counters + 1, counters + 1 + a.n, reinterpret_cast<WelfordStats*>(base + counter_bytes(a)),
                   reinterpret_cast<float2*>(base + counter_bytes(a) + partial_bytes(a, p))};
}
#endif  // !RSD_RTC

template <class T, class P, int VEC, bool SILU>
__global__ void __launch_bounds__(kMaxThreads, 1)  // ", 1": without it nvcc 13 caps a 512-thread kernel at 64 registers and spills
    group_norm_resident_nhwc(const T* __restrict__ x, T* __restrict__ y, const P* __restrict__ gamma,
                             const P* __restrict__ beta, int64_t hw, int c, int groups, int threads_per_row,
                             int rows_per_iter, int rows_per_block, uint32_t blocks_per_image, bool tickets,
                             float eps, const T* __restrict__ input_bias, Workspace ws) {
  constexpr int kU = kLoads<T, VEC>;
  __shared__ WelfordStats per_thread[kMaxThreads];
  __shared__ double merge_scratch[kMergeScratchDoubles];
  __shared__ unsigned ticket_shared;
  const bool exchange = blocks_per_image > 1;
  unsigned ticket = blockIdx.x;
  if (tickets) {
    if (threadIdx.x == 0) ticket_shared = atomicAdd(ws.ticket, 1u);
    __syncthreads();
    ticket = ticket_shared;
  }
  const int64_t n = ticket / blocks_per_image;
  const uint32_t part = ticket % blocks_per_image;
  const int col = threadIdx.x % threads_per_row, row = threadIdx.x / threads_per_row;
  const int c0 = col * VEC;
  const int64_t chunk_begin = int64_t(part) * rows_per_block;
  const int64_t chunk_end = chunk_begin + rows_per_block < hw ? chunk_begin + rows_per_block : hw;
  const int64_t first_row = chunk_begin + row;
  // Rows this thread holds (first_row, + rows_per_iter, ...), and their offsets in 32 bits (an image has
  // fewer than 2^31 elements, checked by the plan): 64-bit addresses kept alive from the loads to the
  // stores would double the registers a thread needs.
  const int rows_held = first_row < chunk_end ? int((chunk_end - first_row + rows_per_iter - 1) / rows_per_iter) : 0;
  const uint32_t row_step = uint32_t(rows_per_iter) * uint32_t(c);
  const int64_t offset = n * hw * c + first_row * c + c0;
  float bias[VEC];  // this thread's channels are fixed: their input biases are loaded once
#pragma unroll
  for (int k = 0; k < VEC; ++k) bias[k] = input_bias_of(input_bias ? input_bias + n * c : nullptr, c0 + k);
  float weight[VEC], shift_out[VEC];  // gamma and beta, loaded before the exchange, not after it
#pragma unroll
  for (int k = 0; k < VEC; ++k) {
    weight[k] = gamma ? to_float(gamma[c0 + k]) : 1.f;
    shift_out[k] = beta ? to_float(beta[c0 + k]) : 0.f;
  }

  Vec<T, VEC> v[kU];
  const T* xr = x + offset;
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    if (u < rows_held) v[u] = load_vec<T, VEC>(xr + u * row_step);
  }
  ShiftedSums acc;
  acc.shift = rows_held > 0 ? to_float(v[0].v[0]) + bias[0] : 0.f;
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    if (u < rows_held) acc.add(v[u], bias);
  }

  // Per group, one thread merges the (rows_per_iter x cols_per_group) thread results of the chunk.
  per_thread[threadIdx.x] = acc.stats();
  __syncthreads();
  WelfordStats* image_partials = ws.partials + n * int64_t(blocks_per_image) * groups;
  const int cols_per_group = c / groups / VEC;
  for (int g = threadIdx.x; g < groups; g += blockDim.x) {
    WelfordStats s = {0.f, 0.f, 0.f};
#pragma unroll 1
    for (int rr = 0; rr < rows_per_iter; ++rr)
#pragma unroll 1
      for (int k = 0; k < cols_per_group; ++k) s = welford_merge(s, per_thread[rr * threads_per_row + g * cols_per_group + k]);
    image_partials[int64_t(part) * groups + g] = s;
  }
  __syncthreads();
  // Publishing: the block's writes are ordered before thread 0's by the barrier, and before the counter by
  // thread 0's device-scope fence (the pattern of cooperative groups' grid barrier).
  if (exchange) {
    if (threadIdx.x == 0) {
      __threadfence();
      arrive_release(&ws.arrived[n]);
      if (!wait_at_least(&ws.arrived[n], blocks_per_image)) trap();
    }
    __syncthreads();
  }
  float2* image_mean_rstd = ws.mean_rstd + n * groups;
  for (int g = int(part); g < groups; g += int(blocks_per_image)) {
    const float2 mr = merge_partials_fp64(image_partials + g, blocks_per_image, groups, eps, merge_scratch);
    if (threadIdx.x == 0) image_mean_rstd[g] = mr;
  }
  if (exchange) {
    const unsigned owners = blocks_per_image < uint32_t(groups) ? blocks_per_image : uint32_t(groups);
    if (threadIdx.x == 0) {
      if (part < owners) {
        __threadfence();
        arrive_release(&ws.ready[n]);
      }
      if (!wait_at_least(&ws.ready[n], owners)) trap();
    }
  }
  __syncthreads();

  const int g = c0 / (c / groups);
  const float2 mr = make_float2(load_coherent(&image_mean_rstd[g].x), load_coherent(&image_mean_rstd[g].y));
  float a[VEC], b[VEC];
#pragma unroll
  for (int k = 0; k < VEC; ++k) scale_shift_of(weight[k], shift_out[k], mr, a[k], b[k], bias[k]);
  T* yr = y + offset;
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    if (u < rows_held) store_vec(yr + u * row_step, normalize<T, VEC, SILU>(v[u], a, b), false);
  }
}

#if !RSD_RTC  // the plan and launcher: mirrored by rocm_sd/jit/group_norm_plan.py
template <class T, class P, int VEC, bool SILU>
constexpr auto kernel_of() {
  return &group_norm_resident_nhwc<T, P, VEC, SILU>;
}

// Blocks of `threads` threads of the least occupant instance for this dtype and width that fit on the
// device at once; 0 when the runtime cannot tell (the resident path is then refused, never guessed).
template <class T, int VEC>
int64_t resident_capacity(int device, int threads) {
  // Occupancy changes with the number of 32-thread warps (or 64-thread waves, a whole number of those) a
  // block holds, so the cache is per (device, ceil(threads / 32)).
  constexpr int kSteps = kMaxThreads / 32 + 1;
  static int64_t cached[64 * kSteps] = {};
  if (device < 0 || device >= 64 || threads <= 0 || threads > kMaxThreads) return 0;
  int64_t& slot = cached[device * kSteps + (threads + 31) / 32];
  if (slot == 0)  // 0 (unknown) is asked again next time
    slot = least_resident_blocks(device, threads, kernel_of<T, T, VEC, false>(), kernel_of<T, T, VEC, true>(),
                                 kernel_of<T, float, VEC, false>(), kernel_of<T, float, VEC, true>());
  return slot;
}
#endif  // !RSD_RTC

}  // namespace

#if !RSD_RTC

bool resident_nhwc_plan(const GroupNormArgs& a, ResidentPlan* plan) {
  if (a.layout != Layout::nhwc) return false;
  ResidentPlan p;
  p.vec = pick_vec(a);
  p.threads_per_row = int(a.c / p.vec);
  if (p.threads_per_row > kMaxThreads) return false;
  p.rows_per_iter = std::max(1, kTargetThreads / p.threads_per_row);
  p.threads = p.threads_per_row * p.rows_per_iter;  // >= 129 when threads_per_row <= 256, else > 256
  int64_t capacity = 0;
  with_dtype(a.dtype, [&](auto ttag) {
    using T = typename decltype(ttag)::type;
    with_vec<T>(p.vec, [&](auto vtag) {
      constexpr int VEC = decltype(vtag)::value;
      p.rows_per_block = int64_t(p.rows_per_iter) * kLoads<T, VEC>;
      capacity = resident_capacity<T, VEC>(a.device, p.threads);
    });
  });
  // Small images of several blocks: fewer rows per block, so that there are at least as many blocks as groups
  // and each block merges at most one group (the merges are on every block's critical path). An image that
  // fits one block stays in one: no exchange at all.
  if (a.hw > p.rows_per_block && a.hw / p.rows_per_block < a.groups) p.rows_per_block = std::max<int64_t>(1, std::min(p.rows_per_block, a.hw / a.groups));
  p.blocks_per_image = ceil_div(a.hw, p.rows_per_block);
  if (p.blocks_per_image > 1 && p.blocks_per_image > capacity / kMinFreeFraction) return false;
  // A grid within the same margin needs no tickets: all its blocks fit beside another such kernel, so every
  // block becomes resident whatever order the hardware starts them in, and blockIdx can name the chunk.
  p.tickets = p.blocks_per_image > 1 && a.n * p.blocks_per_image > capacity / kMinFreeFraction;
  if (a.n * p.blocks_per_image > (int64_t(1) << 31)) return false;  // grid x and tickets
  if (a.hw * a.c >= (int64_t(1) << 31)) return false;                 // 32-bit offsets within an image
  *plan = p;
  return true;
}

size_t resident_nhwc_workspace_bytes(const GroupNormArgs& a, const ResidentPlan& p) {
  return counter_bytes(a) + partial_bytes(a, p) + size_t(a.n * a.groups) * sizeof(float2);
}

hipError_t resident_nhwc_launch(const GroupNormArgs& a, const ResidentPlan& p) {
  hipStream_t stream = static_cast<hipStream_t>(a.stream);
  const Workspace ws = workspace_of(a, p);
  if (p.blocks_per_image > 1) {
    const hipError_t err = hipMemsetAsync(a.workspace, 0, counter_bytes(a), stream);
    if (err != hipSuccess) return err;
  }
  const unsigned blocks = unsigned(a.n * p.blocks_per_image);
  with_dtype(a.dtype, [&](auto ttag) {
    using T = typename decltype(ttag)::type;
    with_vec<T>(p.vec, [&](auto vtag) {
      constexpr int VEC = decltype(vtag)::value;
      with_params<T>(a.param_dtype, [&](auto ptag) {
        using P = typename decltype(ptag)::type;
        with_bool(a.silu, [&](auto silu_tag) {
          kernel_of<T, P, VEC, decltype(silu_tag)::value>()<<<blocks, p.threads, 0, stream>>>(
              static_cast<const T*>(a.x), static_cast<T*>(a.y), static_cast<const P*>(a.gamma),
              static_cast<const P*>(a.beta), a.hw, int(a.c), a.groups, p.threads_per_row, p.rows_per_iter,
              int(p.rows_per_block), uint32_t(p.blocks_per_image), p.tickets, a.eps,
              static_cast<const T*>(a.input_bias), ws);
        });
      });
    });
  });
  return hipGetLastError();
}
#endif  // !RSD_RTC

}  // namespace gn
}  // namespace rsd
