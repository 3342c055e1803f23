// The arguments every generated CK attention instance takes: raw pointers, sizes and strides, as _C's
// other launchers (no torch, no CK types), so the registry and the bindings need no CK headers.
#pragma once
#include "rocm_sd_ck/instance_entry.h"

namespace rsd::ck {

struct AttentionArgs {
  const void* q;  // [batch, q_len, heads, head_dim] fp16, strided (the projections' outputs viewed per head)
  const void* k;  // [batch, kv_len, heads, head_dim]
  const void* v;  // [batch, kv_len, heads, head_dim]
  void* out;      // [batch, q_len, heads, head_dim]
  int batch, heads, q_len, kv_len, head_dim;
  int q_stride[3], k_stride[3], v_stride[3], out_stride[3];  // batch, sequence, head; in elements
  float scale;
  void* stream;   // hipStream_t
};

using AttentionInstanceEntry = InstanceEntry<AttentionArgs>;

// Whether a tensor of `stride` (batch, sequence, head; elements) is a packed [batch, len, heads, dim] one: what
// the WMMA instances take (a batch of one needs no batch stride).
inline bool packed_bshd(const int stride[3], int batch, int len, int heads, int dim) {
  return stride[2] == dim && stride[1] == heads * dim && (batch == 1 || stride[0] == len * heads * dim);
}

}  // namespace rsd::ck
