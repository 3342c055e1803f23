// The arguments every generated CK GEGLU-projection instance takes: raw pointers and sizes, as _C's other
// launchers (no torch, no CK types), so the registry and the bindings need no CK headers.
#pragma once
#include "rocm_sd_ck/instance_entry.h"

namespace rsd::ck {

struct LinearGegluArgs {
  const void* x;       // [m, k] fp16, rows x_stride elements apart, columns contiguous
  const void* weight;  // [2n, k] fp16 contiguous: nn.Linear's weight, hidden rows then gate rows
  const void* bias;    // [2n] fp16
  void* gate;          // [m, n] fp16 workspace: gelu of the gate half
  void* out;           // [m, n] fp16 contiguous
  int m, n, k, x_stride;
  void* stream;        // hipStream_t
};

using LinearGegluInstanceEntry = InstanceEntry<LinearGegluArgs>;

}  // namespace rsd::ck
