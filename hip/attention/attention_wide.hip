// Flash-style attention for head dims too large for one wave's registers: the VAE's mid-block attention
// (one head of 512 at every latent pixel: 4096 queries and keys at 512x512, 16384 at 1024x1024). PyTorch's
// flash and cuDNN paths stop at head dim 256, and on ROCm SDPA then materialises the full L x L score
// matrix (512 MB of fp16 scores at 1024x1024); this kernel keeps the memory at O(L) like the narrow one.
//
// A block of kWaves waves owns 16 * kRows queries of one (batch, head) and the waves split the head dim:
// wave w holds Q[:, slice w] in registers and accumulates O[:, slice w]. For each tile of 16 keys
//   1. every wave computes its slice's partial scores Q[:, w] K[:, w]^T (16 x 16 per query tile);
//   2. the partials meet in shared memory and every wave sums all of them in the same order, so every
//      wave holds bit-identical scores, runs the same online softmax and needs no further exchange;
//   3. every wave accumulates O[:, w] += P V[:, w].
// The key and value tiles have one shared-memory buffer each; the next tile's keys load (cp.async on
// NVIDIA) while this tile's softmax and P V run, the next values while the next scores run. Partial scores
// are stored in accumulator order (element i of lane l at i * wave + l), which is the same (query, key)
// in every wave whatever the matrix-unit policy's register layout, and conflict-free.
//
// 16 keys a tile keep K + V + partials within the 48 KiB of static shared memory every target grants (and
// the 64 KiB LDS of a CDNA CU); the instances differ in waves (dims a wave: 128 or 64) and query tiles.
#include "rocm_sd/async_copy.h"
#include "rocm_sd/attention/impl.h"
#include "rocm_sd/attention/wave_mma.h"
#if !RSD_RTC  // host side; runtime compilation (rocm_sd/jit/) takes the kernels only (rocm_sd/rtc.h)
#include <algorithm>
#endif

namespace rsd {
namespace attn {
namespace {

constexpr int kBlockN = 16;  // keys a tile

template <class T, int DP, int kWaves, int kRows>
__global__ void __launch_bounds__(kWaves * RSD_WAVE) wide_attention_kernel(const Params<T> p) {
#if defined(RSD_HAS_WAVE_MMA)
  using Mma = WaveMma;
  constexpr int LD = DP + 8;  // 16 bytes of padding: rows start on different banks
  constexpr int kBlockM = 16 * kRows, kThreads = kWaves * RSD_WAVE;
  constexpr int kSliceDims = DP / kWaves, kSlices = kSliceDims / 16, kSlots = Mma::kSlots;
  constexpr int kTile = kBlockN * LD;  // elements of the K or the V tile
  constexpr int kAccElems = int(sizeof(typename Mma::Acc) / sizeof(float));
  static_assert(kAccElems * RSD_WAVE == 256, "a 16 x 16 fp32 tile spread over the wave");
  static_assert(DP % (16 * kWaves) == 0, "each wave takes whole 16-dim slices");
  static_assert(kBlockM <= 2 * kBlockN, "the Q tile is staged in the K and V buffers");
  __shared__ __align__(16) uint16_t storage[2 * kTile];
  __shared__ float partial[kWaves * kRows * 256];  // [wave][query tile][element][lane]
  T* const keys = reinterpret_cast<T*>(storage);
  T* const values = keys + kTile;

  const int tid = threadIdx.x, wave = rsd::wave_id(), lane = rsd::lane_id();
  const int64_t batch = blockIdx.z, head = blockIdx.y;
  const int q0 = blockIdx.x * kBlockM;
  const int d_first = wave * kSliceDims;  // this wave's head-dim slice
  const T* q = p.q + batch * p.q_stride[0] + head * p.q_stride[2] + int64_t(q0) * p.q_stride[1];
  const T* k = p.k + batch * p.k_stride[0] + head * p.k_stride[2];
  const T* v = p.v + batch * p.v_stride[0] + head * p.v_stride[2];

  load_rows<T, DP, LD>(keys, q, p.q_stride[1], min(kBlockM, p.q_len - q0), kBlockM, p.head_dim, tid, kThreads);
  async_commit();
  async_wait<0>();
  __syncthreads();
  typename Mma::QFrag q_frag[kRows][kSlices];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int s = 0; s < kSlices; ++s) q_frag[r][s] = Mma::template load_q<T>(keys + 16 * r * LD, LD, d_first + 16 * s);
  __syncthreads();

  auto load_keys = [&](int key0) {
    load_rows<T, DP, LD>(keys, k + int64_t(key0) * p.k_stride[1], p.k_stride[1], min(kBlockN, p.kv_len - key0), kBlockN,
                         p.head_dim, tid, kThreads);
    async_commit();
  };
  auto load_values = [&](int key0) {
    load_rows<T, DP, LD>(values, v + int64_t(key0) * p.v_stride[1], p.v_stride[1], min(kBlockN, p.kv_len - key0),
                         kBlockN, p.head_dim, tid, kThreads);
    async_commit();
  };
  auto partial_at = [&](int w, int r, int i) -> float& { return partial[((w * kRows + r) * kAccElems + i) * RSD_WAVE + lane]; };

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

  load_keys(0);
  load_values(0);
  for (int key0 = 0; key0 < p.kv_len; key0 += kBlockN) {
    const int valid = min(kBlockN, p.kv_len - key0);
    const bool more = key0 + kBlockN < p.kv_len;
    async_wait<1>();  // this tile's keys; its values may still be in flight
    __syncthreads();

    typename Mma::Acc scores[kRows][1];  // one 16-key tile
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (auto& x : scores[r][0].v) x = 0.f;
#pragma unroll
    for (int s = 0; s < kSlices; ++s) {
      const typename Mma::KFrag key_frag = Mma::template load_k<T>(keys, LD, 0, d_first + 16 * s);
#pragma unroll
      for (int r = 0; r < kRows; ++r) Mma::template scores<T>(scores[r][0], q_frag[r][s], key_frag);
      mma_schedule_boundary();
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int i = 0; i < kAccElems; ++i) partial_at(wave, r, i) = scores[r][0].v[i];
    __syncthreads();  // the partials are visible and the key tile is free
    if (more) load_keys(key0 + kBlockN);

#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
      for (int i = 0; i < kAccElems; ++i) {
        float total = 0.f;
#pragma unroll
        for (int w = 0; w < kWaves; ++w) total += partial_at(w, r, i);  // one order for every wave
        scores[r][0].v[i] = total;
      }
      attn::online_softmax<Mma>(scores[r], valid, p.scale_log2, row_max[r], row_sum[r], out[r]);
    }
    typename Mma::PFrag probs[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) probs[r] = Mma::template to_p<T>(scores[r][0]);

    if (more)
      async_wait<1>();  // this tile's values; the next keys may still be in flight
    else
      async_wait<0>();
    __syncthreads();
#pragma unroll
    for (int s = 0; s < kSlices; ++s) {
      const typename Mma::VFrag value_frag = Mma::template load_v<T>(values, LD, 0, d_first + 16 * s);
#pragma unroll
      for (int r = 0; r < kRows; ++r) Mma::template pv<T>(out[r][s], probs[r], value_frag);
      mma_schedule_boundary();
    }
    __syncthreads();  // the value tile and the partials are free
    if (more) load_values(key0 + kBlockN);
  }

  T* o = p.out + batch * p.out_stride[0] + head * p.out_stride[2];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
    attn::store_output<Mma>(o, p.out_stride[1], q0 + 16 * r, d_first, p.q_len, p.head_dim, out[r], row_sum[r]);
#else
  rsd::trap();  // no matrix-unit policy for this target: attention_check refuses it on the host
#endif
}

#if !RSD_RTC
template <class T, int DP, int kWaves, int kRows>
void launch_wide(const AttentionArgs& a, int wave_size, hipStream_t stream) {
  const dim3 grid(unsigned(ceil_div(a.q_len, 16 * kRows)), unsigned(a.heads), unsigned(a.batch));
  wide_attention_kernel<T, DP, kWaves, kRows><<<grid, kWaves * wave_size, 0, stream>>>(make_params<T>(a));
}

#define RSD_WIDE_INSTANCE(TYPE, CODE, DP, WAVES, ROWS)                                                     \
  Instance {                                                                                               \
    #CODE "_d" #DP "_w" #WAVES "_r" #ROWS "_n16_wide", DType::CODE, DP, WAVES, ROWS, kBlockN, 0, 16 * ROWS, \
        &launch_wide<TYPE, DP, WAVES, ROWS>                                                                \
  }
#define RSD_WIDE_SHAPE(DP, WAVES, ROWS) RSD_WIDE_INSTANCE(__half, f16, DP, WAVES, ROWS), RSD_WIDE_INSTANCE(bf16, bf16, DP, WAVES, ROWS)

// 4 waves of 128 dims or 8 of 64; two query tiles a wave only with 8 waves (64 dims), where Q and the
// accumulators of both still fit in registers.
const Instance kWide[] = {RSD_WIDE_SHAPE(512, 4, 1), RSD_WIDE_SHAPE(512, 8, 1), RSD_WIDE_SHAPE(512, 4, 2)};

#endif  // !RSD_RTC
}  // namespace

#if !RSD_RTC
const Instance* wide_instances(int* count) {
  *count = int(sizeof(kWide) / sizeof(kWide[0]));
  return kWide;
}

#endif  // !RSD_RTC

}  // namespace attn
}  // namespace rsd
