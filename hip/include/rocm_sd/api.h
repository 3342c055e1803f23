// The host interface of rocm_sd._C: plain pointers, sizes and a stream handle. No GPU runtime
// and no torch headers, so bindings.cpp compiles with the host compiler alone and one build of
// _C serves every torch version (DESIGN.md, "Why _C has no torch headers").
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace rsd {

enum class DType : int { f32 = 0, f16 = 1, bf16 = 2 };
enum class Layout : int { nchw = 0, nhwc = 1 };
// Which GroupNorm kernels run (group_norm.hip): automatic picks; the others are for tests and benchmarks.
enum class GroupNormPath : int { automatic = 0, resident = 1, split = 2 };

// ---------------------------------------------------------------------------------------------
// runtime.hip: build and device facts
struct BuildInfo {
  std::string platform;  // "hip" or "cuda"
  std::string targets;   // GPU targets compiled in, ';'-separated (gfx90a;... or 80;90)
  int runtime_version;   // hipRuntimeGetVersion / cudaRuntimeGetVersion of the headers built against
  std::string source_hash;  // of hip/ and ck_templates/ at build time: tuning results are tied to it
};
BuildInfo build_info();

struct DeviceInfo {
  std::string name;
  std::string arch;  // gcnArchName on HIP ("gfx942:sramecc+:xnack-"), "sm_90" on CUDA
  int multiprocessors;
  int wave_size;
  int l2_bytes;
  int driver_version;
};
// Returns an empty string on success, else the runtime's error.
std::string device_info(int device, DeviceInfo* out);

// Whether this build holds machine code the device can run; empty string if yes, else why not.
std::string check_kernel_image(int device);

// ---------------------------------------------------------------------------------------------
// group_norm.hip: GroupNorm with optional fused SiLU, y = act((x - mean_g) * rstd_g * gamma + beta)
struct GroupNormArgs {
  const void* x;      // (N, C, *spatial): NCHW contiguous, or NHWC (channels_last) when layout == nhwc
  void* y;            // same shape, layout and dtype as x
  const void* gamma;  // (C,) or nullptr
  const void* beta;   // (C,) or nullptr
  DType dtype;        // of x and y
  DType param_dtype;  // of gamma and beta: dtype or f32
  Layout layout;
  int64_t n, c, hw;   // hw = product of the spatial sizes
  int groups;
  float eps;
  bool silu;
  void* workspace;    // group_norm_workspace_bytes(args) bytes, no initialisation needed
  void* stream;       // hipStream_t / cudaStream_t
  int device;
  GroupNormPath path = GroupNormPath::automatic;
  // (N, C) contiguous, dtype of x, or nullptr: added to x per (image, channel) before normalising,
  // e.g. a conv bias plus ResnetBlock2D's time embedding.
  const void* input_bias = nullptr;
};

// Empty string if the kernel supports these arguments, else the first reason it does not.
std::string group_norm_check(const GroupNormArgs& a);
size_t group_norm_workspace_bytes(const GroupNormArgs& a);
// The path and launch shape these arguments get, e.g. "resident vec=8 blocks_per_group=128", or why
// a forced path cannot run ("error: ...").
std::string group_norm_describe(const GroupNormArgs& a);
// Enqueues the kernels on a.stream; empty string on success, else the error.
std::string group_norm_forward(const GroupNormArgs& a);

// ---------------------------------------------------------------------------------------------
// geglu.hip: y = x[:, :D] * gelu(x[:, D:]) for x of shape (rows, 2D), row-major contiguous
struct GegluArgs {
  const void* x;  // (rows, 2 * d)
  void* y;        // (rows, d)
  DType dtype;    // of x and y
  int64_t rows, d;
  void* stream;
  int device;
};
std::string geglu_check(const GegluArgs& a);
std::string geglu_forward(const GegluArgs& a);

// ---------------------------------------------------------------------------------------------
// bias_residual.hip: y = (x + residual + bias[c]) * scale, x / residual / y of one shape and layout
struct BiasResidualArgs {
  const void* x;
  const void* residual;
  const void* bias;  // (C,), dtype of x
  void* y;
  DType dtype;
  Layout layout;     // nchw: contiguous; nhwc: channels innermost (4-D channels_last)
  int64_t n, c, hw;
  float scale;
  void* stream;
  int device;
};
std::string bias_residual_check(const BiasResidualArgs& a);
std::string bias_residual_forward(const BiasResidualArgs& a);

// ---------------------------------------------------------------------------------------------
// parity_shuffle.hip: out[n, 2i + a, 2j + b, c] = parities[n, i + a, j + b, (2a + b) C + c] + bias[c], NHWC
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

// ---------------------------------------------------------------------------------------------
// layer_norm.hip: LayerNorm over the last dimension of x, (rows, c) contiguous; with a residual,
// of sum = x + residual, which is written too (SkipLayerNorm)
struct LayerNormArgs {
  const void* x;
  void* y;
  const void* gamma;  // (c,) or nullptr
  const void* beta;   // (c,) or nullptr
  DType dtype;
  DType param_dtype;  // of gamma and beta: dtype or f32
  int64_t rows, c;
  float eps;
  void* stream;
  int device;
  const void* residual = nullptr;  // (rows, c) contiguous, or nullptr
  void* sum = nullptr;             // (rows, c) contiguous: x + residual; set exactly when residual is
};
std::string layer_norm_check(const LayerNormArgs& a);
std::string layer_norm_forward(const LayerNormArgs& a);

// ---------------------------------------------------------------------------------------------
// attention.hip: out = softmax(q k^T * scale) v, flash-style (online softmax, no Lq x Lk matrix),
// on the matrix units (hip/include/rocm_sd/wave_mma.h). fp16 / bf16, head dim a multiple of 8 up to 160.
struct AttentionArgs {
  const void* q;        // [batch, q_len, heads, head_dim] with the strides below (head dim contiguous)
  const void* k;        // [batch, kv_len, heads, head_dim]
  const void* v;        // [batch, kv_len, heads, head_dim]
  void* out;            // [batch, q_len, heads, head_dim]
  DType dtype;          // of all four
  int64_t batch, heads, q_len, kv_len, head_dim;
  int64_t q_stride[3], k_stride[3], v_stride[3], out_stride[3];  // batch, sequence, head; in elements
  float scale;          // > 0, typically 1 / sqrt(head_dim)
  void* stream;
  int device;
  std::string instance;  // a name from attention_instances(), or empty for the documented heuristic
};
// Every compiled instance, named by its parameters: "f16_d64_w4_r2_n64" (dtype, padded head dim, waves a
// block, 16-query tiles a wave, keys a tile); the wide family (head dims above 160) ends in "_wide".
std::vector<std::string> attention_instances();
// The instances attention_check refuses on a device of this architecture ("gfx1100"): those that spill there.
std::vector<std::string> attention_refused_instances(const std::string& arch);
std::string attention_check(const AttentionArgs& a);
// The instance and grid these arguments get, or "error: ...".
std::string attention_describe(const AttentionArgs& a);
std::string attention_forward(const AttentionArgs& a);

// ---------------------------------------------------------------------------------------------
// ck_backend.hip: the Composable Kernel instances built into _C (ROCm builds with CK headers only;
// elsewhere the lists are empty). Each list takes a GPU arch (gcnArchName, target features allowed): the
// instances with code for it (XDL ones on CDNA, WMMA ones on RDNA3/4, GroupNorm everywhere), or, for "",
// every instance in the build. GroupNorm(+SiLU) over channels_last fp16 x, fp16 gamma/beta.
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
