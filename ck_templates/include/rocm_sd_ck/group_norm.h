// The arguments every generated CK GroupNorm instance takes: raw pointers and sizes, as _C's other
// launchers (no torch, no CK types), so the registry and the bindings need no CK headers.
#pragma once

namespace rsd::ck {

struct GroupNormArgs {
  const void* x;      // [N, H, W, C] fp16, channels_last (NHWC memory)
  const void* gamma;  // [C] fp16
  const void* beta;   // [C] fp16
  void* y;            // like x
  int n, h, w, c, groups;
  float eps;
  void* stream;       // hipStream_t
};

// Runs the instance; nullptr on success, else why it cannot take these arguments.
using GroupNormFn = const char* (*)(const GroupNormArgs&);

struct GroupNormInstanceEntry {
  const char* name;
  bool silu;
  const char* targets;  // as InstanceEntry's (instance_entry.h): every target, GroupNorm being plain HIP
  GroupNormFn run;
};

}  // namespace rsd::ck
