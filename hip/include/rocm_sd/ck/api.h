// The host interface of hip/ck/ (conventions: rocm_sd/api.h): the Composable Kernel instances built into _C
// (ROCm builds with CK headers only; elsewhere the lists are empty). Each list takes a GPU arch (gcnArchName,
// target features allowed): the instances with code for it (XDL ones on CDNA, WMMA ones on RDNA3/4, GroupNorm
// everywhere), or, for "", every instance in the build.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "rocm_sd/attention/api.h"

namespace rsd {

// GroupNorm(+SiLU) over channels_last fp16 x, fp16 gamma/beta.
struct CkGroupNormInstance {
  std::string name;  // encodes every template parameter (ck_templates/instances.py)
  bool silu;
};
std::vector<CkGroupNormInstance> ck_group_norm_instances(const std::string& arch);
struct CkGroupNormCall {
  const void* x;
  const void* gamma;
  const void* beta;
  void* y;
  int n, h, w, c, groups;
  float eps;
  void* stream;
  int device;
};
// Empty string on success, else why the instance cannot run this call (or does not exist).
std::string ck_group_norm_forward(const std::string& name, const CkGroupNormCall& a);

// Attention (batched GEMM-softmax-GEMM, XDL or WMMA) over fp16 q, k, v in attention_forward's layout and strides
// (WMMA: packed ones only).
std::vector<std::string> ck_attention_instances(const std::string& arch);
// Empty string on success, else why the instance cannot run this call (or does not exist).
std::string ck_attention_forward(const std::string& name, const AttentionArgs& a);

// diffusers' GEGLU projection, x [m, k] times nn.Linear's [2n, k] weight, as two GEMMs with fused epilogues
// (the gate's GELU, then bias and product); fp16, `gate` an [m, n] workspace.
struct CkLinearGegluCall {
  const void* x;
  const void* weight;
  const void* bias;
  void* gate;
  void* out;
  int64_t m, n, k, x_stride;
  void* stream;
  int device;
};
std::vector<std::string> ck_linear_geglu_instances(const std::string& arch);
// Empty string on success, else why the instance cannot run this call (or does not exist).
std::string ck_linear_geglu_forward(const std::string& name, const CkLinearGegluCall& a);

// ResnetBlock2D's conv2 + bias + residual (+ scale) as one grouped convolution; channels_last fp16 x, weight,
// residual and output, stride 1, dilation 1, one group.
struct CkConvBiasResidualCall {
  const void* x;
  const void* weight;
  const void* bias;
  const void* residual;
  void* out;
  int64_t n, c, h, w, k, r, s, pad_h, pad_w;
  float scale;
  void* stream;
  int device;
};
std::vector<std::string> ck_conv_bias_residual_instances(const std::string& arch);
// Empty string on success, else why the instance cannot run this call (or does not exist).
std::string ck_conv_bias_residual_forward(const std::string& name, const CkConvBiasResidualCall& a);

}  // namespace rsd
