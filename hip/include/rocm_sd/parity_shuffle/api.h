// The host interface of hip/parity_shuffle/ (conventions: rocm_sd/api.h):
// out[n, 2i + a, 2j + b, c] = parities[n, i + a, j + b, (2a + b) C + c] + bias[c], NHWC
#pragma once

#include <cstdint>
#include <string>

#include "rocm_sd/api.h"

namespace rsd {

struct ParityShuffleArgs {
  const void* parities;  // (N, H + 1, W + 1, 4C) dense
  const void* bias;      // (C,) or nullptr, dtype of parities
  void* out;             // (N, 2H, 2W, C) dense
  DType dtype;
  int64_t n, h, w, c;    // h, w: the input resolution; c: output channels
  void* stream;
  int device;
};
std::string parity_shuffle_check(const ParityShuffleArgs& a);
std::string parity_shuffle_forward(const ParityShuffleArgs& a);

}  // namespace rsd
