// Internals shared by the GroupNorm(+SiLU) kernels: argument helpers, the per-element math, and the
// two launch paths that hip/group_norm.hip chooses between.
//   resident (group_norm_resident.hip): one launch; every block of a group holds its chunk of x in
//       registers while the group's blocks exchange partial statistics: x is read once, y written once.
//   split (group_norm_split.hip): stats / finalize / apply launches; x is read twice. For groups too
//       large to be resident at once and for channels_last inputs.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "rocm_sd/api.h"
#include "rocm_sd/common.h"
#include "rocm_sd/compat.h"

namespace rsd {
namespace gn {

inline int elem_bytes(DType d) { return d == DType::f32 ? 4 : 2; }
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline size_t round_up(size_t v, size_t m) { return (v + m - 1) / m * m; }
inline bool aligned(const void* p, int bytes) { return (reinterpret_cast<uintptr_t>(p) % bytes) == 0; }
inline int64_t tensor_bytes(const GroupNormArgs& a) { return a.n * a.c * a.hw * elem_bytes(a.dtype); }

// Widest access (at most 16 bytes) such that every vector stays inside one channel (NCHW) or
// one group (NHWC) and x and y are aligned for it.
inline int pick_vec(const GroupNormArgs& a) {
  const int eb = elem_bytes(a.dtype);
  const int64_t unit = a.layout == Layout::nchw ? a.hw : a.c / a.groups;
  for (int vec = 16 / eb; vec > 1; vec /= 2) {
    if (unit % vec == 0 && aligned(a.x, vec * eb) && aligned(a.y, vec * eb)) return vec;
  }
  return 1;
}

// Streaming stores only pay when y cannot stay in L2 for its consumer anyway.
inline bool streaming_output(const GroupNormArgs& a) { return tensor_bytes(a) > (int64_t(32) << 20); }

// ---- the two paths ----
struct ResidentPlan {
  int vec = 1;
  int64_t blocks_per_group = 0;
};
// False when a group is too large for all its blocks to be resident on the device at once.
bool resident_plan(const GroupNormArgs& a, ResidentPlan* plan);
size_t resident_workspace_bytes(const GroupNormArgs& a, const ResidentPlan& p);
// Enqueue on a.stream; the first launch error, if any.
hipError_t resident_launch(const GroupNormArgs& a, const ResidentPlan& p);

// The split path's channels_last kernels hold a pixel row (C / vec threads) in one block.
constexpr int kMaxThreadsNhwc = 1024;
size_t split_workspace_bytes(const GroupNormArgs& a);
hipError_t split_launch(const GroupNormArgs& a);

// ---- device math ----
__device__ __forceinline__ float2 mean_rstd_of(const WelfordStats& s, float eps) {
  const float var = s.n > 0.f ? s.m2 / s.n : 0.f;  // biased variance, as torch
  return make_float2(s.mean, rsqrtf(var + eps));
}

template <class T, int VEC>
__device__ __forceinline__ void accumulate(ShiftedSums& acc, const Vec<T, VEC>& v) {
#pragma unroll
  for (int k = 0; k < VEC; ++k) acc.add(to_float(v.v[k]));
}

// y = x * a + b folds the normalisation and the affine transform of channel `ch`.
template <class P>
__device__ __forceinline__ void scale_shift(const P* gamma, const P* beta, int ch, float2 mr, float& a, float& b) {
  const float gm = gamma ? to_float(gamma[ch]) : 1.f;
  const float bt = beta ? to_float(beta[ch]) : 0.f;
  a = mr.y * gm;
  b = bt - mr.x * a;
}

template <class T, bool SILU>
__device__ __forceinline__ T activate(float y) {
  if constexpr (SILU) y = std::is_same<T, float>::value ? silu(y) : silu_fast(y);
  return from_float<T>(y);
}

// y = act(x * a + b) for one vector; A and B are scalars (one channel) or per-element arrays.
template <class T, int VEC, bool SILU, class A, class B>
__device__ __forceinline__ Vec<T, VEC> normalize(const Vec<T, VEC>& v, const A& a, const B& b) {
  Vec<T, VEC> out;
#pragma unroll
  for (int k = 0; k < VEC; ++k) {
    if constexpr (std::is_array<A>::value)
      out.v[k] = activate<T, SILU>(fmaf(to_float(v.v[k]), a[k], b[k]));
    else
      out.v[k] = activate<T, SILU>(fmaf(to_float(v.v[k]), a, b));
  }
  return out;
}

// ---- compile-time dispatch of runtime choices ----
template <class T>
struct Tag {
  using type = T;
};

template <class F>
void with_dtype(DType d, F&& f) {
  switch (d) {
    case DType::f32: f(Tag<float>{}); break;
    case DType::f16: f(Tag<__half>{}); break;
    case DType::bf16: f(Tag<bf16>{}); break;
  }
}

template <int V>
using IntC = std::integral_constant<int, V>;

// Only widths of at most 16 bytes of T are instantiated.
template <class T, class F>
void with_vec(int vec, F&& f) {
  switch (vec) {
    case 8: if constexpr (sizeof(T) <= 2) f(IntC<8>{}); break;
    case 4: f(IntC<4>{}); break;
    case 2: f(IntC<2>{}); break;
    default: f(IntC<1>{}); break;
  }
}

template <class F>
void with_bool(bool b, F&& f) {
  if (b)
    f(std::true_type{});
  else
    f(std::false_type{});
}

// gamma/beta are of the input's type or fp32.
template <class T, class F>
void with_params(DType param_dtype, F&& f) {
  if (param_dtype == DType::f32)
    f(Tag<float>{});
  else
    f(Tag<T>{});
}

}  // namespace gn
}  // namespace rsd
