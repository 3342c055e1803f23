// The arguments every generated CK convolution + bias + residual instance takes: raw pointers and sizes, as
// _C's other launchers (no torch, no CK types), so the registry and the bindings need no CK headers.
#pragma once
#include "rocm_sd_ck/instance_entry.h"

namespace rsd::ck {

struct ConvBiasResidualArgs {
  const void* x;         // [n, h, w, c] fp16 (channels_last memory)
  const void* weight;    // [k, r, s, c] fp16 (a channels_last [k, c, r, s] conv weight)
  const void* bias;      // [k] fp16
  const void* residual;  // [n, ho, wo, k] fp16, like the output
  void* out;             // [n, ho, wo, k] fp16 (channels_last)
  int n, c, h, w, k, r, s, pad_h, pad_w;  // stride 1, dilation 1, one group
  float scale;
  void* stream;          // hipStream_t
};

using ConvBiasResidualInstanceEntry = InstanceEntry<ConvBiasResidualArgs>;

}  // namespace rsd::ck
