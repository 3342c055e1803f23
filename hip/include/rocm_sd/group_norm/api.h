// The host interface of hip/group_norm/ (conventions: rocm_sd/api.h): GroupNorm with optional fused SiLU,
// y = act((x - mean_g) * rstd_g * gamma + beta)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "rocm_sd/api.h"

namespace rsd {

// Which GroupNorm kernels run (group_norm.hip): automatic picks; the others are for tests and benchmarks.
enum class GroupNormPath : int { automatic = 0, resident = 1, split = 2 };

struct GroupNormArgs {
  const void* x;      // (N, C, *spatial): NCHW contiguous, or NHWC (channels_last) when layout == nhwc
  void* y;            // same shape, layout and dtype as x
  const void* gamma;  // (C,) or nullptr
  const void* beta;   // (C,) or nullptr
  DType dtype;        // of x and y
  DType param_dtype;  // of gamma and beta: dtype or f32
  Layout layout;
  int64_t n, c, hw;   // hw = product of the spatial sizes
  int groups;
  float eps;
  bool silu;
  void* workspace;    // group_norm_workspace_bytes(args) bytes, no initialisation needed
  void* stream;       // hipStream_t / cudaStream_t
  int device;
  GroupNormPath path = GroupNormPath::automatic;
  // (N, C) contiguous, dtype of x, or nullptr: added to x per (image, channel) before normalising,
  // e.g. a conv bias plus ResnetBlock2D's time embedding.
  const void* input_bias = nullptr;
};

// Empty string if the kernel supports these arguments, else the first reason it does not.
std::string group_norm_check(const GroupNormArgs& a);
size_t group_norm_workspace_bytes(const GroupNormArgs& a);
// The path and launch shape these arguments get, e.g. "resident vec=8 blocks_per_group=128", or why
// a forced path cannot run ("error: ...").
std::string group_norm_describe(const GroupNormArgs& a);
// Enqueues the kernels on a.stream; empty string on success, else the error.
std::string group_norm_forward(const GroupNormArgs& a);

}  // namespace rsd
