// C entry point of the emulated FP8 attention (see rsd_emu/entry_point.h); the workspace is allocated here.
#include <cstdlib>
#include <string>

#include "rocm_sd/attention_fp8/api.h"
#include "rsd_emu/entry_point.h"

extern "C" {

// q, k, v, out: [batch, seq, heads, head_dim]; strides: 3 per tensor (batch, sequence, head) in the order q, k,
// v, out. format: rsd::QuantFormat (0 e4m3fn, 1 e4m3fnuz).
const char* rsd_emu_attention_fp8(const void* q, const void* k, const void* v, void* out, int dtype, int64_t batch,
                                  int64_t heads, int64_t q_len, int64_t kv_len, int64_t head_dim,
                                  const int64_t* strides, float scale, int format) {
  rsd::AttentionFp8Args a{};
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
  a.format = rsd::QuantFormat(format);
  a.stream = nullptr;
  a.device = 0;
  const int64_t bytes = rsd::attention_fp8_workspace_bytes(a);
  a.workspace = bytes > 0 ? std::aligned_alloc(256, size_t((bytes + 255) / 256 * 256)) : nullptr;
  const std::string error = rsd::attention_fp8_forward(a);
  std::free(a.workspace);
  return rsd_emu::answer(error);
}

}  // extern "C"
