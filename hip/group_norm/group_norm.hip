// GroupNorm with optional fused SiLU, for NCHW-contiguous and NHWC (channels_last) tensors:
//
//   y = act((x - mean[n,g]) * rstd[n,g] * gamma[c] + beta[c]),  act = SiLU or identity
//
// Statistics in fp32 (shifted sums within a block, Chan's formula across blocks). Two paths
// (rocm_sd/group_norm/impl.h): NCHW groups and NHWC images of at most one block take a single launch
// (group_norm_resident.hip, group_norm_resident_nhwc.hip); everything else takes the three launches of
// group_norm_split.hip (two reads of x, the second partly from L2) unless the tuner chose the resident
// path, which also exchanges statistics between blocks within its one launch. See choose() below and bench/notes/group_norm.md.
// Why split groups over blocks at all: torch's GroupNorm runs one block per (n, g) for its statistics,
// 64 blocks for an SD batch of 2 and 32 for the VAE at batch 1, far too few to fill a GPU.
#include "rocm_sd/device.h"
#include "rocm_sd/group_norm/impl.h"

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

struct Choice {
  GroupNormPath path = GroupNormPath::split;
  gn::ResidentPlan resident;
};

// The path for these arguments, or an error when a forced path cannot take them.
// automatic: resident when no exchange between blocks is needed (an NCHW group or an NHWC image in one
// block: one launch, one pass), split otherwise. With an exchange the resident paths measured no faster
// than split at the SD shapes on H200, in either layout (bench/notes/group_norm.md); the tuner still
// measures them per shape (candidate rocm_sd:resident).
std::string choose(const GroupNormArgs& a, Choice* c) {
  const bool resident = a.path != GroupNormPath::split && gn::resident_plan(a, &c->resident);
  if (a.path == GroupNormPath::resident && !resident)
    return "the resident GroupNorm path cannot hold a group of this size and layout on this device";
  const bool one_block = a.layout == Layout::nchw ? c->resident.blocks_per_group == 1 : c->resident.blocks_per_image == 1;
  const bool wanted = a.path == GroupNormPath::resident || one_block;
  c->path = resident && wanted ? GroupNormPath::resident : GroupNormPath::split;
  return std::string();
}

}  // namespace

size_t group_norm_workspace_bytes(const GroupNormArgs& a) {
  DeviceGuard guard(a.device);  // plans ask the device's occupancy
  Choice c;
  if (!choose(a, &c).empty()) return 0;
  return c.path == GroupNormPath::resident ? gn::resident_workspace_bytes(a, c.resident) : gn::split_workspace_bytes(a);
}

std::string group_norm_describe(const GroupNormArgs& a) {
  DeviceGuard guard(a.device);
  if (!guard.error().empty()) return "error: " + guard.error();
  Choice c;
  const std::string why = choose(a, &c);
  if (!why.empty()) return "error: " + why;
  if (c.path == GroupNormPath::resident && a.layout == Layout::nhwc)
    return "resident vec=" + std::to_string(c.resident.vec) +
           " blocks_per_image=" + std::to_string(c.resident.blocks_per_image);
  if (c.path == GroupNormPath::resident)
    return "resident vec=" + std::to_string(c.resident.vec) +
           " blocks_per_group=" + std::to_string(c.resident.blocks_per_group);
  return "split vec=" + std::to_string(gn::split_vec(a));
}

std::string group_norm_forward(const GroupNormArgs& a) {
  std::string why = group_norm_check(a);
  if (!why.empty()) return why;
  DeviceGuard guard(a.device);
  if (!guard.error().empty()) return guard.error();
  Choice c;
  why = choose(a, &c);
  if (!why.empty()) return why;
  const hipError_t err = c.path == GroupNormPath::resident ? gn::resident_launch(a, c.resident) : gn::split_launch(a);
  if (err != hipSuccess) return std::string("group_norm launch failed: ") + hipGetErrorString(err);
  return std::string();
}

}  // namespace rsd
