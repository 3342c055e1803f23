// The host interface of hip/attention/ (conventions: rocm_sd/api.h): out = softmax(q k^T * scale) v,
// flash-style (online softmax, no Lq x Lk matrix), on the matrix units (rocm_sd/attention/wave_mma.h).
// fp16 / bf16, head dim a multiple of 8 up to 160.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "rocm_sd/api.h"

namespace rsd {

struct AttentionArgs {
  const void* q;        // [batch, q_len, heads, head_dim] with the strides below (head dim contiguous)
  const void* k;        // [batch, kv_len, heads, head_dim]
  const void* v;        // [batch, kv_len, heads, head_dim]
  void* out;            // [batch, q_len, heads, head_dim]
  DType dtype;          // of all four
  int64_t batch, heads, q_len, kv_len, head_dim;
  int64_t q_stride[3], k_stride[3], v_stride[3], out_stride[3];  // batch, sequence, head; in elements
  float scale;          // > 0, typically 1 / sqrt(head_dim)
  void* stream;
  int device;
  std::string instance;  // a name from attention_instances(), or empty for the documented heuristic
};
// Every compiled instance, named by its parameters: "f16_d64_w4_r2_n64" (dtype, padded head dim, waves a
// block, 16-query tiles a wave, keys a tile); the wide family (head dims above 160) ends in "_wide"; "_kv2" / "_kv1"
// keep fewer K / V tiles in shared memory (one stage; K and V in one tile), to fit two workgroups a CU on CDNA.
std::vector<std::string> attention_instances();
// The instances attention_check refuses on a device of this architecture ("gfx1100"): those that spill there.
std::vector<std::string> attention_refused_instances(const std::string& arch);
std::string attention_check(const AttentionArgs& a);
// The instance and grid these arguments get, or "error: ...".
std::string attention_describe(const AttentionArgs& a);
std::string attention_forward(const AttentionArgs& a);

}  // namespace rsd
