// Flash-style attention forward for the SD UNet's and VAE's attention:
//
//   out[b, i, h, :] = sum_j softmax_j(scale * q[b, i, h, :] . k[b, j, h, :]) v[b, j, h, :]
//
// q, k, v and out are [batch, seq, heads, head_dim] with any batch / sequence / head strides (the
// layout diffusers' and ComfyUI's projections produce, so no transpose copies are needed, and packed
// QKV / KV projections are strided views). One block owns kBlockM = 16 * kRows * kWaves queries of one
// (batch, head); each wave owns kRows tiles of 16 of them and walks the keys kBlockN at a time (each K / V
// fragment read from shared memory serves all the wave's query tiles): K and V tiles go
// through shared memory, double-buffered where two stages fit (the next tile's copy, cp.async on NVIDIA,
// runs while this one computes), Q stays in registers, scores and the output accumulate on the matrix units
// (wave_mma.h) in fp32, and the softmax is online (running max and sum per query, the output rescaled
// when the max grows), so no Lq x Lk matrix exists anywhere. The head dim is zero-padded in shared
// memory to DP, a multiple of 16 (SD1.5's 40 runs as 48).
//
// Head dims above 160 (the VAE's 512) run the wide family instead (attention_wide.hip), whose waves split
// the head dim. Instances of both (padded head dim x block shape x dtype) are listed by
// attention_instances() for the tuner; without one named, the heuristic in pick_instance() chooses.
#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "rocm_sd/attention_impl.h"
#include "rocm_sd/device.h"
#include "rocm_sd/wave_mma.h"

namespace rsd {
namespace {

using attn::Instance;
using attn::load_rows;
using attn::Params;

constexpr int kMaxNarrowDim = 160;  // the narrow family's largest padded head dim
constexpr int kMaxHeadDim = 512;    // the wide family's

// Shared-memory stages: two (the next K and V tiles load while this one computes) where two fit in the
// 48 KiB of static shared memory every target grants, else one.
template <int DP, int kBlockN>
__host__ __device__ constexpr int stages_for() {
  return 2 * 2 * kBlockN * (DP + 8) * 2 <= 48 * 1024 ? 2 : 1;
}

template <class T, int DP, int kWaves, int kRows, int kBlockN>
__global__ void __launch_bounds__(kWaves * RSD_WAVE) attention_kernel(const Params<T> p) {
#if defined(RSD_HAS_WAVE_MMA)
  using Mma = WaveMma;
  constexpr int LD = DP + 8;  // 16 bytes of padding: rows start on different banks
  constexpr int kWaveRows = 16 * kRows, kBlockM = kWaveRows * kWaves, kThreads = kWaves * RSD_WAVE;
  constexpr int kStages = stages_for<DP, kBlockN>();
  constexpr int kSlices = DP / 16, kKeyTiles = kBlockN / 16, kSlots = Mma::kSlots;
  constexpr int kTile = kBlockN * LD;  // elements of one K or V tile
  static_assert(kBlockM <= 2 * kStages * kBlockN, "the Q tile is staged in the K / V shared memory");
  __shared__ __align__(16) uint16_t storage[kStages * 2 * kTile];
  T* const tiles = reinterpret_cast<T*>(storage);  // stage s: keys at 2 s kTile, values at (2 s + 1) kTile

  const int tid = threadIdx.x, wave = rsd::wave_id();
  const int64_t batch = blockIdx.z, head = blockIdx.y;
  const int q0 = blockIdx.x * kBlockM;
  const T* q = p.q + batch * p.q_stride[0] + head * p.q_stride[2] + int64_t(q0) * p.q_stride[1];
  const T* k = p.k + batch * p.k_stride[0] + head * p.k_stride[2];
  const T* v = p.v + batch * p.v_stride[0] + head * p.v_stride[2];

  load_rows<T, DP, LD>(tiles, q, p.q_stride[1], min(kBlockM, p.q_len - q0), kBlockM, p.head_dim, tid, kThreads);
  async_commit();
  async_wait<0>();
  __syncthreads();
  // The wave's kRows tiles of 16 queries: rows kWaveRows * wave + 16 * r of the block.
  typename Mma::QFrag q_frag[kRows][kSlices];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int s = 0; s < kSlices; ++s)
      q_frag[r][s] = Mma::template load_q<T>(tiles + (kWaveRows * wave + 16 * r) * LD, LD, 16 * s);
  __syncthreads();

  auto load_tile = [&](int key0, int stage) {
    const int valid = min(kBlockN, p.kv_len - key0);
    T* keys = tiles + 2 * stage * kTile;
    load_rows<T, DP, LD>(keys, k + int64_t(key0) * p.k_stride[1], p.k_stride[1], valid, kBlockN, p.head_dim, tid, kThreads);
    load_rows<T, DP, LD>(keys + kTile, v + int64_t(key0) * p.v_stride[1], p.v_stride[1], valid, kBlockN, p.head_dim,
                         tid, kThreads);
    async_commit();
  };

  // Online softmax state per query tile (attn::online_softmax).
  float row_max[kRows][kSlots], row_sum[kRows][kSlots];
  typename Mma::Acc out[kRows][kSlices];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int slot = 0; slot < kSlots; ++slot) {
      row_max[r][slot] = -INFINITY;
      row_sum[r][slot] = 0.f;
    }
#pragma unroll
    for (int s = 0; s < kSlices; ++s)
#pragma unroll
      for (auto& x : out[r][s].v) x = 0.f;
  }

  if (kStages == 2) load_tile(0, 0);
  for (int key0 = 0, stage = 0; key0 < p.kv_len; key0 += kBlockN, stage ^= (kStages - 1)) {
    const int valid = min(kBlockN, p.kv_len - key0);
    if (kStages == 1) {
      load_tile(key0, 0);
      async_wait<0>();
    } else if (key0 + kBlockN < p.kv_len) {
      load_tile(key0 + kBlockN, stage ^ 1);  // in flight while this tile computes
      async_wait<1>();
    } else {
      async_wait<0>();
    }
    __syncthreads();
    const T* keys = tiles + 2 * stage * kTile;
    const T* values = keys + kTile;

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
      for (int s = 0; s < kSlices; ++s) {
        const typename Mma::KFrag key_frag = Mma::template load_k<T>(keys, LD, 16 * n, 16 * s);  // shared by the rows
#pragma unroll
        for (int r = 0; r < kRows; ++r) Mma::template scores<T>(scores[r][n], q_frag[r][s], key_frag);
      }

#pragma unroll
    for (int r = 0; r < kRows; ++r)
      attn::online_softmax<Mma>(scores[r], valid, p.scale_log2, row_max[r], row_sum[r], out[r]);
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n) {
      typename Mma::PFrag probs[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) probs[r] = Mma::template to_p<T>(scores[r][n]);
#pragma unroll
      for (int s = 0; s < kSlices; ++s) {
        const typename Mma::VFrag value_frag = Mma::template load_v<T>(values, LD, 16 * n, 16 * s);
#pragma unroll
        for (int r = 0; r < kRows; ++r) Mma::template pv<T>(out[r][s], probs[r], value_frag);
      }
    }
    __syncthreads();  // the next loads overwrite this stage
  }

  T* o = p.out + batch * p.out_stride[0] + head * p.out_stride[2];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
    attn::store_output<Mma>(o, p.out_stride[1], q0 + kWaveRows * wave + 16 * r, 0, p.q_len, p.head_dim, out[r],
                            row_sum[r]);
#else
  rsd::trap();  // no matrix-unit policy for this target: attention_check refuses it on the host
#endif
}

// ---- instances ------------------------------------------------------------------------------------

template <class T, int DP, int kWaves, int kRows, int kBlockN>
void launch_instance(const AttentionArgs& a, int wave_size, hipStream_t stream) {
  const dim3 grid(unsigned(ceil_div(a.q_len, 16 * kRows * kWaves)), unsigned(a.heads), unsigned(a.batch));
  attention_kernel<T, DP, kWaves, kRows, kBlockN><<<grid, kWaves * wave_size, 0, stream>>>(attn::make_params<T>(a));
}

#define RSD_ATTENTION_INSTANCE(TYPE, CODE, DP, WAVES, ROWS, BLOCK_N)                                        \
  Instance {                                                                                             \
    #CODE "_d" #DP "_w" #WAVES "_r" #ROWS "_n" #BLOCK_N, DType::CODE, DP, WAVES, ROWS, BLOCK_N, 16 * ROWS * WAVES, \
        &launch_instance<TYPE, DP, WAVES, ROWS, BLOCK_N>                                                 \
  }
#define RSD_ATTENTION_SHAPE(DP, ROWS, BLOCK_N) \
  RSD_ATTENTION_INSTANCE(__half, f16, DP, 4, ROWS, BLOCK_N), RSD_ATTENTION_INSTANCE(bf16, bf16, DP, 4, ROWS, BLOCK_N)
#define RSD_ATTENTION_DIM(DP) RSD_ATTENTION_SHAPE(DP, 1, 64), RSD_ATTENTION_SHAPE(DP, 1, 32)
// Two query tiles a wave (32 queries) halve the shared-memory reads per product. Their accumulators fit in
// the registers (no spills on sm_90) with 64 keys a tile up to head dim 80 (SD's 40 / 64 / 80, the large
// self-attentions), with 32 keys up to 96.
#define RSD_ATTENTION_DIM_R2(DP) RSD_ATTENTION_DIM(DP), RSD_ATTENTION_SHAPE(DP, 2, 64), RSD_ATTENTION_SHAPE(DP, 2, 32)

const Instance kNarrow[] = {RSD_ATTENTION_DIM_R2(32), RSD_ATTENTION_DIM_R2(48), RSD_ATTENTION_DIM_R2(64),
                            RSD_ATTENTION_DIM_R2(80), RSD_ATTENTION_DIM(96),
                            RSD_ATTENTION_DIM(128),   RSD_ATTENTION_DIM(160)};

// Both families, narrow first.
const std::vector<Instance>& all_instances() {
  static const std::vector<Instance> all = [] {
    std::vector<Instance> list(std::begin(kNarrow), std::end(kNarrow));
    int wide_count = 0;
    const Instance* wide = attn::wide_instances(&wide_count);
    list.insert(list.end(), wide, wide + wide_count);
    return list;
  }();
  return all;
}

int padded_dim(int64_t head_dim) {
  for (int dp : {32, 48, 64, 80, 96, 128, 160, 512})
    if (head_dim <= dp) return dp;
  return 0;
}

// The heuristic until the tuner says otherwise (measured on the H200 at SD's shapes,
// bench/notes/attention.md): the smallest padded head dim that holds the head; two query tiles a wave for
// long self-attention up to head dim 64 (K / V reads amortised; shorter sequences want the grid of one
// tile a wave); 64 keys a tile up to head dim 96 unless the keys are few (77 or 154 text tokens waste
// less padding in tiles of 32), else 32. Head dims above 160: the wide family's 4 waves of 128 dims with two
// query tiles (the most work per barrier; 1.15x / 1.05x SDPA at the VAE's 4096 / 16384 tokens on the H200).
const Instance* pick_instance(const AttentionArgs& a) {
  const int dp = padded_dim(a.head_dim);
  const bool many_keys = a.kv_len > 160;
  int waves = 4, rows = dp <= 64 && many_keys && a.q_len >= 2048 ? 2 : 1;
  int block_n = dp <= 96 && many_keys ? 64 : 32;
  if (dp > kMaxNarrowDim) rows = 2, block_n = 16;
  for (const Instance& inst : all_instances())
    if (inst.dtype == a.dtype && inst.padded_dim == dp && inst.waves == waves && inst.rows == rows &&
        inst.block_n == block_n)
      return &inst;
  return nullptr;
}

const Instance* find_instance(const AttentionArgs& a, std::string* why) {
  if (a.instance.empty()) return pick_instance(a);
  for (const Instance& inst : all_instances()) {
    if (a.instance != inst.name) continue;
    if (inst.dtype != a.dtype) *why = "instance " + a.instance + " is for another dtype";
    else if (inst.padded_dim < a.head_dim) *why = "instance " + a.instance + " holds a smaller head dim";
    return why->empty() ? &inst : nullptr;
  }
  *why = "no attention instance named " + a.instance;
  return nullptr;
}

// The device's architecture name without feature suffixes ("gfx942", "sm_90"), or "" if the runtime cannot say.
std::string arch_of(int device) {
  DeviceInfo info;
  if (!device_info(device, &info).empty()) return std::string();
  return info.arch.substr(0, info.arch.find(':'));
}

// Which matrix-unit policy (wave_mma.h) the device's architecture has. Asked on every check, so cached
// per device (hipGetDeviceProperties is slow); a racing first call just computes the same value twice.
enum class MatrixUnits : int { unknown = 0, none, nv, cdna, rdna3 };

bool is_rdna3(const std::string& arch) {
  for (const char* a : {"gfx1100", "gfx1101", "gfx1102", "gfx1103", "gfx1150", "gfx1151"})
    if (arch == a) return true;
  return false;
}

MatrixUnits matrix_units(int device) {
  static std::array<std::atomic<int>, 64> cache{};
  const bool cacheable = device >= 0 && device < 64;
  if (cacheable && cache[device].load() != 0) return static_cast<MatrixUnits>(cache[device].load());
  const std::string arch = arch_of(device);
  if (arch.empty()) return MatrixUnits::unknown;
  MatrixUnits units = MatrixUnits::none;
#if defined(RSD_PLATFORM_CUDA)
  if (arch.rfind("sm_", 0) == 0 && std::atoi(arch.c_str() + 3) >= 80) units = MatrixUnits::nv;
#else
  for (const char* a : {"gfx90a", "gfx940", "gfx941", "gfx942", "gfx950"})
    if (arch == a) units = MatrixUnits::cdna;
  if (is_rdna3(arch)) units = MatrixUnits::rdna3;
#endif
  if (cacheable) cache[device].store(static_cast<int>(units));
  return units;
}

bool stride_ok(const int64_t (&s)[3]) { return s[0] % 8 == 0 && s[1] % 8 == 0 && s[2] % 8 == 0; }

// Instances that spill registers to scratch on RDNA3 / RDNA3.5 (gfx1100 / gfx1101 / gfx1151) with clang 21, read
// from the code objects (bench/results/amd-resources-hipcc7.0.2-clang21.1.8.md): the fp32 accumulators of a
// wave's whole rows sit at the 256-VGPR cap, worst in bf16 (gfx11 has no bf16 conversion instruction). They are
// never offered there; tests/test_build_rocm.py checks this rule against the table exactly.
bool spills_on_rdna3(const Instance& inst) {
  if (inst.padded_dim > kMaxNarrowDim) return inst.rows > 1;  // wide: two query tiles a wave
  if (inst.dtype == DType::f16)
    return inst.block_n == 64 && (inst.rows > 1 ? inst.padded_dim >= 48 : inst.padded_dim == 160);
  if (inst.padded_dim == 32) return inst.rows > 1 && inst.block_n == 64;
  return !(inst.padded_dim <= 96 && inst.rows == 1 && inst.block_n == 32);
}

}  // namespace

std::vector<std::string> attention_instances() {
  std::vector<std::string> names;
  for (const Instance& inst : all_instances()) names.emplace_back(inst.name);
  return names;
}

std::vector<std::string> attention_refused_instances(const std::string& arch) {
  std::vector<std::string> names;
  for (const Instance& inst : all_instances())
    if (is_rdna3(arch) && spills_on_rdna3(inst)) names.emplace_back(inst.name);
  return names;
}

std::string attention_check(const AttentionArgs& a) {
  if (a.dtype == DType::f32) return "float32 (the matrix-unit kernel takes float16 and bfloat16)";
  if (a.batch <= 0 || a.heads <= 0 || a.q_len <= 0 || a.kv_len <= 0 || a.head_dim <= 0) return "empty tensor";
  if (a.head_dim % 8 != 0) return "head dim " + std::to_string(a.head_dim) + " is not a multiple of 8";
  if (a.head_dim > kMaxHeadDim)
    return "head dim " + std::to_string(a.head_dim) + " > " + std::to_string(kMaxHeadDim) +
           " (the wide family holds at most 512)";
  if (a.batch > 65535 || a.heads > 65535) return "batch or heads > 65535 (grid limit)";
  if (a.q_len >= (int64_t(1) << 30) || a.kv_len >= (int64_t(1) << 30)) return "sequence of 2^30 or more";
  if (!(a.scale > 0.f) || !std::isfinite(a.scale)) return "scale is not a positive finite number";
  for (const void* ptr : {a.q, a.k, a.v, static_cast<const void*>(a.out)})
    if (!aligned(ptr, 16)) return "a data pointer is not 16-byte aligned";
  if (!stride_ok(a.q_stride) || !stride_ok(a.k_stride) || !stride_ok(a.v_stride) || !stride_ok(a.out_stride))
    return "batch, sequence or head strides not multiples of 8 elements (16-byte rows)";
  switch (matrix_units(a.device)) {
    case MatrixUnits::unknown: return "the runtime could not describe device " + std::to_string(a.device);
    case MatrixUnits::none:
      return "no matrix-unit attention policy for " + arch_of(a.device) + " (mma sm_80+, MFMA gfx90a/gfx94x, WMMA gfx11)";
    default: break;
  }
  std::string why;
  const Instance* inst = find_instance(a, &why);
  if (!inst) return why.empty() ? "no instance for these arguments" : why;
  if (matrix_units(a.device) == MatrixUnits::rdna3 && spills_on_rdna3(*inst))
    return std::string("instance ") + inst->name + " spills registers to scratch on " + arch_of(a.device) +
           " (bench/results/amd-resources-*.md)";
  return std::string();
}

std::string attention_describe(const AttentionArgs& a) {
  const std::string why = attention_check(a);
  if (!why.empty()) return "error: " + why;
  std::string unused;
  const Instance* inst = find_instance(a, &unused);
  return std::string(inst->name) + " grid=" + std::to_string(ceil_div(a.q_len, inst->block_m)) + "x" +
         std::to_string(a.heads) + "x" + std::to_string(a.batch);
}

std::string attention_forward(const AttentionArgs& a) {
  const std::string why = attention_check(a);
  if (!why.empty()) return why;
  DeviceGuard guard(a.device);
  if (!guard.error().empty()) return guard.error();
  std::string unused;
  const Instance* inst = find_instance(a, &unused);
  inst->launch(a, device_attribute(a.device, Attr::wave_size, 64), static_cast<hipStream_t>(a.stream));
  const hipError_t err = hipGetLastError();
  if (err != hipSuccess) return std::string("attention launch failed: ") + hipGetErrorString(err);
  return std::string();
}

}  // namespace rsd
