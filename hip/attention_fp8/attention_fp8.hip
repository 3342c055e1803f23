// Attention with FP8 products (rocm_sd/attention_fp8/api.h), in two steps:
//
//   1. quantize: Q and K rows (one scale per token and head) into padded byte rows [b][h][token][DP]; V per
//      channel (one scale per head dim over all keys: P V reduces over keys, so V's scale must not vary along
//      them) transposed into [b][h][dim][key]. Three kernels: rows (Q, then K), V's channel maxima, V's bytes.
//   2. attend: rocm_sd::attention's flash loop (online softmax in fp32, no Lq x Lk matrix) on FP8 operands
//      (rocm_sd/attention_fp8/wave_mma_fp8.h): S = Q8 K8^T times the two row scales, P = softmax as p * fmax in
//      FP8, O = P8 V8 times V's channel scale / fmax / the row sum.
//
// The padding is zeros, so the attention reads whole tiles without bounds checks: keys past kv_len are masked in
// the softmax (their zero V columns keep the products finite), queries past q_len are never stored.
#include "rocm_sd/async_copy.h"
#include "rocm_sd/attention/impl.h"
#include "rocm_sd/attention_fp8/wave_mma_fp8.h"
#include "rocm_sd/quantize/encode.h"
#if !RSD_RTC
#include <cstdlib>
#include <string>

#include "rocm_sd/attention/args_check.h"
#include "rocm_sd/attention_fp8/api.h"
#include "rocm_sd/device.h"
#include "rocm_sd/launch.h"
#include "rocm_sd/runtime.h"
#endif

namespace rsd {
namespace {

constexpr int kMaxHeadDim = 160;
constexpr int kQueryPad = 128;  // q_len is padded to the largest block of queries
constexpr int kKeyPad = 64;     // kv_len to the largest tile of keys
constexpr int kThreads = 256;

// Where each quantized tensor lives in the workspace (byte offsets; bh = batch * heads).
struct Fp8Layout {
  int64_t dp, q_pad, kv_pad;
  int64_t q8, k8, vt8, q_scale, k_scale, v_amax, v_scale, bytes;
};

struct Fp8Params {
  const uint8_t* q8;  // [bh][q_pad][DP]
  const uint8_t* k8;  // [bh][kv_pad][DP]
  const uint8_t* vt8;  // [bh][DP][kv_pad]
  const float* q_scale;  // [bh][q_pad]
  const float* k_scale;  // [bh][kv_pad]
  const float* v_scale;  // [bh][DP]
  void* out;
  int64_t out_stride[3];
  int heads, q_len, kv_len, q_pad, kv_pad, head_dim;
  float scale_log2;
};

// ---- step 1: quantize ---------------------------------------------------------------------------------

// One wave per row (b, h, token) of Q or K, token < len_pad: its head_dim elements (8 a lane) to DP bytes and
// one scale; the padding (dims past head_dim, tokens past len) is zero codes with scale 0.
template <class T>
__global__ void __launch_bounds__(kThreads)
    quantize_token_rows(const T* __restrict__ x, int64_t stride_b, int64_t stride_l, int64_t stride_h, int heads,
                        int len, int len_pad, int head_dim, int dp, int64_t rows, uint8_t* __restrict__ q8,
                        float* __restrict__ scale, QuantFormat format) {
  const int64_t row = int64_t(blockIdx.x) * (kThreads / RSD_WAVE) + wave_id();
  if (row >= rows) return;  // whole waves leave together
  const int token = int(row % len_pad);
  const int64_t bh = row / len_pad;
  const int64_t b = bh / heads, h = bh % heads;
  const int col = 8 * lane_id();
  const bool inside = token < len && col < head_dim;
  Vec<T, 8> v;
  if (inside) v = load_vec<T, 8>(x + b * stride_b + int64_t(token) * stride_l + h * stride_h + col);
  float amax = 0.f;
  if (inside)
#pragma unroll
    for (int e = 0; e < 8; ++e) amax = absmax_nan(amax, to_float(v.v[e]));
  amax = wave_absmax(amax);
  float* row_scale_out = scale + row;
  const float inv = scale_from_amax(amax, format, row_scale_out, lane_id() == 0 && token < len);
  if (lane_id() == 0 && token >= len) *row_scale_out = 0.f;
  if (col < dp) {
    Vec<uint8_t, 8> codes;
    if (inside) codes = encode_vec(v, inv, format);
    else
#pragma unroll
      for (int e = 0; e < 8; ++e) codes.v[e] = 0;
    store_vec(q8 + row * dp + col, codes, false);
  }
}

// max |v| per (b, h, dim) over the keys: a block takes 64 keys of one (b, h) and merges its maxima into v_amax
// (float bits as unsigned: the order of non-negative floats, NaN above every number, so a NaN survives).
template <class T>
__global__ void __launch_bounds__(kThreads)
    value_channel_amax(const T* __restrict__ v, int64_t stride_b, int64_t stride_l, int64_t stride_h, int heads,
                       int len, int head_dim, int dp, unsigned* __restrict__ v_amax) {
  __shared__ unsigned block_amax[kMaxHeadDim];
  const int64_t bh = blockIdx.y, b = bh / heads, h = bh % heads;
  const int key0 = blockIdx.x * 64, vectors = head_dim / 8;
  for (int d = threadIdx.x; d < head_dim; d += kThreads) block_amax[d] = 0u;
  __syncthreads();
  for (int idx = threadIdx.x; idx < 64 * vectors; idx += kThreads) {
    const int key = key0 + idx / vectors, col = 8 * (idx % vectors);
    if (key >= len) continue;
    const Vec<T, 8> x = load_vec<T, 8>(v + b * stride_b + int64_t(key) * stride_l + h * stride_h + col);
#pragma unroll
    for (int e = 0; e < 8; ++e) atomicMax(&block_amax[col + e], __float_as_uint(absmax_nan(0.f, to_float(x.v[e]))));
  }
  __syncthreads();
  for (int d = threadIdx.x; d < head_dim; d += kThreads) atomicMax(&v_amax[bh * dp + d], block_amax[d]);
}

// V's bytes, transposed: a block takes 64 keys of one (b, h) through shared memory and writes the [dim][key] bytes
// of those keys for every dim < DP (zeros past head_dim and past len). Block x = 0 also writes the channel scales.
template <class T>
__global__ void __launch_bounds__(kThreads)
    quantize_values(const T* __restrict__ v, int64_t stride_b, int64_t stride_l, int64_t stride_h, int heads,
                    int len, int kv_pad, int head_dim, int dp, const unsigned* __restrict__ v_amax,
                    uint8_t* __restrict__ vt8, float* __restrict__ v_scale, QuantFormat format) {
  __shared__ float tile[64][kMaxHeadDim + 1];
  __shared__ float inv[kMaxHeadDim];
  const int64_t bh = blockIdx.y, b = bh / heads, h = bh % heads;
  const int key0 = blockIdx.x * 64, vectors = head_dim / 8;
  for (int d = threadIdx.x; d < dp; d += kThreads) {
    const float amax = d < head_dim ? __uint_as_float(v_amax[bh * dp + d]) : 0.f;
    inv[d] = d < head_dim ? scale_from_amax(amax, format, v_scale + bh * dp + d, blockIdx.x == 0) : 0.f;
    if (d >= head_dim && blockIdx.x == 0) v_scale[bh * dp + d] = 0.f;
  }
  for (int idx = threadIdx.x; idx < 64 * vectors; idx += kThreads) {
    const int r = idx / vectors, col = 8 * (idx % vectors), key = key0 + r;
    Vec<T, 8> x;
    if (key < len) x = load_vec<T, 8>(v + b * stride_b + int64_t(key) * stride_l + h * stride_h + col);
#pragma unroll
    for (int e = 0; e < 8; ++e) tile[r][col + e] = key < len ? to_float(x.v[e]) : 0.f;
  }
  __syncthreads();
  uint8_t* out = vt8 + bh * dp * kv_pad + key0;
  for (int idx = threadIdx.x; idx < dp * 16; idx += kThreads) {
    const int d = idx / 16, k4 = 4 * (idx % 16);
    Vec<float, 4> x;
#pragma unroll
    for (int e = 0; e < 4; ++e) x.v[e] = d < head_dim ? tile[k4 + e][d] : 0.f;
    const Vec<uint8_t, 4> codes = encode_vec(x, inv[d], format);
    store_vec(out + int64_t(d) * kv_pad + k4, codes, false);
  }
}

// ---- step 2: attend -------------------------------------------------------------------------------------

template <int DP, int kBlockN>
struct Fp8Tiles {
  static constexpr int kLdK = DP + 16;       // bytes a key row (16 spare: the rows' words fall on distinct banks)
  static constexpr int kLdV = kBlockN + 16;  // bytes a transposed value row (a dim)
  static constexpr int kStageBytes = kBlockN * kLdK + DP * kLdV + kBlockN * 4;
  // Double-buffered where the copy is asynchronous (NVIDIA); AMD's copies are synchronous (async_copy.h), so a
  // second stage would only take LDS, and with it occupancy.
#if defined(RSD_PLATFORM_CUDA)
  static constexpr int kStages = 2 * kStageBytes <= 48 * 1024 ? 2 : 1;
#else
  static constexpr int kStages = 1;
#endif
};

template <class T, int DP, int kWaves, int kRows, int kBlockN>
__global__ void __launch_bounds__(kWaves * RSD_WAVE) attention_fp8_kernel(const Fp8Params p) {
#if defined(RSD_HAS_WAVE_MMA_FP8)
  using Mma = WaveMmaFp8;
  using Tiles = Fp8Tiles<DP, kBlockN>;
  constexpr int kWaveRows = 16 * kRows, kBlockM = kWaveRows * kWaves, kThreadsHere = kWaves * RSD_WAVE;
  constexpr int kQkSlices = DP / Mma::kQkK, kOutSlices = DP / 16, kKeyTiles = kBlockN / 16;
  constexpr int kGroups = kBlockN / Mma::kPvK, kTilesPerGroup = Mma::kPvK / 16, kSlots = Mma::kSlots;
  constexpr int kLdK = Tiles::kLdK, kLdV = Tiles::kLdV, kStageBytes = Tiles::kStageBytes;
  __shared__ __align__(16) uint8_t storage[Tiles::kStages * kStageBytes];

  const int tid = threadIdx.x, wave = rsd::wave_id();
  const int64_t bh = int64_t(blockIdx.z) * p.heads + blockIdx.y;
  const int q0 = blockIdx.x * kBlockM + kWaveRows * wave;  // this wave's first query
  const uint8_t* k8 = p.k8 + bh * p.kv_pad * DP;
  const uint8_t* vt8 = p.vt8 + bh * DP * p.kv_pad;
  const float* k_scale = p.k_scale + bh * p.kv_pad;

  typename Mma::QFrag q_frag[kRows][kQkSlices];
  float q_scale[kRows][kSlots];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const uint8_t* rows = p.q8 + (bh * p.q_pad + q0 + 16 * r) * DP;
#pragma unroll
    for (int s = 0; s < kQkSlices; ++s) q_frag[r][s] = Mma::load_q(rows, DP, s * Mma::kQkK);
#pragma unroll
    for (int slot = 0; slot < kSlots; ++slot)
      q_scale[r][slot] = p.q_scale[bh * p.q_pad + q0 + 16 * r + Mma::slot_row(slot)];
  }

  auto load_tile = [&](int key0, int stage) {
    uint8_t* keys = storage + stage * kStageBytes;
    uint8_t* values = keys + kBlockN * kLdK;
    uint8_t* scales = values + DP * kLdV;
    for (int idx = tid; idx < kBlockN * (DP / 16); idx += kThreadsHere) {
      const int row = idx / (DP / 16), col = 16 * (idx % (DP / 16));
      copy16_async(keys + row * kLdK + col, k8 + int64_t(key0 + row) * DP + col, true);
    }
    for (int idx = tid; idx < DP * (kBlockN / 16); idx += kThreadsHere) {
      const int dim = idx / (kBlockN / 16), col = 16 * (idx % (kBlockN / 16));
      copy16_async(values + dim * kLdV + col, vt8 + int64_t(dim) * p.kv_pad + key0 + col, true);
    }
    for (int idx = tid; idx < kBlockN / 4; idx += kThreadsHere) copy16_async(scales + 16 * idx, k_scale + key0 + 4 * idx, true);
    async_commit();
  };

  float row_max[kRows][kSlots], row_sum[kRows][kSlots];
  typename Mma::Acc out[kRows][kOutSlices];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int slot = 0; slot < kSlots; ++slot) {
      row_max[r][slot] = -INFINITY;
      row_sum[r][slot] = 0.f;
    }
#pragma unroll
    for (int s = 0; s < kOutSlices; ++s)
#pragma unroll
      for (auto& x : out[r][s].v) x = 0.f;
  }

  constexpr int kStages = Tiles::kStages;
  if (kStages == 2) load_tile(0, 0);
  for (int key0 = 0, stage = 0; key0 < p.kv_len; key0 += kBlockN, stage ^= (kStages - 1)) {
    const int valid = min(kBlockN, p.kv_len - key0);
    if (kStages == 1) {
      load_tile(key0, 0);
      async_wait<0>();
    } else if (key0 + kBlockN < p.kv_len) {
      load_tile(key0 + kBlockN, stage ^ 1);
      async_wait<1>();
    } else {
      async_wait<0>();
    }
    __syncthreads();
    const uint8_t* keys = storage + stage * kStageBytes;
    const uint8_t* values = keys + kBlockN * kLdK;
    const float* key_scale = reinterpret_cast<const float*>(values + DP * kLdV);

    typename Mma::Acc scores[kRows][kKeyTiles];
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int n = 0; n < kKeyTiles; ++n)
#pragma unroll
        for (auto& x : scores[r][n].v) x = 0.f;
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n)
#pragma unroll
      for (int s = 0; s < kQkSlices; ++s) {
        const typename Mma::KFrag key_frag = Mma::load_k(keys, kLdK, 16 * n, s * Mma::kQkK);
#pragma unroll
        for (int r = 0; r < kRows; ++r) Mma::scores(scores[r][n], q_frag[r][s], key_frag);
        mma_schedule_boundary();
      }
    // The quantized product times both row scales: the scores in their own units, for the online softmax.
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int n = 0; n < kKeyTiles; ++n)
#pragma unroll
        for (int i = 0; i < int(sizeof(typename Mma::Acc) / sizeof(float)); ++i)
          scores[r][n].v[i] *= key_scale[16 * n + Mma::s_key(i)] * q_scale[r][Mma::s_slot(i)];

#pragma unroll
    for (int r = 0; r < kRows; ++r)
      attn::online_softmax<Mma>(scores[r], valid, p.scale_log2, row_max[r], row_sum[r], out[r]);
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
      typename Mma::PFrag probs[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) probs[r] = Mma::to_p(&scores[r][g * kTilesPerGroup]);
#pragma unroll
      for (int s = 0; s < kOutSlices; ++s) {
        const typename Mma::VFrag value_frag = Mma::load_v(values, kLdV, g * Mma::kPvK, 16 * s);
#pragma unroll
        for (int r = 0; r < kRows; ++r) Mma::pv(out[r][s], probs[r], value_frag);
        mma_schedule_boundary();
      }
    }
    __syncthreads();  // the next loads overwrite this stage
  }

  // V's channel scale and the probabilities' fmax, then store_output divides by the row sums.
  const float* v_scale = p.v_scale + bh * DP;
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int s = 0; s < kOutSlices; ++s)
#pragma unroll
      for (int i = 0; i < int(sizeof(typename Mma::Acc) / sizeof(float)); ++i)
        out[r][s].v[i] *= v_scale[16 * s + Mma::o_dim(i)] * (1.f / Mma::kP8Max);
  T* o = static_cast<T*>(p.out) + blockIdx.z * p.out_stride[0] + int64_t(blockIdx.y) * p.out_stride[2];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
    attn::store_output<Mma>(o, p.out_stride[1], q0 + 16 * r, 0, p.q_len, p.head_dim, out[r], row_sum[r]);
#else
  rsd::trap();  // no FP8 matrix-unit policy for this target: attention_fp8_check refuses it on the host
#endif
}

// ---- host ------------------------------------------------------------------------------------------------

#if !RSD_RTC
int padded_dim(int64_t head_dim) {
  for (int dp : {32, 64, 96, 128, 160})
    if (head_dim <= dp) return dp;
  return 0;
}

Fp8Layout layout_of(const AttentionFp8Args& a) {
  Fp8Layout l{};
  const int64_t bh = a.batch * a.heads;
  l.dp = padded_dim(a.head_dim);
  l.q_pad = (a.q_len + kQueryPad - 1) / kQueryPad * kQueryPad;
  l.kv_pad = (a.kv_len + kKeyPad - 1) / kKeyPad * kKeyPad;
  int64_t at = 0;
  auto take = [&](int64_t bytes) {
    const int64_t start = at;
    at = int64_t(round_up(size_t(at + bytes), 256));
    return start;
  };
  l.q8 = take(bh * l.q_pad * l.dp);
  l.k8 = take(bh * l.kv_pad * l.dp);
  l.vt8 = take(bh * l.dp * l.kv_pad);
  l.q_scale = take(bh * l.q_pad * 4);
  l.k_scale = take(bh * l.kv_pad * 4);
  l.v_amax = take(bh * l.dp * 4);
  l.v_scale = take(bh * l.dp * 4);
  l.bytes = at;
  return l;
}

// The FP8 each architecture's matrix units take, or "" where they take none.
std::string fp8_format_of(const std::string& arch, QuantFormat* format) {
#if defined(RSD_PLATFORM_CUDA)
  const int sm = arch.rfind("sm_", 0) == 0 ? std::atoi(arch.c_str() + 3) : 0;
  if (sm >= 89) {
    *format = QuantFormat::e4m3fn;
    return "mma e4m3";
  }
#else
  for (const char* a : {"gfx940", "gfx941", "gfx942"})
    if (arch == a) {
      *format = QuantFormat::e4m3fnuz;
      return "mfma fp8";
    }
  if (arch == "gfx950") {
    *format = QuantFormat::e4m3fn;
    return "mfma fp8";
  }
  if (arch == "gfx1200" || arch == "gfx1201") {
    *format = QuantFormat::e4m3fn;
    return "wmma fp8";
  }
#endif
  return std::string();
}

const char* format_name(QuantFormat f) {
  return f == QuantFormat::e4m3fn ? "e4m3fn" : f == QuantFormat::e4m3fnuz ? "e4m3fnuz" : "int8";
}

template <class T, int DP, int kWaves, int kRows, int kBlockN>
void launch_attention(const Fp8Params& p, int64_t batch, int64_t heads, int wave_size, hipStream_t stream) {
  const dim3 grid(unsigned((p.q_len + 16 * kRows * kWaves - 1) / (16 * kRows * kWaves)), unsigned(heads), unsigned(batch));
  attention_fp8_kernel<T, DP, kWaves, kRows, kBlockN><<<grid, kWaves * wave_size, 0, stream>>>(p);
}

// One instance a padded head dim: 4 waves, 64 keys a tile; two query tiles a wave up to head dim 64 for long
// sequences (K / V reads amortised, as the 16-bit kernel's heuristic), else one.
int query_tiles_a_wave(int dp, int64_t q_len) { return dp <= 64 && q_len >= 2048 ? 2 : 1; }

template <class T>
std::string launch_for(const Fp8Params& p, int64_t batch, int64_t heads, int dp, int wave_size, hipStream_t stream) {
  const bool two_rows = query_tiles_a_wave(dp, p.q_len) == 2;
#define RSD_FP8_CASE(DP)                                                                                    \
  case DP:                                                                                                  \
    if (two_rows) launch_attention<T, DP, 4, (DP <= 64 ? 2 : 1), 64>(p, batch, heads, wave_size, stream); \
    else launch_attention<T, DP, 4, 1, 64>(p, batch, heads, wave_size, stream);                             \
    break;
  switch (dp) {
    RSD_FP8_CASE(32)
    RSD_FP8_CASE(64)
    RSD_FP8_CASE(96)
    RSD_FP8_CASE(128)
    RSD_FP8_CASE(160)
    default: return "no instance for head dim " + std::to_string(p.head_dim);
  }
#undef RSD_FP8_CASE
  return std::string();
}

#endif  // !RSD_RTC

}  // namespace

#if !RSD_RTC
int64_t attention_fp8_workspace_bytes(const AttentionFp8Args& a) {
  if (a.batch <= 0 || a.heads <= 0 || a.q_len <= 0 || a.kv_len <= 0 || padded_dim(a.head_dim) == 0) return 0;
  return layout_of(a).bytes;
}

std::string attention_fp8_check(const AttentionFp8Args& a) {
  const std::string why = attention_args_check(a, kMaxHeadDim, "the FP8 kernel's largest");
  if (!why.empty()) return why;
  if (!a.instance.empty()) return "the FP8 attention has no instance " + a.instance + " to choose (one a head dim)";
  if (!aligned(a.workspace, 256)) return "the workspace is not 256-byte aligned";
  const std::string arch = device_arch(a.device);
  if (arch.empty()) return "the runtime could not describe device " + std::to_string(a.device);
  QuantFormat format = QuantFormat::int8;
  if (fp8_format_of(arch, &format).empty())
    return "no FP8 matrix instructions on " + arch + " (mma e4m3 sm_89+, MFMA fp8 gfx940-942 / gfx950, WMMA fp8 gfx12)";
  if (a.format != format)
    return std::string("format ") + format_name(a.format) + " is not " + arch + "'s FP8 (" + format_name(format) + ")";
  return std::string();
}

namespace {
Fp8Params params_of(const AttentionFp8Args& a, const Fp8Layout& l) {
  uint8_t* ws = static_cast<uint8_t*>(a.workspace);
  Fp8Params p{};
  p.q8 = ws + l.q8;
  p.k8 = ws + l.k8;
  p.vt8 = ws + l.vt8;
  p.q_scale = reinterpret_cast<const float*>(ws + l.q_scale);
  p.k_scale = reinterpret_cast<const float*>(ws + l.k_scale);
  p.v_scale = reinterpret_cast<const float*>(ws + l.v_scale);
  p.out = a.out;
  for (int i = 0; i < 3; ++i) p.out_stride[i] = a.out_stride[i];
  p.heads = int(a.heads);
  p.q_len = int(a.q_len);
  p.kv_len = int(a.kv_len);
  p.q_pad = int(l.q_pad);
  p.kv_pad = int(l.kv_pad);
  p.head_dim = int(a.head_dim);
  p.scale_log2 = a.scale * 1.4426950408889634f;
  return p;
}

template <class T>
std::string forward_as(const AttentionFp8Args& a, const Fp8Layout& l, int wave_size, hipStream_t stream) {
  uint8_t* ws = static_cast<uint8_t*>(a.workspace);
  const int64_t bh = a.batch * a.heads;
  const int dp = int(l.dp), hd = int(a.head_dim);
  const int rows_per_block = kThreads / wave_size;
  auto rows = [&](const void* x, const int64_t (&s)[3], int64_t len, int64_t pad, int64_t q8, int64_t scale) {
    const int64_t n = bh * pad;
    quantize_token_rows<T><<<unsigned(ceil_div(n, rows_per_block)), kThreads, 0, stream>>>(
        static_cast<const T*>(x), s[0], s[1], s[2], int(a.heads), int(len), int(pad), hd, dp, n, ws + q8,
        reinterpret_cast<float*>(ws + scale), a.format);
  };
  rows(a.q, a.q_stride, a.q_len, l.q_pad, l.q8, l.q_scale);
  rows(a.k, a.k_stride, a.kv_len, l.kv_pad, l.k8, l.k_scale);
  unsigned* v_amax = reinterpret_cast<unsigned*>(ws + l.v_amax);
  hipError_t err = hipMemsetAsync(v_amax, 0, size_t(bh * dp * 4), stream);
  if (err != hipSuccess) return std::string("attention_fp8: memset failed: ") + hipGetErrorString(err);
  const dim3 value_grid(unsigned(l.kv_pad / 64), unsigned(bh));
  value_channel_amax<T><<<value_grid, kThreads, 0, stream>>>(static_cast<const T*>(a.v), a.v_stride[0], a.v_stride[1],
                                                             a.v_stride[2], int(a.heads), int(a.kv_len), hd, dp, v_amax);
  quantize_values<T><<<value_grid, kThreads, 0, stream>>>(static_cast<const T*>(a.v), a.v_stride[0], a.v_stride[1],
                                                          a.v_stride[2], int(a.heads), int(a.kv_len), int(l.kv_pad), hd,
                                                          dp, v_amax, ws + l.vt8,
                                                          reinterpret_cast<float*>(ws + l.v_scale), a.format);
  return launch_for<T>(params_of(a, l), a.batch, a.heads, dp, wave_size, stream);
}
}  // namespace

std::string attention_fp8_describe(const AttentionFp8Args& a) {
  const std::string why = attention_fp8_check(a);
  if (!why.empty()) return "error: " + why;
  const int dp = padded_dim(a.head_dim), rows = query_tiles_a_wave(dp, a.q_len);
  return std::string(a.dtype == DType::f16 ? "f16" : "bf16") + "_d" + std::to_string(dp) + "_w4_r" +
         std::to_string(rows) + "_n64 " + format_name(a.format) + " grid=" + std::to_string(ceil_div(a.q_len, 64 * rows)) +
         "x" + std::to_string(a.heads) + "x" + std::to_string(a.batch);
}

std::string attention_fp8_forward(const AttentionFp8Args& a) {
  const std::string why = attention_fp8_check(a);
  if (!why.empty()) return why;
  DeviceGuard guard(a.device);
  if (!guard.error().empty()) return guard.error();
  const Fp8Layout l = layout_of(a);
  const int wave_size = device_attribute(a.device, Attr::wave_size, 64);
  const hipStream_t stream = static_cast<hipStream_t>(a.stream);
  const std::string error = a.dtype == DType::f16 ? forward_as<__half>(a, l, wave_size, stream)
                                                  : forward_as<bf16>(a, l, wave_size, stream);
  if (!error.empty()) return error;
  const hipError_t err = hipGetLastError();
  if (err != hipSuccess) return std::string("attention_fp8 launch failed: ") + hipGetErrorString(err);
  return std::string();
}
#endif  // !RSD_RTC

}  // namespace rsd
