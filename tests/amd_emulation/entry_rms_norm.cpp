// C entry point of the emulated rms_norm (hip/rms_norm/rms_norm.hip; see rsd_emu/entry_point.h).
#include "rocm_sd/rms_norm/api.h"
#include "rsd_emu/entry_point.h"

extern "C" {

// x: (batch, len, heads, d) with strides (xs0, xs1, xs2, 1); lead likewise (or null); cos, sin: (lead_len + len, d)
// float32 (or null); y: (batch, lead_len + len, heads, d) contiguous.
const char* rsd_emu_rms_norm(const void* x, const void* weight, const void* lead, const void* lead_weight,
                             const void* cos, const void* sin, void* y, int dtype, int param_dtype, int64_t batch,
                             int64_t len, int64_t lead_len, int64_t heads, int64_t d, int64_t xs0, int64_t xs1,
                             int64_t xs2, int64_t ls0, int64_t ls1, int64_t ls2, float eps) {
  rsd::RmsNormArgs a{};
  a.x = x;
  a.weight = weight;
  a.lead = lead;
  a.lead_weight = lead_weight;
  a.cos = static_cast<const float*>(cos);
  a.sin = static_cast<const float*>(sin);
  a.y = y;
  a.dtype = rsd::DType(dtype);
  a.param_dtype = rsd::DType(param_dtype);
  a.batch = batch;
  a.len = len;
  a.lead_len = lead_len;
  a.heads = heads;
  a.d = d;
  a.x_stride[0] = xs0;
  a.x_stride[1] = xs1;
  a.x_stride[2] = xs2;
  a.lead_stride[0] = ls0;
  a.lead_stride[1] = ls1;
  a.lead_stride[2] = ls2;
  a.eps = eps;
  return rsd_emu::answer(rsd::rms_norm_forward(a));
}

}  // extern "C"
