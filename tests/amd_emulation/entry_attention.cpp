// C entry point of the emulated attention (see rsd_emu/entry_point.h).
#include "rocm_sd/attention/api.h"
#include "rsd_emu/attention_args.h"
#include "rsd_emu/entry_point.h"

extern "C" {

// q, k, v, out, strides: rsd_emu/attention_args.h. instance: a name from attention_instances(), or "" for the
// heuristic's pick.
const char* rsd_emu_attention(const void* q, const void* k, const void* v, void* out, int dtype, int64_t batch,
                              int64_t heads, int64_t q_len, int64_t kv_len, int64_t head_dim, const int64_t* strides,
                              float scale, const char* instance) {
  rsd::AttentionArgs a = rsd_emu::attention_args(q, k, v, out, dtype, batch, heads, q_len, kv_len, head_dim, strides,
                                                 scale);
  a.instance = instance;
  return rsd_emu::answer(rsd::attention_forward(a));
}

}  // extern "C"
