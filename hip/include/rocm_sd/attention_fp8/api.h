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
#include "rocm_sd/attention/api.h"
#include "rocm_sd/quantize/api.h"

namespace rsd {

// rocm_sd::attention's arguments (rocm_sd/attention/api.h: layouts, strides, scale, stream, device; `instance` must
// be empty: one instance a padded head dim, attention_fp8_describe names it), and the FP8 ones.
struct AttentionFp8Args : AttentionArgs {
  QuantFormat format;  // the device's FP8: e4m3fnuz on gfx940-942, e4m3fn elsewhere (attention_fp8_check says)
  void* workspace;     // attention_fp8_workspace_bytes(args) bytes, 256-byte aligned
};

int64_t attention_fp8_workspace_bytes(const AttentionFp8Args& a);
std::string attention_fp8_check(const AttentionFp8Args& a);
// The instance and grid these arguments get, or "error: ...".
std::string attention_fp8_describe(const AttentionFp8Args& a);
std::string attention_fp8_forward(const AttentionFp8Args& a);

}  // namespace rsd
