// C entry point of the emulated attention (see rsd_emu/entry_point.h).
#include "rocm_sd/attention/api.h"
#include "rsd_emu/entry_point.h"

extern "C" {

// q, k, v, out: [batch, seq, heads, head_dim]; strides: 3 per tensor (batch, sequence, head) in the order q, k,
// v, out. instance: a name from attention_instances(), or "" for the heuristic's pick.
const char* rsd_emu_attention(const void* q, const void* k, const void* v, void* out, int dtype, int64_t batch,
                              int64_t heads, int64_t q_len, int64_t kv_len, int64_t head_dim, const int64_t* strides,
                              float scale, const char* instance) {
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
  a.instance = instance;
  return rsd_emu::answer(rsd::attention_forward(a));
}

}  // extern "C"
