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

struct Choice {
  GroupNormPath path = GroupNormPath::split;
  gn::ResidentPlan resident;
  gn::PipelinedPlan pipelined;
};

// The path for these arguments, or an error when a forced path cannot take them.
// automatic: NCHW groups of one block: resident (one pass, no exchange); other NCHW: pipelined;
// channels_last: split.
std::string choose(const GroupNormArgs& a, Choice* c) {
  switch (a.path) {
    case GroupNormPath::resident:
      if (!gn::resident_plan(a, &c->resident)) return "the resident GroupNorm path cannot hold a group of this size and layout on this device";
      c->path = GroupNormPath::resident;
      return std::string();
    case GroupNormPath::pipelined:
      if (!gn::pipelined_plan(a, &c->pipelined)) return "the pipelined GroupNorm path takes NCHW inputs only";
      c->path = GroupNormPath::pipelined;
      return std::string();
    case GroupNormPath::split:
      c->path = GroupNormPath::split;
      return std::string();
    default:
      break;
  }
  if (gn::resident_plan(a, &c->resident) && c->resident.blocks_per_group == 1)
    c->path = GroupNormPath::resident;
  else if (gn::pipelined_plan(a, &c->pipelined))
    c->path = GroupNormPath::pipelined;
  else
    c->path = GroupNormPath::split;
  return std::string();
}

}  // namespace

size_t group_norm_workspace_bytes(const GroupNormArgs& a) {
  DeviceGuard guard(a.device);  // plans ask the device's occupancy
  Choice c;
  if (!choose(a, &c).empty()) return 0;
  switch (c.path) {
    case GroupNormPath::resident: return gn::resident_workspace_bytes(a, c.resident);
    case GroupNormPath::pipelined: return gn::pipelined_workspace_bytes(a, c.pipelined);
    default: return gn::split_workspace_bytes(a);
  }
}

std::string group_norm_describe(const GroupNormArgs& a) {
  DeviceGuard guard(a.device);
  if (!guard.error().empty()) return "error: " + guard.error();
  Choice c;
  const std::string why = choose(a, &c);
  if (!why.empty()) return "error: " + why;
  switch (c.path) {
    case GroupNormPath::resident:
      return "resident vec=" + std::to_string(c.resident.vec) +
             " blocks_per_group=" + std::to_string(c.resident.blocks_per_group);
    case GroupNormPath::pipelined:
      return "pipelined vec=" + std::to_string(c.pipelined.vec) + " blocks_per_group=" +
             std::to_string(c.pipelined.blocks_per_group) + " lag=" + std::to_string(c.pipelined.lag);
    default:
      return "split vec=" + std::to_string(gn::pick_vec(a));
  }
}

std::string group_norm_forward(const GroupNormArgs& a) {
  std::string why = group_norm_check(a);
  if (!why.empty()) return why;
  DeviceGuard guard(a.device);
  if (!guard.error().empty()) return guard.error();
  Choice c;
  why = choose(a, &c);
  if (!why.empty()) return why;
  hipError_t err;
  switch (c.path) {
    case GroupNormPath::resident: err = gn::resident_launch(a, c.resident); break;
    case GroupNormPath::pipelined: err = gn::pipelined_launch(a, c.pipelined); break;
    default: err = gn::split_launch(a); break;
  }
  if (err != hipSuccess) return std::string("group_norm launch failed: ") + hipGetErrorString(err);
  return std::string();
}

}  // namespace rsd
