// C entry point of the emulated im2col_quantize (see rsd_emu/entry_point.h).
#include "rocm_sd/im2col_quantize/api.h"
#include "rsd_emu/entry_point.h"

extern "C" {

// x: (n, h, w, c) channels_last, q: (n * ho * wo, kh * kw * c) bytes, scale: one float32.
const char* rsd_emu_im2col_quantize(const void* x, void* q, void* scale, int dtype, int format, int64_t n, int64_t h,
                                    int64_t w, int64_t c, int kh, int kw, int stride_h, int stride_w, int pad_h,
                                    int pad_w, float bound) {
  // Positional, in api.h's field order.
  const rsd::Im2colQuantizeArgs a{x, q, static_cast<float*>(scale), rsd::DType(dtype), rsd::QuantFormat(format),
                                  n, h, w, c, kh, kw, stride_h, stride_w, pad_h, pad_w, bound, nullptr, 0};
  return rsd_emu::answer(rsd::im2col_quantize_forward(a));
}

}  // extern "C"
