// GroupNorm with optional fused SiLU, for NCHW-contiguous and NHWC (channels_last) tensors:
//
//   y = act((x - mean[n,g]) * rstd[n,g] * gamma[c] + beta[c]),  act = SiLU or identity
//
// Statistics in fp32 (per-thread shifted sums, merged with Chan's formula). Two paths
// (group_norm_impl.h): NCHW groups whose blocks can all be resident at once take the single-pass
// kernel of group_norm_resident.hip (one read of x, one write of y); larger groups and channels_last
// inputs take the three launches of group_norm_split.hip (two reads of x, the second mostly from L2).
// Why the split in blocks at all: torch's GroupNorm runs one block per (n, g) for its statistics,
// 64 blocks for an SD batch of 2 and 32 for the VAE at batch 1, far too few to fill a GPU.
#include "rocm_sd/device.h"
#include "rocm_sd/group_norm_impl.h"

namespace rsd {

std::string group_norm_check(const GroupNormArgs& a) {
  using namespace gn;
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

namespace {

// Whether the single-pass path runs (and its plan), or an error when a forced path cannot.
std::string choose_path(const GroupNormArgs& a, bool* resident, gn::ResidentPlan* plan) {
  *resident = a.path != GroupNormPath::split && gn::resident_plan(a, plan);
  if (a.path == GroupNormPath::resident && !*resident)
    return "the resident GroupNorm path cannot hold a group of this size and layout on this device";
  return std::string();
}

}  // namespace

size_t group_norm_workspace_bytes(const GroupNormArgs& a) {
  DeviceGuard guard(a.device);  // the plan asks the device's occupancy
  bool resident = false;
  gn::ResidentPlan plan;
  choose_path(a, &resident, &plan);
  return resident ? gn::resident_workspace_bytes(a, plan) : gn::split_workspace_bytes(a);
}

std::string group_norm_describe(const GroupNormArgs& a) {
  DeviceGuard guard(a.device);
  if (!guard.error().empty()) return "error: " + guard.error();
  bool resident = false;
  gn::ResidentPlan plan;
  const std::string why = choose_path(a, &resident, &plan);
  if (!why.empty()) return "error: " + why;
  if (!resident) return "split vec=" + std::to_string(gn::pick_vec(a));
  return "resident vec=" + std::to_string(plan.vec) + " blocks_per_group=" + std::to_string(plan.blocks_per_group);
}

std::string group_norm_forward(const GroupNormArgs& a) {
  std::string why = group_norm_check(a);
  if (!why.empty()) return why;
  DeviceGuard guard(a.device);
  if (!guard.error().empty()) return guard.error();
  bool resident = false;
  gn::ResidentPlan plan;
  why = choose_path(a, &resident, &plan);
  if (!why.empty()) return why;
  const hipError_t err = resident ? gn::resident_launch(a, plan) : gn::split_launch(a);
  if (err != hipSuccess) return std::string("group_norm launch failed: ") + hipGetErrorString(err);
  return std::string();
}

}  // namespace rsd
