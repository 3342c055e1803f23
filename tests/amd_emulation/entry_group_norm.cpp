// C entry points of the emulated group_norm (see rsd_emu/entry_point.h): the automatic choice of
// hip/group_norm/group_norm.hip, and the resident (group_norm_resident*.hip) and split (group_norm_split.hip)
// paths forced through GroupNormArgs::path, as the GPU tests force them. Then checks of the emulation on what
// these kernels are built from (tests/amd_emulation_tests/test_emulation.py): the bf16 conversion of
// rocm_sd/common.h as the device pass compiles it, __shared__ poisoned for every block, a failing block ending the
// blocks that wait for it through rocm_sd/grid_sync.h, and the lane exchanges of RDNA's attention (v_permlanex16,
// v_perm_b32).
#include <cstdint>
#include <vector>

#include "rocm_sd/common.h"
#include "rocm_sd/grid_sync.h"
#include "rocm_sd/group_norm/api.h"
#include "rocm_sd/runtime.h"  // rsd_emu_device_l2_bytes
#include "rsd_emu/entry_point.h"

namespace {
rsd::GroupNormArgs args_of(const void* x, void* y, const void* gamma, const void* beta, int dtype, int param_dtype,
                           int layout, int64_t n, int64_t c, int64_t hw, int groups, float eps, int silu, int path,
                           const void* input_bias) {
  // Positional, in api.h's field order: x, y, gamma, beta, dtype, param_dtype, layout, n, c, hw, groups, eps, silu,
  // workspace (set by the caller), stream, device, path, input_bias.
  return rsd::GroupNormArgs{x, y, gamma, beta, rsd::DType(dtype), rsd::DType(param_dtype), rsd::Layout(layout),
                            n, c, hw, groups, eps, silu != 0, nullptr, nullptr, 0, rsd::GroupNormPath(path),
                            input_bias};
}

const char* launch_error() {
  const hipError_t e = hipGetLastError();
  return rsd_emu::answer(e == hipSuccess ? "" : hipGetErrorString(e));
}

__global__ void bf16_from_float(const float* x, uint16_t* y, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = rsd::from_float<rsd::bf16>(x[i]).bits;
}

// Lane 0 reads slot 0 before any lane of its block wrote it, then writes it; after the barrier the last lane reads
// lane 0's value and slot 1, which no lane writes. Per block: poison, its own index, poison.
__global__ void shared_poison_reads(uint32_t* seen) {
  __shared__ uint32_t slots[2];
  uint32_t* mine = seen + 3 * blockIdx.x;
  if (threadIdx.x == 0) {
    mine[0] = slots[0];
    slots[0] = blockIdx.x;
  }
  __syncthreads();
  if (threadIdx.x == blockDim.x - 1) {
    mine[1] = slots[0];
    mine[2] = slots[1];
  }
}

// Block 0 traps once every other block waits for a count it never gives (as the resident GroupNorm's blocks wait
// for each other's statistics); a waiting block that reaches grid_sync.h's bound says so in timed_out.
__global__ void wait_for_failed_block(unsigned* counters, unsigned* timed_out) {
  if (threadIdx.x == 0) {
    if (blockIdx.x == 0) {
      if (rsd::wait_at_least(&counters[0], gridDim.x - 1)) __builtin_trap();
    } else {
      rsd::arrive_release(&counters[0]);
      if (!rsd::wait_at_least(&counters[1], 1)) timed_out[blockIdx.x] = 1;
    }
  }
  __syncthreads();
}
// The lane exchanges the RDNA attention builds on (wave_mma.h): out[i] = v_permlanex16(in[i]) with the selects
// given, over whole waves; bytes[i] = v_perm_b32(s0[i], s1[i], sel[i]).
#if defined(__GFX11__) || defined(__GFX12__)
__global__ void permlanex16(const uint32_t* in, uint32_t* out, uint32_t sel_lo, uint32_t sel_hi) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  out[i] = __builtin_amdgcn_permlanex16(in[i], in[i], sel_lo, sel_hi, false, false);
}
#endif

__global__ void byte_perm(const uint32_t* s0, const uint32_t* s1, const uint32_t* sel, uint32_t* bytes, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) bytes[i] = __builtin_amdgcn_perm(s0[i], s1[i], sel[i]);
}
}  // namespace

extern "C" {

// x, y: (n, c, hw) in `layout` (0 NCHW, 1 NHWC); gamma, beta, input_bias may be null; path: 0 automatic,
// 1 resident, 2 split (rsd::GroupNormPath). The workspace is allocated here, filled with 0xff bytes: the
// kernels promise to need no initialisation of it.
const char* rsd_emu_group_norm(const void* x, void* y, const void* gamma, const void* beta, int dtype, int param_dtype,
                               int layout, int64_t n, int64_t c, int64_t hw, int groups, float eps, int silu, int path,
                               const void* input_bias) {
  rsd::GroupNormArgs a =
      args_of(x, y, gamma, beta, dtype, param_dtype, layout, n, c, hw, groups, eps, silu, path, input_bias);
  // 256-byte aligned, as a GPU allocation is (the launchers place their counters and partials at 256-byte offsets).
  std::vector<unsigned char> workspace(rsd::group_norm_workspace_bytes(a) + 256, 0xff);
  a.workspace = workspace.data() + (256 - reinterpret_cast<uintptr_t>(workspace.data()) % 256) % 256;
  return rsd_emu::answer(rsd::group_norm_forward(a));
}

// The path and launch shape the same arguments get ("resident vec=4 blocks_per_group=3"), as the GPU tests
// ask through rocm_sd.ops.group_norm.describe.
const char* rsd_emu_group_norm_describe(const void* x, void* y, int dtype, int layout, int64_t n, int64_t c,
                                        int64_t hw, int groups, int path) {
  const rsd::GroupNormArgs a =
      args_of(x, y, nullptr, nullptr, dtype, dtype, layout, n, c, hw, groups, 1e-5f, 0, path, nullptr);
  return rsd_emu::answer(rsd::group_norm_describe(a));
}

// The emulated device's L2 size, from the runtime the launchers ask: NCHW tensors larger than it take the split
// path's plane-wise apply.
int rsd_emu_device_l2_bytes() {
  rsd::DeviceInfo info{};
  return rsd::device_info(0, &info).empty() ? info.l2_bytes : -1;
}

// y[i]: the bits of from_float<bf16>(x[i]), n elements.
const char* rsd_emu_bf16_from_float(const float* x, uint16_t* y, int64_t n) {
  bf16_from_float<<<unsigned((n + 255) / 256), 256, 0, nullptr>>>(x, y, n);
  return launch_error();
}

// seen: 3 words per block, `blocks` blocks of 64 lanes (shared_poison_reads).
const char* rsd_emu_shared_poison_reads(uint32_t* seen, int blocks) {
  shared_poison_reads<<<unsigned(blocks), 64, 0, nullptr>>>(seen);
  return launch_error();
}

// counters: 2 words, zero; timed_out: `blocks` words, zero; at most the emulated device's 8 resident blocks.
const char* rsd_emu_wait_for_failed_block(unsigned* counters, unsigned* timed_out, int blocks) {
  wait_for_failed_block<<<unsigned(blocks), 64, 0, nullptr>>>(counters, timed_out);
  return launch_error();
}

// in, out: `waves` whole waves of words; gfx9 has no v_permlanex16 (an error says so).
const char* rsd_emu_permlanex16(const uint32_t* in, uint32_t* out, int waves, uint32_t sel_lo, uint32_t sel_hi) {
#if defined(__GFX11__) || defined(__GFX12__)
  permlanex16<<<unsigned(waves), RSD_WAVE, 0, nullptr>>>(in, out, sel_lo, sel_hi);
  return launch_error();
#else
  (void)in, (void)out, (void)waves, (void)sel_lo, (void)sel_hi;
  return rsd_emu::answer("no v_permlanex16 on " RSD_EMU_ARCH);
#endif
}

const char* rsd_emu_byte_perm(const uint32_t* s0, const uint32_t* s1, const uint32_t* sel, uint32_t* bytes, int n) {
  byte_perm<<<unsigned((n + 63) / 64), 64, 0, nullptr>>>(s0, s1, sel, bytes, n);
  return launch_error();
}

}  // extern "C"
