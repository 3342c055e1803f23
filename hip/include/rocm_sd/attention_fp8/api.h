// The host interface of hip/attention_fp8/ (conventions: rocm_sd/api.h): attention with FP8 products,
//
//   out = softmax(scale * Q K^T) V      Q, K, V quantized to FP8, softmax and accumulation in fp32
//
// Q and K are quantized per token (one scale per row of head_dim), V per channel (one scale per head dim, over
// all keys), the probabilities as p * fmax (p <= 1, so no scale to find). The inputs and the output are fp16 /
// bf16 in rocm_sd::attention's layout ([batch, seq, heads, head_dim], any batch / sequence / head strides).
// A first pass quantizes Q, K and V into the workspace (K and Q as padded rows, V transposed, [dim][key]); the
// attention kernel then reads only bytes. Head dims up to 160 (multiples of 8).
#pragma once

#include <cstdint>
#include <string>

#include "rocm_sd/api.h"
#include "rocm_sd/quantize/api.h"

namespace rsd {

struct AttentionFp8Args {
  const void* q;  // [batch, q_len, heads, head_dim] with the strides below (head dim contiguous)
  const void* k;  // [batch, kv_len, heads, head_dim]
  const void* v;  // [batch, kv_len, heads, head_dim]
  void* out;      // [batch, q_len, heads, head_dim]
  DType dtype;    // of all four: f16 or bf16
  int64_t batch, heads, q_len, kv_len, head_dim;
  int64_t q_stride[3], k_stride[3], v_stride[3], out_stride[3];  // batch, sequence, head; in elements
  float scale;         // > 0
  QuantFormat format;  // the device's FP8: e4m3fnuz on gfx940-942, e4m3fn elsewhere (attention_fp8_check says)
  void* workspace;     // attention_fp8_workspace_bytes(args) bytes, 256-byte aligned
  void* stream;
  int device;
};

int64_t attention_fp8_workspace_bytes(const AttentionFp8Args& a);
std::string attention_fp8_check(const AttentionFp8Args& a);
// The instance and grid these arguments get, or "error: ...".
std::string attention_fp8_describe(const AttentionFp8Args& a);
std::string attention_fp8_forward(const AttentionFp8Args& a);

}  // namespace rsd
