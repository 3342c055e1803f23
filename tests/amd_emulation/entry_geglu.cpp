// C entry point of the emulated geglu (see rsd_emu/entry_point.h).
#include "rocm_sd/geglu/api.h"
#include "rsd_emu/entry_point.h"

extern "C" {

// x: (rows, 2 d) contiguous, y: (rows, d).
const char* rsd_emu_geglu(const void* x, void* y, int dtype, int64_t rows, int64_t d) {
  // Positional, in api.h's field order: x, y, dtype, rows, d, stream, device.
  const rsd::GegluArgs a{x, y, rsd::DType(dtype), rows, d, nullptr, 0};
  return rsd_emu::answer(rsd::geglu_forward(a));
}

// The same with y also quantized per row into q (rows, d) bytes and scale (rows,) float32, with the bound (0: a scale
// per row).
const char* rsd_emu_geglu_quantize_rows(const void* x, void* y, int dtype, int64_t rows, int64_t d, void* q, void* scale,
                                        int format, float bound) {
  rsd::GegluArgs a{x, y, rsd::DType(dtype), rows, d, nullptr, 0};
  a.q = q;
  a.scale = static_cast<float*>(scale);
  a.format = rsd::QuantFormat(format);
  a.bound = bound;
  return rsd_emu::answer(rsd::geglu_forward(a));
}

}  // extern "C"
