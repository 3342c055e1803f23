// attention_check's checks of the arguments alone (host side, no device): shared by the kernels that take
// rocm_sd::attention's arguments (hip/attention/, hip/attention_fp8/).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "rocm_sd/attention/api.h"
#include "rocm_sd/launch.h"

namespace rsd {

inline bool attention_stride_ok(const int64_t (&s)[3]) { return s[0] % 8 == 0 && s[1] % 8 == 0 && s[2] % 8 == 0; }

// dtype, sizes (head dims up to max_head_dim, `max_head_dim_why` saying why), scale, alignment, strides; "" if the
// arguments pass.
inline std::string attention_args_check(const AttentionArgs& a, int64_t max_head_dim, const char* max_head_dim_why) {
  if (a.dtype == DType::f32) return "float32 (the matrix-unit kernel takes float16 and bfloat16)";
  if (a.batch <= 0 || a.heads <= 0 || a.q_len <= 0 || a.kv_len <= 0 || a.head_dim <= 0) return "empty tensor";
  if (a.head_dim % 8 != 0) return "head dim " + std::to_string(a.head_dim) + " is not a multiple of 8";
  if (a.head_dim > max_head_dim)
    return "head dim " + std::to_string(a.head_dim) + " > " + std::to_string(max_head_dim) + " (" +
           max_head_dim_why + ")";
  if (a.batch > 65535 || a.heads > 65535) return "batch or heads > 65535 (grid limit)";
  if (a.q_len >= (int64_t(1) << 30) || a.kv_len >= (int64_t(1) << 30)) return "sequence of 2^30 or more";
  if (!(a.scale > 0.f) || !std::isfinite(a.scale)) return "scale is not a positive finite number";
  for (const void* ptr : {a.q, a.k, a.v, static_cast<const void*>(a.out)})
    if (!aligned(ptr, 16)) return "a data pointer is not 16-byte aligned";
  if (!attention_stride_ok(a.q_stride) || !attention_stride_ok(a.k_stride) || !attention_stride_ok(a.v_stride) ||
      !attention_stride_ok(a.out_stride))
    return "batch, sequence or head strides not multiples of 8 elements (16-byte rows)";
  return std::string();
}

}  // namespace rsd
