// Flash-style attention forward for the SD UNet's and VAE's attention:
//
//   out[b, i, h, :] = sum_j softmax_j(scale * q[b, i, h, :] . k[b, j, h, :]) v[b, j, h, :]
//
// q, k, v and out are [batch, seq, heads, head_dim] with any batch / sequence / head strides (the
// layout diffusers' and ComfyUI's projections produce, so no transpose copies are needed, and packed
// QKV / KV projections are strided views). One block owns kBlockM = 16 * kRows * kWaves queries of one
// (batch, head); each wave owns kRows tiles of 16 of them and walks the keys kBlockN at a time (each K / V
// fragment read from shared memory serves all the wave's query tiles): K and V tiles go through shared memory,
// double-buffered where two stages fit (the next tile's copy, cp.async on NVIDIA, runs while this one
// computes; the "_kv" instances keep fewer tiles, SharedPlan), Q stays in registers, scores and the output
// accumulate on the matrix units (wave_mma.h) in fp32, and the softmax is online (running max and sum per
// query, the output rescaled when the max grows), so no Lq x Lk matrix exists anywhere. The head dim is
// zero-padded in shared memory to DP, a multiple of 16 (SD1.5's 40 runs as 48).
//
// Head dims above 160 (the VAE's 512) run the wide family instead (attention_wide.hip), whose waves split
// the head dim. Instances of both (padded head dim x block shape x dtype) are listed by
// attention_instances() for the tuner; without one named, the heuristic in pick_instance() chooses.
#include "rocm_sd/async_copy.h"
#include "rocm_sd/attention/impl.h"
#include "rocm_sd/attention/wave_mma.h"
#if !RSD_RTC  // host side; runtime compilation (rocm_sd/jit/) takes the kernels only (rocm_sd/rtc.h)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "rocm_sd/attention/args_check.h"
#include "rocm_sd/device.h"
#include "rocm_sd/runtime.h"  // device_arch
#endif

namespace rsd {
namespace {

#if !RSD_RTC
using attn::Instance;
#endif
using attn::load_rows;
using attn::Params;

constexpr int kMaxNarrowDim = 160;  // the narrow family's largest padded head dim
constexpr int kMaxHeadDim = 512;    // the wide family's

// What a block keeps in shared memory, in elements (DP: padded head dim, LD = DP + 8 its row stride): K and V
// tiles of kBlockN rows, double-buffered (the next tile's copy runs while this one computes) where two stages
// fit in the 48 KiB of static shared memory every target grants, else once; and, when kQInShared, the block's
// Q tile in a region of its own beside one stage, within the 64 KiB of LDS an AMD workgroup may use (AMD's
// copies are synchronous, compat.h: a second stage would only take LDS, and so occupancy, from Q). Otherwise Q
// is staged through the K / V tiles on its way into registers.
// With kVTransposed (wave_mma.h) the V tile is DP rows of kBlockN keys, of row stride kVLd: kBlockN + 4 (rows
// 8 bytes apart from the LDS banks of the row above) where that takes no more than the row-major tile, so that
// no instance loses occupancy to it, else kBlockN.
// kKvTiles, the K / V tiles of the instances named "_kv<tiles>" (0: the plan above): 2 keeps one stage where two
// would fit, 1 has K and V take turns in one tile (K's for the scores, then V's for the products: two barriers
// more a key tile) where one stage is more than half of CDNA's 64 KiB of LDS a CU. Either lets two 4-wave
// workgroups share a CU (2 waves a SIMD) where the plan above fits one; since AMD's copies are synchronous, the
// stage given up overlapped nothing there.
template <bool kQShared, bool kVTransposed, int DP, int kBlockM, int kBlockN, int kKvTiles = 0>
struct SharedPlan {
  static constexpr int kLd = DP + 8, kTile = kBlockN * kLd, kStatic = 48 * 1024 / 2, kAmdLds = 64 * 1024 / 2;
  static constexpr int kVLd = !kVTransposed ? kLd : DP * (kBlockN + 4) <= kTile ? kBlockN + 4 : kBlockN;
  static constexpr int kVTile = kVTransposed ? DP * kVLd : kTile;
  static constexpr bool kKvShared = kKvTiles == 1;        // V's tile is K's (kVTile <= kTile)
  static constexpr int kVOffset = kKvShared ? 0 : kTile;  // of V's tile in a stage
  static constexpr int kStage = kKvShared ? kTile : kTile + kVTile;
  // Decided as for two row-major tiles, so that a smaller V tile never moves Q into shared memory or adds a stage.
  static constexpr bool kQInShared = kQShared && kBlockM * kLd + 2 * kTile <= kAmdLds;
  static constexpr int kQRegion = kQInShared ? kBlockM * kLd : 0;
  static constexpr int kStages = kKvTiles == 0 && !kQInShared && 4 * kTile <= kStatic ? 2 : 1;
  static constexpr int kQStaging = kQInShared ? 0 : kBlockM * kLd;  // Q on its way through the K / V stages
  static constexpr int kElements = kQRegion + (kStages * kStage > kQStaging ? kStages * kStage : kQStaging);
  static_assert(kQInShared || kBlockM <= (kKvShared ? 1 : 2) * kStages * kBlockN,
                "the Q tile is staged in the K / V shared memory");
};
constexpr int kCdnaLdsPerCu = 64 * 1024;  // bytes (gfx90a, gfx942; gfx950 has 160 KiB)

// Q's fragments stay in registers unless the policy asks for shared memory (kQFromShared: RDNA3, whose replicated
// operands double them) and they would take more than this many VGPRs a lane: with the fp32 output accumulators
// beside them, the largest tiles spill at 64 (bench/results/amd-resources-*.md).
constexpr int kQRegisterLimit = 48;

#if defined(RSD_HAS_WAVE_MMA)
// The value operand of keys key0.. x dims d0.. from a stage's V tile, in the policy's layout: transposed (row
// stride kVLd) where kVTransposed, else row-major (kLd).
template <class Mma, class T, int kLd, int kVLd>
__device__ __forceinline__ typename Mma::VFrag value_fragment(const T* values, int key0, int d0) {
  if constexpr (Mma::kVTransposed) return Mma::template load_vt<T>(values, kVLd, key0, d0);
  else return Mma::template load_v<T>(values, kLd, key0, d0);
}
#endif

// kKvTile: empty for today's instances, else the "_kv" instances' K / V tiles (SharedPlan). A pack, so that the
// first keep their names (attention_kernel<f16,64,4,1,64>: their rows in the resource table, the JIT's name
// expressions), which a defaulted parameter would change (it is part of every name).
template <class T, int DP, int kWaves, int kRows, int kBlockN, int... kKvTile>
__global__ void __launch_bounds__(kWaves * RSD_WAVE) attention_kernel(const Params<T> p) {
  static_assert(sizeof...(kKvTile) <= 1 && ((kKvTile == 1 || kKvTile == 2) && ...), "K / V tiles: none, 2 or 1");
  constexpr int kKvTiles = (0 + ... + kKvTile);
#if defined(RSD_HAS_WAVE_MMA)
  using Mma = WaveMma;
  constexpr int kWaveRows = 16 * kRows, kBlockM = kWaveRows * kWaves, kThreads = kWaves * RSD_WAVE;
  constexpr int kSlices = DP / 16, kKeyTiles = kBlockN / 16, kSlots = Mma::kSlots;
  constexpr int kQRegisters = kRows * kSlices * int(sizeof(typename Mma::QFrag) / 4);
  constexpr bool kVTransposed = Mma::kVTransposed;
  constexpr bool kQShared = Mma::kQFromShared && kQRegisters > kQRegisterLimit;
  using Plan = SharedPlan<kQShared, kVTransposed, DP, kBlockM, kBlockN, kKvTiles>;
  constexpr int LD = Plan::kLd, kVLd = Plan::kVLd, kTile = Plan::kTile, kStage = Plan::kStage, kStages = Plan::kStages;
  constexpr bool kQInShared = Plan::kQInShared, kKvShared = Plan::kKvShared;
  // A "_kv" instance is there to fit two workgroups a CU on CDNA where the default plan fits one (Q in shared
  // memory, RDNA3's large tiles, is not CDNA's case: its LDS a workgroup is 64 KiB of 128 a WGP).
  static_assert(kKvTiles == 0 || kQInShared || 2 * 2 * Plan::kElements <= kCdnaLdsPerCu, "two workgroups a CU");
  static_assert(kKvTiles == 0 || 2 * 2 * SharedPlan<kQShared, kVTransposed, DP, kBlockM, kBlockN>::kElements >
                                     kCdnaLdsPerCu, "the default plan fits two workgroups a CU already");
  __shared__ __align__(16) uint16_t storage[Plan::kElements];
  T* const q_tile = reinterpret_cast<T*>(storage);  // Q's own region, or the first K / V stage
  T* const tiles = q_tile + Plan::kQRegion;           // stage s: keys at s kStage, values at s kStage + kVOffset

  const int tid = threadIdx.x, wave = rsd::wave_id();
  const int64_t batch = blockIdx.z, head = blockIdx.y;
  const int q0 = blockIdx.x * kBlockM;
  const T* q = p.q + batch * p.q_stride[0] + head * p.q_stride[2] + int64_t(q0) * p.q_stride[1];
  const T* k = p.k + batch * p.k_stride[0] + head * p.k_stride[2];
  const T* v = p.v + batch * p.v_stride[0] + head * p.v_stride[2];

  load_rows<T, DP, LD>(q_tile, q, p.q_stride[1], min(kBlockM, p.q_len - q0), kBlockM, p.head_dim, tid, kThreads);
  async_commit();
  async_wait<0>();
  __syncthreads();
  // The wave's kRows tiles of 16 queries: rows kWaveRows * wave + 16 * r of the block, in registers unless the
  // policy reads them from shared memory.
  const T* const wave_q = q_tile + kWaveRows * wave * LD;
  typename Mma::QFrag q_frag[kQInShared ? 1 : kRows][kQInShared ? 1 : kSlices];
  if constexpr (!kQInShared) {
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int s = 0; s < kSlices; ++s) q_frag[r][s] = Mma::template load_q<T>(wave_q + 16 * r * LD, LD, 16 * s);
    __syncthreads();
  }
  auto q_fragment = [&](int r, int s) -> typename Mma::QFrag {
    if constexpr (kQInShared) return Mma::template load_q<T>(wave_q + 16 * r * LD, LD, 16 * s);
    else return q_frag[r][s];
  };

  auto load_values = [&](T* values, int key0, int valid) {  // into a stage's V tile
    if constexpr (kVTransposed)
      attn::load_rows_transposed<T, DP, kVLd>(values, v + int64_t(key0) * p.v_stride[1], p.v_stride[1], valid,
                                              kBlockN, p.head_dim, tid, kThreads);
    else
      load_rows<T, DP, LD>(values, v + int64_t(key0) * p.v_stride[1], p.v_stride[1], valid, kBlockN, p.head_dim, tid,
                           kThreads);
  };
  auto load_tile = [&](int key0, int stage) {
    const int valid = min(kBlockN, p.kv_len - key0);
    T* keys = tiles + stage * kStage;
    load_rows<T, DP, LD>(keys, k + int64_t(key0) * p.k_stride[1], p.k_stride[1], valid, kBlockN, p.head_dim, tid, kThreads);
    if constexpr (!kKvShared) load_values(keys + kTile, key0, valid);  // else after the scores (the loop below)
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
    const T* keys = tiles + stage * kStage;
    const T* values = keys + Plan::kVOffset;

    typename Mma::Acc scores[kRows][kKeyTiles];
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int n = 0; n < kKeyTiles; ++n)
#pragma unroll
        for (auto& x : scores[r][n].v) x = 0.f;
    if constexpr (kQInShared && kRows > 1) {
      // Q's fragments from shared memory once a tile: head-dim slices outermost, each slice's Q fragments held
      // across the key tiles (every score still sums its slices in order).
#pragma unroll
      for (int s = 0; s < kSlices; ++s) {
        typename Mma::QFrag q_slice[kRows];
#pragma unroll
        for (int r = 0; r < kRows; ++r) q_slice[r] = q_fragment(r, s);
#pragma unroll
        for (int n = 0; n < kKeyTiles; ++n) {
          const typename Mma::KFrag key_frag = Mma::template load_k<T>(keys, LD, 16 * n, 16 * s);
#pragma unroll
          for (int r = 0; r < kRows; ++r) Mma::template scores<T>(scores[r][n], q_slice[r], key_frag);
          mma_schedule_boundary();
        }
      }
    } else {
#pragma unroll
      for (int n = 0; n < kKeyTiles; ++n)
#pragma unroll
        for (int s = 0; s < kSlices; ++s) {
          const typename Mma::KFrag key_frag = Mma::template load_k<T>(keys, LD, 16 * n, 16 * s);  // shared by the rows
#pragma unroll
          for (int r = 0; r < kRows; ++r) Mma::template scores<T>(scores[r][n], q_fragment(r, s), key_frag);
          mma_schedule_boundary();
        }
    }

#pragma unroll
    for (int r = 0; r < kRows; ++r)
      attn::online_softmax<Mma>(scores[r], valid, p.scale_log2, row_max[r], row_sum[r], out[r]);
    if constexpr (kKvShared) {
      __syncthreads();  // every wave is done with K: V takes its tile
      load_values(tiles, key0, valid);
      async_commit();
      async_wait<0>();
      __syncthreads();
    }
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n) {
      typename Mma::PFrag probs[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) probs[r] = Mma::template to_p<T>(scores[r][n]);
#pragma unroll
      for (int s = 0; s < kSlices; ++s) {
        const typename Mma::VFrag value_frag = value_fragment<Mma, T, LD, kVLd>(values, 16 * n, 16 * s);
#pragma unroll
        for (int r = 0; r < kRows; ++r) Mma::template pv<T>(out[r][s], probs[r], value_frag);
        mma_schedule_boundary();
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

#if !RSD_RTC
template <class T, int DP, int kWaves, int kRows, int kBlockN, int kKvTiles>
void launch_instance(const AttentionArgs& a, int wave_size, hipStream_t stream) {
  const dim3 grid(unsigned(ceil_div(a.q_len, 16 * kRows * kWaves)), unsigned(a.heads), unsigned(a.batch));
  if constexpr (kKvTiles == 0)
    attention_kernel<T, DP, kWaves, kRows, kBlockN><<<grid, kWaves * wave_size, 0, stream>>>(attn::make_params<T>(a));
  else
    attention_kernel<T, DP, kWaves, kRows, kBlockN, kKvTiles><<<grid, kWaves * wave_size, 0, stream>>>(
        attn::make_params<T>(a));
}

#define RSD_ATTENTION_INSTANCE(TYPE, CODE, DP, WAVES, ROWS, BLOCK_N, KV_TILES, SUFFIX)                         \
  Instance {                                                                                                  \
    #CODE "_d" #DP "_w" #WAVES "_r" #ROWS "_n" #BLOCK_N SUFFIX, DType::CODE, DP, WAVES, ROWS, BLOCK_N, KV_TILES, \
        16 * ROWS * WAVES, &launch_instance<TYPE, DP, WAVES, ROWS, BLOCK_N, KV_TILES>                         \
  }
#define RSD_ATTENTION_SHAPE(DP, ROWS, BLOCK_N)                     \
  RSD_ATTENTION_INSTANCE(__half, f16, DP, 4, ROWS, BLOCK_N, 0, ""), \
      RSD_ATTENTION_INSTANCE(bf16, bf16, DP, 4, ROWS, BLOCK_N, 0, "")
#define RSD_ATTENTION_DIM(DP) RSD_ATTENTION_SHAPE(DP, 1, 64), RSD_ATTENTION_SHAPE(DP, 1, 32)
// Two query tiles a wave (32 queries) halve the shared-memory reads per product. Their accumulators fit in
// the registers (no spills on sm_90) with 64 keys a tile up to head dim 80 (SD's 40 / 64 / 80, the large
// self-attentions), with 32 keys up to 96.
#define RSD_ATTENTION_DIM_R2(DP) RSD_ATTENTION_DIM(DP), RSD_ATTENTION_SHAPE(DP, 2, 64), RSD_ATTENTION_SHAPE(DP, 2, 32)

// The instances of less shared memory ("_kv<tiles>", SharedPlan's kKvTiles): one of each shape whose plan takes
// more than half of CDNA's 64 KiB of LDS a CU, which leaves gfx90a / gfx942 one 4-wave workgroup a CU (1 wave a
// SIMD: bench/results/amd-resources-*.md), with the most K / V tiles that fit two: one stage of 64 keys at head
// dims 64 / 80 and of 32 at 128 / 160; at 128 / 160 with 64 keys one stage is too large, and K and V share a tile.
// The heuristic never picks them (no AMD GPU timed them); the tuner times them beside the others.
#define RSD_ATTENTION_KV(DP, ROWS, BLOCK_N, KV_TILES)                                       \
  RSD_ATTENTION_INSTANCE(__half, f16, DP, 4, ROWS, BLOCK_N, KV_TILES, "_kv" #KV_TILES), \
      RSD_ATTENTION_INSTANCE(bf16, bf16, DP, 4, ROWS, BLOCK_N, KV_TILES, "_kv" #KV_TILES)
#define RSD_ATTENTION_KV_R2(DP) RSD_ATTENTION_KV(DP, 1, 64, 2), RSD_ATTENTION_KV(DP, 2, 64, 2)
#define RSD_ATTENTION_KV_SHARED(DP) RSD_ATTENTION_KV(DP, 1, 64, 1), RSD_ATTENTION_KV(DP, 1, 32, 2)
// Defined before kNarrow, so that their kernels come first in the code objects and kNarrow's keep their places
// (a kernel's count of instructions in the resource table includes the padding that follows it).
const Instance kNarrowKv[] = {RSD_ATTENTION_KV_R2(64), RSD_ATTENTION_KV_R2(80), RSD_ATTENTION_KV_SHARED(128),
                              RSD_ATTENTION_KV_SHARED(160)};

const Instance kNarrow[] = {RSD_ATTENTION_DIM_R2(32), RSD_ATTENTION_DIM_R2(48), RSD_ATTENTION_DIM_R2(64),
                            RSD_ATTENTION_DIM_R2(80), RSD_ATTENTION_DIM(96),
                            RSD_ATTENTION_DIM(128),   RSD_ATTENTION_DIM(160)};

// Both families, narrow first (those of less shared memory after the others).
const std::vector<Instance>& all_instances() {
  static const std::vector<Instance> all = [] {
    std::vector<Instance> list(std::begin(kNarrow), std::end(kNarrow));
    list.insert(list.end(), std::begin(kNarrowKv), std::end(kNarrowKv));
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

// Which matrix-unit policy (wave_mma.h) an architecture has.
enum class MatrixUnits : int { unknown = 0, none, nv, cdna, rdna3, rdna4 };

MatrixUnits matrix_units_of(const std::string& arch) {
  if (arch.empty()) return MatrixUnits::unknown;
#if defined(RSD_PLATFORM_CUDA)
  if (arch.rfind("sm_", 0) == 0 && std::atoi(arch.c_str() + 3) >= 80) return MatrixUnits::nv;
#else
  for (const char* a : {"gfx90a", "gfx940", "gfx941", "gfx942", "gfx950"})
    if (arch == a) return MatrixUnits::cdna;
  for (const char* a : {"gfx1100", "gfx1101", "gfx1102", "gfx1103", "gfx1150", "gfx1151"})
    if (arch == a) return MatrixUnits::rdna3;
  if (arch == "gfx1200" || arch == "gfx1201") return MatrixUnits::rdna4;
#endif
  return MatrixUnits::none;
}

MatrixUnits matrix_units(int device) { return matrix_units_of(device_arch(device)); }

// Instances that spill registers to scratch on RDNA3 (gfx11, wave32, 256 VGPRs, replicated WMMA operands) with
// clang 21, read from the code objects (bench/results/amd-resources-hipcc7.0.2-clang21.1.8.md): the wide family's
// two query tiles a wave of 128 dims (Q and the fp32 output accumulators of 2 x 8 head-dim slices). Never offered
// there; tests/test_build_rocm.py checks this rule against the table exactly (gfx12 fits them since its half-wave
// exchanges take v_permlanex16).
bool spills_on(MatrixUnits units, const Instance& inst) {
  return units == MatrixUnits::rdna3 && inst.padded_dim > kMaxNarrowDim && inst.waves == 4 && inst.rows > 1;
}

// The heuristic until the tuner says otherwise (measured on the H200 at SD's shapes,
// bench/notes/attention.md): the smallest padded head dim that holds the head; two query tiles a wave for
// long self-attention up to head dim 64 (K / V reads amortised; shorter sequences want the grid of one
// tile a wave); 64 keys a tile up to head dim 96 unless the keys are few (77 or 154 text tokens waste
// less padding in tiles of 32), else 32. Head dims above 160: the wide family's 4 waves of 128 dims with two
// query tiles (the most work per barrier; 1.15x / 1.05x SDPA at the VAE's 4096 / 16384 tokens on the H200),
// one query tile where two spill (RDNA).
const Instance* pick_instance(const AttentionArgs& a, MatrixUnits units) {
  const int dp = padded_dim(a.head_dim);
  const bool many_keys = a.kv_len > 160;
  int waves = 4, rows = dp <= 64 && many_keys && a.q_len >= 2048 ? 2 : 1;
  int block_n = dp <= 96 && many_keys ? 64 : 32;
  if (dp > kMaxNarrowDim) rows = 2, block_n = 16;
  for (int attempt = 0; attempt < 2; ++attempt, rows = 1)
    for (const Instance& inst : all_instances())
      if (inst.dtype == a.dtype && inst.padded_dim == dp && inst.waves == waves && inst.rows == rows &&
          inst.block_n == block_n && inst.kv_tiles == 0 && !spills_on(units, inst))
        return &inst;
  return nullptr;
}

const Instance* find_instance(const AttentionArgs& a, MatrixUnits units, std::string* why) {
  if (a.instance.empty()) return pick_instance(a, units);
  for (const Instance& inst : all_instances()) {
    if (a.instance != inst.name) continue;
    if (inst.dtype != a.dtype) *why = "instance " + a.instance + " is for another dtype";
    else if (inst.padded_dim < a.head_dim) *why = "instance " + a.instance + " holds a smaller head dim";
    else if (spills_on(units, inst))
      *why = "instance " + a.instance + " spills registers to scratch on " + device_arch(a.device) +
             " (bench/results/amd-resources-*.md)";
    return why->empty() ? &inst : nullptr;
  }
  *why = "no attention instance named " + a.instance;
  return nullptr;
}

#endif  // !RSD_RTC
}  // namespace

#if !RSD_RTC
std::vector<std::string> attention_instances() {
  std::vector<std::string> names;
  for (const Instance& inst : all_instances()) names.emplace_back(inst.name);
  return names;
}

std::vector<std::string> attention_refused_instances(const std::string& arch) {
  std::vector<std::string> names;
  const MatrixUnits units = matrix_units_of(arch.substr(0, arch.find(':')));
  for (const Instance& inst : all_instances())
    if (spills_on(units, inst)) names.emplace_back(inst.name);
  return names;
}

std::string attention_check(const AttentionArgs& a) {
  const std::string bad = attention_args_check(a, kMaxHeadDim, "the wide family holds at most 512");
  if (!bad.empty()) return bad;
  const MatrixUnits units = matrix_units(a.device);
  switch (units) {
    case MatrixUnits::unknown: return "the runtime could not describe device " + std::to_string(a.device);
    case MatrixUnits::none:
      return "no matrix-unit attention policy for " + device_arch(a.device) +
             " (mma sm_80+, MFMA gfx90a/gfx94x/gfx950, WMMA gfx11/gfx12)";
    default: break;
  }
  std::string why;
  const Instance* inst = find_instance(a, units, &why);
  if (!inst) return why.empty() ? "no instance for these arguments" : why;
  return std::string();
}

std::string attention_describe(const AttentionArgs& a) {
  const std::string why = attention_check(a);
  if (!why.empty()) return "error: " + why;
  std::string unused;
  const Instance* inst = find_instance(a, matrix_units(a.device), &unused);
  return std::string(inst->name) + " grid=" + std::to_string(ceil_div(a.q_len, inst->block_m)) + "x" +
         std::to_string(a.heads) + "x" + std::to_string(a.batch);
}

std::string attention_forward(const AttentionArgs& a) {
  const std::string why = attention_check(a);
  if (!why.empty()) return why;
  DeviceGuard guard(a.device);
  if (!guard.error().empty()) return guard.error();
  std::string unused;
  const Instance* inst = find_instance(a, matrix_units(a.device), &unused);
  inst->launch(a, device_attribute(a.device, Attr::wave_size, 64), static_cast<hipStream_t>(a.stream));
  const hipError_t err = hipGetLastError();
  if (err != hipSuccess) return std::string("attention launch failed: ") + hipGetErrorString(err);
  return std::string();
}

#endif  // !RSD_RTC

}  // namespace rsd
