// The emulated attention entry points' arguments (entry_attention.cpp, entry_attention_fp8.cpp): rocm_sd::attention's,
// from the flat C arguments the tests pass through ctypes.
#pragma once

#include <cstdint>

#include "rocm_sd/attention/api.h"

namespace rsd_emu {

// q, k, v, out: [batch, seq, heads, head_dim]; strides: 3 per tensor (batch, sequence, head) in the order q, k,
// v, out. Device 0, no stream, the heuristic's instance.
inline rsd::AttentionArgs attention_args(const void* q, const void* k, const void* v, void* out, int dtype,
                                         int64_t batch, int64_t heads, int64_t q_len, int64_t kv_len,
                                         int64_t head_dim, const int64_t* strides, float scale) {
  rsd::AttentionArgs a{};
  a.q = q;
  a.k = k;
  a.v = v;
  a.out = out;
  a.dtype = rsd::DType(dtype);
  a.batch = batch;
  a.heads = heads;
  a.q_len = q_len;
  a.kv_len = kv_len;
  a.head_dim = head_dim;
  for (int i = 0; i < 3; ++i) {
    a.q_stride[i] = strides[i];
    a.k_stride[i] = strides[3 + i];
    a.v_stride[i] = strides[6 + i];
    a.out_stride[i] = strides[9 + i];
  }
  a.scale = scale;
  a.stream = nullptr;
  a.device = 0;
  return a;
}

}  // namespace rsd_emu
