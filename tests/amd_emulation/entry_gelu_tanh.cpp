// C entry point of the emulated gelu_tanh (hip/gelu_tanh/gelu_tanh.hip; see rsd_emu/entry_point.h).
#include "rocm_sd/gelu_tanh/api.h"
#include "rsd_emu/entry_point.h"

extern "C" {

// x, y: (rows, d) contiguous; bias: (d,) or null; q, scale: null, or (rows, d) bytes and (rows,) float32 (then y is
// null: the quantized rows alone).
const char* rsd_emu_gelu_tanh(const void* x, const void* bias, void* y, int dtype, int64_t rows, int64_t d, void* q,
                              void* scale, int format) {
  // Positional, in api.h's field order: x, bias, y, dtype, rows, d, stream, device.
  rsd::GeluTanhArgs a{x, bias, y, rsd::DType(dtype), rows, d, nullptr, 0};
  a.q = q;
  a.scale = static_cast<float*>(scale);
  a.format = rsd::QuantFormat(format);
  return rsd_emu::answer(rsd::gelu_tanh_forward(a));
}

}  // extern "C"
