// The host interface of hip/im2col_quantize/ (conventions: rocm_sd/api.h): the activation operand of a convolution
// run as an FP8 GEMM (rocm_sd/modules/quantized_conv.py). x (n, h, w, c) channels_last; q one row per output pixel
// (n, ho, wo), the kernel window's taps in order (i, j), each tap c channels:
//
//   q[(n, ho, wo), (i * kw + j) * c + ch] = encode(x[n, ho * stride_h - pad_h + i, wo * stride_w - pad_w + j, ch]
//                                                  * fmax / bound)        0 where the tap falls in the padding
//   scale = bound / fmax                                                  one float: the GEMM's per-tensor scale
//
// The bound is a value no element of x can exceed (the GroupNorm in front of the convolution bounds it:
// patch/precision.py), so there is one scale for the tensor and no reduction. fp8 formats only.
#pragma once

#include "rocm_sd/rtc.h"
#if !RSD_RTC
#include <cstdint>
#include <string>
#endif

#include "rocm_sd/api.h"
#include "rocm_sd/quantize/api.h"

namespace rsd {

struct Im2colQuantizeArgs {
  const void* x;   // (n, h, w, c), c contiguous
  void* q;         // (n * ho * wo, kh * kw * c) one byte each
  float* scale;    // (1,)
  DType dtype;     // of x
  QuantFormat format;
  int64_t n, h, w, c;
  int kh, kw, stride_h, stride_w, pad_h, pad_w;
  float bound;
  void* stream;
  int device;
};
#if !RSD_RTC
int64_t im2col_out_size(int64_t in, int kernel, int stride, int pad);  // ho / wo, < 1 when the window does not fit
std::string im2col_quantize_check(const Im2colQuantizeArgs& a);
std::string im2col_quantize_forward(const Im2colQuantizeArgs& a);
#endif

}  // namespace rsd
