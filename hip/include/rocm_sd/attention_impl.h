// Internals shared by the attention kernel families that hip/attention.hip dispatches between:
//   narrow (attention.hip):      each wave owns 16-query tiles and the whole head dim (up to 160): Q and the
//                                output accumulators live in one wave's registers.
//   wide (attention_wide.hip):   the waves of a block share 16-query tiles and split the head dim (the VAE's
//                                512-dim mid-block attention), exchanging partial scores in shared memory.
#pragma once

#include <cstdint>

#include "rocm_sd/api.h"
#include "rocm_sd/common.h"
#include "rocm_sd/compat.h"
#include "rocm_sd/launch.h"

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

// One compiled kernel configuration, named by its parameters for the tuner:
// "<dtype>_d<padded head dim>_w<waves>_r<16-query tiles a wave>_n<keys a tile>", wide ones "..._wide".
struct Instance {
  const char* name;
  DType dtype;
  int padded_dim, waves, rows, block_n;
  int block_m;  // queries a block owns
  void (*launch)(const AttentionArgs&, int wave_size, hipStream_t);
};

// The wide family's instances (attention_wide.hip).
const Instance* wide_instances(int* count);

}  // namespace attn
}  // namespace rsd
