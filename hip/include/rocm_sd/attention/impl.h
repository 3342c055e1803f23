// Internals shared by the attention kernel families that hip/attention/attention.hip dispatches between:
//   narrow (attention.hip):      each wave owns 16-query tiles and the whole head dim (up to 160): Q and the
//                                output accumulators live in one wave's registers.
//   wide (attention_wide.hip):   the waves of a block share 16-query tiles and split the head dim (the VAE's
//                                512-dim mid-block attention), exchanging partial scores in shared memory.
#pragma once

#include "rocm_sd/async_copy.h"
#include "rocm_sd/attention/wave_mma.h"
#include "rocm_sd/common.h"
#include "rocm_sd/compat.h"
#if !RSD_RTC  // host side; runtime compilation (rocm_sd/jit/) takes the kernels only (rocm_sd/rtc.h)
#include <cstdint>

#include "rocm_sd/attention/api.h"
#include "rocm_sd/launch.h"
#endif

namespace rsd {
namespace attn {

template <class T>
struct Params {
  const T* q;
  const T* k;
  const T* v;
  T* out;
  int64_t q_stride[3], k_stride[3], v_stride[3], out_stride[3];
  int q_len, kv_len, head_dim;
  float scale_log2;  // scale * log2(e): the softmax runs on exp2
};

#if !RSD_RTC
template <class T>
Params<T> make_params(const AttentionArgs& a) {
  Params<T> p;
  p.q = static_cast<const T*>(a.q);
  p.k = static_cast<const T*>(a.k);
  p.v = static_cast<const T*>(a.v);
  p.out = static_cast<T*>(a.out);
  for (int i = 0; i < 3; ++i) {
    p.q_stride[i] = a.q_stride[i];
    p.k_stride[i] = a.k_stride[i];
    p.v_stride[i] = a.v_stride[i];
    p.out_stride[i] = a.out_stride[i];
  }
  p.q_len = int(a.q_len);
  p.kv_len = int(a.kv_len);
  p.head_dim = int(a.head_dim);
  p.scale_log2 = a.scale * 1.4426950408889634f;
  return p;
}

// rows x DP elements from global (row stride `stride`, 16-byte vectors) into shared rows of LD elements,
// asynchronously where the target can (compat.h). Rows at or past `valid` and columns at or past head_dim
// are written as zeros: padding that Q K^T and P V then ignore, and finite V rows for a zero probability.
#endif

template <class T, int DP, int LD>
__device__ __forceinline__ void load_rows(T* smem, const T* src, int64_t stride, int valid, int rows, int head_dim,
                                          int tid, int threads) {
  constexpr int kVectors = DP / 8;
  for (int idx = tid; idx < rows * kVectors; idx += threads) {
    const int row = idx / kVectors, col = (idx % kVectors) * 8;
    const bool inside = row < valid && col < head_dim;
    copy16_async(smem + row * LD + col, inside ? src + row * stride + col : src, inside);
  }
}

// The same tile stored transposed: element (row, col) at smem[col * LD + row], so that each head dim's keys are
// one shared-memory row (the RDNA policies' V operand, wave_mma.h kVTransposed). A thread reads 4 rows x 8 columns
// (four 16-byte loads) and writes each column's 4 elements as one 8-byte store. rows and LD: multiples of 4.
template <class T, int DP, int LD>
__device__ __forceinline__ void load_rows_transposed(T* smem, const T* src, int64_t stride, int valid, int rows,
                                                     int head_dim, int tid, int threads) {
  static_assert(sizeof(T) == 2 && LD % 4 == 0, "16-bit elements, 8-byte aligned rows");
  constexpr int kVectors = DP / 8;
  for (int idx = tid; idx < rows / 4 * kVectors; idx += threads) {
    const int row = idx / kVectors * 4, col = (idx % kVectors) * 8;
    Vec<uint32_t, 4> x[4];  // rows row..row + 3, columns col..col + 7 in pairs (the lower column in the low half)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      x[r] = Vec<uint32_t, 4>{{0u, 0u, 0u, 0u}};
      if (row + r < valid && col < head_dim)
        x[r] = load_vec<uint32_t, 4>(reinterpret_cast<const uint32_t*>(src + (row + r) * stride + col));
    }
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      const int shift = 16 * (c % 2);
      auto element = [&](int r) { return (x[r].v[c / 2] >> shift) & 0xffffu; };
      const Vec<uint32_t, 2> pairs{{element(0) | (element(1) << 16), element(2) | (element(3) << 16)}};
      *reinterpret_cast<Vec<uint32_t, 2>*>(smem + (col + c) * LD + row) = pairs;
    }
  }
}

#if defined(RSD_HAS_WAVE_MMA)
// One tile of keys through the online softmax, for one 16-query tile of a wave (both families): masks the keys at
// or past `valid` (of kBlockN = 16 kKeyTiles), raises the running max, rescales the running sums and the output
// accumulators by how much it grew, and turns the scores into probabilities (in place). The state is kept in raw
// score units (scale > 0 commutes with max); the scale is applied inside exp2's argument as one fma.
template <class Mma, int kKeyTiles, int kSlices>
__device__ __forceinline__ void online_softmax(typename Mma::Acc (&scores)[kKeyTiles], int valid, float scale_log2,
                                               float (&row_max)[Mma::kSlots], float (&row_sum)[Mma::kSlots],
                                               typename Mma::Acc (&out)[kSlices]) {
  constexpr int kBlockN = 16 * kKeyTiles, kSlots = Mma::kSlots;
  constexpr int kElems = int(sizeof(typename Mma::Acc) / sizeof(float));
  float tile_max[kSlots];
#pragma unroll
  for (int slot = 0; slot < kSlots; ++slot) tile_max[slot] = row_max[slot];
#pragma unroll
  for (int n = 0; n < kKeyTiles; ++n)
#pragma unroll
    for (int i = 0; i < kElems; ++i) {
      if (valid < kBlockN && 16 * n + Mma::s_key(i) >= valid) scores[n].v[i] = -INFINITY;
      tile_max[Mma::s_slot(i)] = fmaxf(tile_max[Mma::s_slot(i)], scores[n].v[i]);
    }
  float rescale[kSlots], max_scaled[kSlots];
#pragma unroll
  for (int slot = 0; slot < kSlots; ++slot) {
    const float new_max = Mma::row_max(tile_max[slot]);
    rescale[slot] = fast_exp2((row_max[slot] - new_max) * scale_log2);  // 0 on the first tile (-inf)
    row_max[slot] = new_max;
    max_scaled[slot] = new_max * scale_log2;
    row_sum[slot] *= rescale[slot];
  }
#pragma unroll
  for (int n = 0; n < kKeyTiles; ++n)
#pragma unroll
    for (int i = 0; i < kElems; ++i) {
      const float prob = fast_exp2(fmaf(scores[n].v[i], scale_log2, -max_scaled[Mma::s_slot(i)]));
      scores[n].v[i] = prob;
      row_sum[Mma::s_slot(i)] += prob;  // this lane's share; summed across the row's lanes at the end
    }
#pragma unroll
  for (int s = 0; s < kSlices; ++s)
#pragma unroll
    for (int i = 0; i < kElems; ++i) out[s].v[i] *= rescale[Mma::o_slot(i)];
}

// The finished output of one 16-query tile: out / row sum, written at queries query0.. and dims dim0.. of `o`
// (one (batch, head) of the output), inside q_len x head_dim.
template <class Mma, int kSlices, class T>
__device__ __forceinline__ void store_output(T* o, int64_t row_stride, int query0, int dim0, int q_len, int head_dim,
                                             const typename Mma::Acc (&out)[kSlices],
                                             const float (&row_sum)[Mma::kSlots]) {
  constexpr int kElems = int(sizeof(typename Mma::Acc) / sizeof(float));
  float inv_sum[Mma::kSlots];
#pragma unroll
  for (int slot = 0; slot < Mma::kSlots; ++slot) inv_sum[slot] = 1.f / Mma::row_sum(row_sum[slot]);
#pragma unroll
  for (int s = 0; s < kSlices; ++s)
#pragma unroll
    for (int i = 0; i < kElems; ++i) {
      const int query = query0 + Mma::slot_row(Mma::o_slot(i)), dim = dim0 + 16 * s + Mma::o_dim(i);
      if (query < q_len && dim < head_dim)
        o[int64_t(query) * row_stride + dim] = from_float<T>(out[s].v[i] * inv_sum[Mma::o_slot(i)]);
    }
}
#endif

// One compiled kernel configuration, named by its parameters for the tuner:
// "<dtype>_d<padded head dim>_w<waves>_r<16-query tiles a wave>_n<keys a tile>", wide ones "..._wide", those of
// less shared memory "..._kv<K / V tiles>" (attention.hip's SharedPlan).
#if !RSD_RTC
struct Instance {
  const char* name;
  DType dtype;
  int padded_dim, waves, rows, block_n;
  int kv_tiles;  // the K / V tiles a block keeps in shared memory (SharedPlan's kKvTiles); 0: the family's plan
  int block_m;  // queries a block owns
  void (*launch)(const AttentionArgs&, int wave_size, hipStream_t);
};

// The wide family's instances (attention_wide.hip).
const Instance* wide_instances(int* count);
#endif

}  // namespace attn
}  // namespace rsd
