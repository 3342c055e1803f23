// C entry point of the emulated quantize_rows (see rsd_emu/entry_point.h).
#include "rocm_sd/quantize/api.h"
#include "rsd_emu/entry_point.h"

extern "C" {

// x: (rows, k) contiguous, q: (rows, k) bytes, scale: (rows,) float32.
const char* rsd_emu_quantize_rows(const void* x, void* q, void* scale, int dtype, int format, int64_t rows, int64_t k) {
  // Positional, in api.h's field order: x, q, scale, dtype, format, rows, k, stream, device.
  const rsd::QuantizeRowsArgs a{x, q, static_cast<float*>(scale), rsd::DType(dtype), rsd::QuantFormat(format),
                                rows, k, nullptr, 0};
  return rsd_emu::answer(rsd::quantize_rows_forward(a));
}

// The same with x's rows in batches of rows_per_batch contiguous rows, batch_stride elements apart.
const char* rsd_emu_quantize_batched_rows(const void* x, void* q, void* scale, int dtype, int format, int64_t rows,
                                          int64_t k, int64_t rows_per_batch, int64_t batch_stride) {
  const rsd::QuantizeRowsArgs a{x, q, static_cast<float*>(scale), rsd::DType(dtype), rsd::QuantFormat(format),
                                rows, k, nullptr, 0, rows_per_batch, batch_stride};
  return rsd_emu::answer(rsd::quantize_rows_forward(a));
}

}  // extern "C"
