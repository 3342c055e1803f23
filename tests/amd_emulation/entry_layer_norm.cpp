// C entry point of the emulated layer_norm (see rsd_emu/entry_point.h).
#include "rocm_sd/layer_norm/api.h"
#include "rsd_emu/entry_point.h"

extern "C" {

const char* rsd_emu_layer_norm(const void* x, const void* residual, void* sum, void* y, const void* gamma,
                               const void* beta, int dtype, int param_dtype, int64_t rows, int64_t c, float eps) {
  // Positional, in api.h's field order: x, y, gamma, beta, dtype, param_dtype, rows, c, eps, stream, device,
  // residual, sum.
  const rsd::LayerNormArgs a{x,   y,       gamma, beta,     rsd::DType(dtype), rsd::DType(param_dtype), rows, c,
                             eps, nullptr, 0,     residual, sum};
  return rsd_emu::answer(rsd::layer_norm_forward(a));
}

// The same with y also quantized per row into q (rows, c) bytes and scale (rows,) float32, with the bound (0: a scale
// per row).
const char* rsd_emu_layer_norm_quantize_rows(const void* x, const void* residual, void* sum, void* y, const void* gamma,
                                             const void* beta, int dtype, int param_dtype, int64_t rows, int64_t c,
                                             float eps, void* q, void* scale, int format, float bound) {
  rsd::LayerNormArgs a{x,   y,       gamma, beta,     rsd::DType(dtype), rsd::DType(param_dtype), rows, c,
                       eps, nullptr, 0,     residual, sum};
  a.q = q;
  a.scale = static_cast<float*>(scale);
  a.format = rsd::QuantFormat(format);
  a.bound = bound;
  return rsd_emu::answer(rsd::layer_norm_forward(a));
}

}  // extern "C"
