// C entry point of the emulated bias_residual op (hip/bias_residual/bias_residual.hip; see rsd_emu/entry_point.h).
#include "rocm_sd/bias_residual/api.h"
#include "rsd_emu/entry_point.h"

extern "C" {

// x, residual, y: (n, c, hw) in `layout` (0 NCHW, 1 NHWC), bias: (c,).
const char* rsd_emu_bias_residual(const void* x, const void* residual, const void* bias, void* y, int dtype,
                                  int layout, int64_t n, int64_t c, int64_t hw, float scale) {
  // Positional, in api.h's field order: x, residual, bias, y, dtype, layout, n, c, hw, scale, stream, device.
  const rsd::BiasResidualArgs a{x, residual, bias, y, rsd::DType(dtype), rsd::Layout(layout), n, c, hw, scale,
                                nullptr, 0};
  return rsd_emu::answer(rsd::bias_residual_forward(a));
}

}  // extern "C"
