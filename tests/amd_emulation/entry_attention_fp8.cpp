// C entry point of the emulated FP8 attention (see rsd_emu/entry_point.h); the workspace is allocated here.
#include <cstdlib>
#include <string>

#include "rocm_sd/attention_fp8/api.h"
#include "rsd_emu/attention_args.h"
#include "rsd_emu/entry_point.h"

extern "C" {

// q, k, v, out, strides: rsd_emu/attention_args.h. format: rsd::QuantFormat (0 e4m3fn, 1 e4m3fnuz).
const char* rsd_emu_attention_fp8(const void* q, const void* k, const void* v, void* out, int dtype, int64_t batch,
                                  int64_t heads, int64_t q_len, int64_t kv_len, int64_t head_dim,
                                  const int64_t* strides, float scale, int format) {
  rsd::AttentionFp8Args a{rsd_emu::attention_args(q, k, v, out, dtype, batch, heads, q_len, kv_len, head_dim, strides,
                                                  scale),
                          rsd::QuantFormat(format), nullptr};
  const int64_t bytes = rsd::attention_fp8_workspace_bytes(a);
  a.workspace = bytes > 0 ? std::aligned_alloc(256, size_t((bytes + 255) / 256 * 256)) : nullptr;
  const std::string error = rsd::attention_fp8_forward(a);
  std::free(a.workspace);
  return rsd_emu::answer(error);
}

}  // extern "C"
