// C entry points of the emulated group_norm (see rsd_emu/entry_point.h): the automatic choice of
// hip/group_norm/group_norm.hip, and the resident (group_norm_resident*.hip) and split (group_norm_split.hip)
// paths forced through GroupNormArgs::path, as the GPU tests force them.
#include <cstdint>
#include <vector>

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

}  // extern "C"
