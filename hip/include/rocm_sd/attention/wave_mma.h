// Wave-level matrix-unit tiles for attention (hip/attention/attention.hip), one policy per instruction family:
//
//   NvMma16816   NVIDIA sm_80+   mma.sync m16n8k16 (two per 16x16 tile), wave 32
//   CdnaMfma16   AMD CDNA        v_mfma_f32_16x16x16{f16,bf16_1k} (gfx90a/94x/950), wave 64
//   Rdna3Wmma16  AMD RDNA3       v_wmma_f32_16x16x16_{f16,bf16}_w32 (gfx11), wave 32
//   Rdna4Wmma16  AMD RDNA4       v_wmma_f32_16x16x16_{f16,bf16} (gfx12), wave 32
//
// Every policy computes, for the 16 query rows a wave owns, 16x16 tiles of
//   S = Q K^T   (scores: 16 queries x 16 keys, head-dim slice of 16 as the reduction)
//   O += P V    (16 queries x 16 head dims, 16 keys as the reduction)
// from row-major shared-memory tiles (row stride `ld` elements, rows 16-byte aligned), with fp32
// accumulation. K and V operands are fetched (load_k / load_v) apart from the products (scores / pv)
// so that a wave owning several 16-row query tiles reads each K / V fragment from shared memory once. The kernel never assumes a register layout: it asks the policy which query slot
// (s_slot / o_slot) and which key or head-dim column (s_key / o_dim) each accumulator element of the
// lane holds, and reduces a row across the lanes that share it (row_max / row_sum).
//
// The AMD policies compute the transposed products S^T = K Q^T and O^T = V^T P^T: with MFMA's and
// WMMA's layouts the transposed score accumulator is already (nearly) the operand layout P takes
// next, so P never goes through shared memory, and every lane keeps the softmax state of one query.
// Their layouts follow AMD's instruction documentation (CDNA3 ISA section 7, the AMD Matrix
// Instruction Calculator; RDNA3 ISA section 7.9 / GPUOpen's WMMA guide; RDNA4 ISA section 7.12). rocm_sd has had
// no AMD GPU to run them on: they are compile-checked (tests/test_build_rocm.py) and executed lane by lane by
// the CPU emulation (tests/amd_emulation), which is why the dispatcher uses this kernel on AMD only where the
// tuner validated it on the user's GPU (rocm_sd/ops/attention.py).
//
// kQFromShared: whether the attention kernel should read large Q tiles' fragments from shared memory for every
// product instead of keeping them in registers (hip/attention/attention.hip, kQRegisterLimit).
// kVTransposed: whether the narrow kernel stages V transposed (row d of the tile: head dim d's keys) and reads its
// operands with load_vt: RDNA's V operand is a run of keys of one head dim per lane, which the row-major tile
// can only give one 16-bit element per LDS load (load_v, still used by the wide family).
#pragma once

#include "rocm_sd/common.h"
#include "rocm_sd/compat.h"
#if !RSD_RTC  // hiprtc has std::is_same built in, rocm_sd/rtc.h gives NVRTC one
#include <type_traits>
#endif

#if defined(RSD_PLATFORM_CUDA)
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define RSD_WAVE_MMA_NV 1
#endif
#elif defined(__gfx90a__) || defined(__gfx940__) || defined(__gfx941__) || \
    defined(__gfx942__) || defined(__gfx950__)
#define RSD_WAVE_MMA_CDNA 1
#elif defined(__gfx1100__) || defined(__gfx1101__) || defined(__gfx1102__) || defined(__gfx1103__) || \
    defined(__gfx1150__) || defined(__gfx1151__)
#define RSD_WAVE_MMA_RDNA3 1
#elif defined(__gfx1200__) || defined(__gfx1201__)
#define RSD_WAVE_MMA_RDNA4 1
#endif

// Host and device passes alike: whether this compilation pass has a policy (the host pass of a HIP
// build has none of the arch macros; it launches by the device's arch, see attention.hip).
#if defined(RSD_WAVE_MMA_NV) || defined(RSD_WAVE_MMA_CDNA) || defined(RSD_WAVE_MMA_RDNA3) || \
    defined(RSD_WAVE_MMA_RDNA4)
#define RSD_HAS_WAVE_MMA 1
#endif

namespace rsd {

// 2^x for softmax: the hardware's approximate exp2 (denormal results flush to zero: irrelevant to probabilities),
// as flash-attention uses.
__device__ __forceinline__ float fast_exp2(float x) {
#if defined(RSD_PLATFORM_CUDA)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#elif (defined(RSD_WAVE_MMA_RDNA3) || defined(RSD_WAVE_MMA_RDNA4)) && defined(__has_builtin) && \
    __has_builtin(__builtin_amdgcn_exp2f)
  // v_exp_f32 alone: llvm.exp2 adds a denormal rescale around it, registers RDNA's attention tiles lack.
  return __builtin_amdgcn_exp2f(x);
#else
  return __builtin_exp2f(x);
#endif
}

// Max / sum of x over the lanes whose ids differ from this lane's only in the bits of kOffsets: the lanes
// that hold the same query row in a policy's accumulator layout.
template <int... kOffsets>
__device__ __forceinline__ float xor_max(float x) {
  ((x = fmaxf(x, rsd::shfl_xor(x, kOffsets))), ...);
  return x;
}
template <int... kOffsets>
__device__ __forceinline__ float xor_sum(float x) {
  ((x += rsd::shfl_xor(x, kOffsets)), ...);
  return x;
}

// A point the instruction scheduler may not move instructions across, on the RDNA targets: there a wave's rows
// fill the 256 VGPRs, and loads of later fragments hoisted above earlier products spill to scratch
// (bench/results/amd-resources-*.md). Elsewhere nothing.
__device__ __forceinline__ void mma_schedule_boundary() {
#if defined(RSD_WAVE_MMA_RDNA3) || defined(RSD_WAVE_MMA_RDNA4)
  __builtin_amdgcn_sched_barrier(0);  // mask 0: nothing crosses
#endif
}

template <class T>
__device__ __forceinline__ uint16_t bits_of(T v) {
  return *reinterpret_cast<const uint16_t*>(&v);
}

// Two 16-bit elements in one 32-bit register, `lo` in the low half (the lower column index).
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  return uint32_t(bits_of(from_float<T>(lo))) | (uint32_t(bits_of(from_float<T>(hi))) << 16);
}

#if defined(RSD_WAVE_MMA_NV)
// ---- NVIDIA: mma.sync.m16n8k16, lane = 4 * g + t (g: group 0..7, t: thread in group 0..3) ------------
// A (16x16, row-major): a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..), a3 = (g+8, 2t+8..)
// B (16x8, k x n):      b0 = (k 2t..2t+1, n g), b1 = (k 2t+8.., n g)
// C (16x8, fp32):       c0,c1 = (g, 2t..2t+1), c2,c3 = (g+8, 2t..2t+1)
// A 16x16 tile is two m16n8 products (n = columns 0..7 and 8..15): element i of a fragment is in
// product i / 4, row slot (i % 4) / 2 (row g or g + 8), column 8 * (i / 4) + 2t + i % 2.
struct NvMma16816 {
  static constexpr int kSlots = 2;  // query rows per lane: g and g + 8
  static constexpr bool kQFromShared = false, kVTransposed = false;
  struct QFrag { uint32_t r[4]; };
  struct Acc { float v[8]; };       // a 16x16 fp32 tile (scores or output)
  struct PFrag { uint32_t r[4]; };
  struct KFrag { uint32_t r[4]; };  // B operands of two m16n8k16 products (keys 0..7 and 8..15)
  struct VFrag { uint32_t r[4]; };  // B operands of two m16n8k16 products (dims 0..7 and 8..15)

  __device__ static int slot_row(int slot) { return rsd::lane_id() / 4 + 8 * slot; }
  __device__ static constexpr int acc_slot(int i) { return (i % 4) / 2; }
  __device__ static int acc_col(int i) { return 8 * (i / 4) + 2 * (rsd::lane_id() % 4) + i % 2; }
  __device__ static int s_key(int i) { return acc_col(i); }
  __device__ static int o_dim(int i) { return acc_col(i); }
  __device__ static constexpr int s_slot(int i) { return acc_slot(i); }
  __device__ static constexpr int o_slot(int i) { return acc_slot(i); }

  template <class T>
  __device__ static QFrag load_q(const T* q, int ld, int d0) {
    const int g = rsd::lane_id() / 4, t = rsd::lane_id() % 4;
    auto word = [&](int row, int col) { return *reinterpret_cast<const uint32_t*>(q + row * ld + d0 + col); };
    return QFrag{{word(g, 2 * t), word(g + 8, 2 * t), word(g, 2 * t + 8), word(g + 8, 2 * t + 8)}};
  }

  template <class T>
  __device__ static void mma(float* c, const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    if constexpr (sizeof(T) == 2 && std::is_same<T, __half>::value) {
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
          "{%0,%1,%2,%3};"
          : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
          "{%0,%1,%2,%3};"
          : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
  }

  // Four 8x8 16-bit matrices from shared memory: lane l names row l % 8 of matrix l / 8 and receives, of
  // each matrix, row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 (of the transpose with kTrans).
  template <bool kTrans, class T>
  __device__ static void ldmatrix_x4(uint32_t (&r)[4], const T* row) {
    const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(row));
    if constexpr (kTrans)
      asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                   : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(address));
    else
      asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                   : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(address));
  }

  // The 16 keys key0.. x dims d0.. of the key tile (row-major [key][dim]) as the B operands of S = Q K^T:
  // one ldmatrix.x4 (rows = keys) hands lane 4g + t key g's dims 2t.. and 2t + 8.. for both 8-key halves.
  template <class T>
  __device__ static KFrag load_k(const T* k, int ld, int key0, int d0) {
    const int lane = rsd::lane_id(), m = lane / 8;
    KFrag f;
    ldmatrix_x4<false>(f.r, k + (key0 + lane % 8 + 8 * (m / 2)) * ld + d0 + 8 * (m % 2));
    return f;
  }

  // s += Q[16 x (d0..d0+15)] K[key0..key0+15, d0..d0+15]^T
  template <class T>
  __device__ static void scores(Acc& s, const QFrag& q, const KFrag& k) {
    mma<T>(s.v, q.r, k.r[0], k.r[1]);
    mma<T>(s.v + 4, q.r, k.r[2], k.r[3]);
  }

  // The probabilities of a 16x16 score tile as the A operand of P V (the C layout of two m16n8 products
  // is the A layout of one m16k16: no data moves between lanes).
  template <class T>
  __device__ static PFrag to_p(const Acc& p) {
    return PFrag{{pack2<T>(p.v[0], p.v[1]), pack2<T>(p.v[2], p.v[3]), pack2<T>(p.v[4], p.v[5]),
                  pack2<T>(p.v[6], p.v[7])}};
  }

  // The 16 keys key0.. x dims d0.. of the value tile (row-major [key][dim]) as the B operands of O += P V:
  // ldmatrix.trans hands each lane the (k, n) pairs of B straight from V's rows.
  template <class T>
  __device__ static VFrag load_v(const T* v, int ld, int key0, int d0) {
    const int lane = rsd::lane_id(), m = lane / 8;
    VFrag f;
    ldmatrix_x4<true>(f.r, v + (key0 + lane % 8 + 8 * (m % 2)) * ld + d0 + 8 * (m / 2));
    return f;
  }

  // o += P[16 x (key0..key0+15)] V[key0..key0+15, d0..d0+15]
  template <class T>
  __device__ static void pv(Acc& o, const PFrag& p, const VFrag& v) {
    mma<T>(o.v, p.r, v.r[0], v.r[1]);
    mma<T>(o.v + 4, p.r, v.r[2], v.r[3]);
  }

  // Lanes 4g..4g+3 hold the same two rows.
  __device__ static float row_max(float x) { return xor_max<1, 2>(x); }
  __device__ static float row_sum(float x) { return xor_sum<1, 2>(x); }
};
using WaveMma = NvMma16816;

#endif

#if defined(RSD_WAVE_MMA_CDNA) || defined(RSD_WAVE_MMA_RDNA3) || defined(RSD_WAVE_MMA_RDNA4)
namespace amd {
// The AMD matrix builtins take clang vectors: _Float16 for f16, short (raw bits) for bf16, float for the
// accumulator. Fragments are kept as plain arrays; these convert at the builtin call.
template <int N>
using half_vec = _Float16 __attribute__((ext_vector_type(N)));
template <int N>
using short_vec = short __attribute__((ext_vector_type(N)));
template <int N>
using float_vec = float __attribute__((ext_vector_type(N)));

// N 16-bit values as the builtin's operand vector for element type T (__half -> _Float16, bf16 -> short).
template <class T, int N>
__device__ __forceinline__ auto operand(const uint16_t (&bits)[N]) {
  if constexpr (std::is_same<T, __half>::value) {
    half_vec<N> v;
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = __builtin_bit_cast(_Float16, bits[k]);
    return v;
  } else {
    short_vec<N> v;
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = short(bits[k]);
    return v;
  }
}

template <int N>
using uint_vec = uint32_t __attribute__((ext_vector_type(N)));

// The same from N 32-bit words of two packed 16-bit values each (the low half the lower index): probabilities
// are converted in pairs (pack2), which keeps bf16's software rounding at one register per pair.
template <class T, int N>
__device__ __forceinline__ auto operand(const uint32_t (&words)[N]) {
  uint_vec<N> v;
#pragma unroll
  for (int k = 0; k < N; ++k) v[k] = words[k];
  if constexpr (std::is_same<T, __half>::value)
    return __builtin_bit_cast(half_vec<2 * N>, v);
  else
    return __builtin_bit_cast(short_vec<2 * N>, v);
}

// Two probabilities as one word of 16-bit values, `lo` in the low half (pack2's layout and rounding), for RDNA3's
// to_p. f16 as one vector conversion, which gfx11 writes straight into the word's two halves where pack2's shift
// and masks take more instructions; not on gfx1151, where it costs a wave of one instance (docs/amd.md). bf16 as
// pack2: the alternatives tried took more instructions or registers (docs/amd.md).
template <class T>
__device__ __forceinline__ uint32_t pack_pair(float lo, float hi) {
#if !defined(__gfx1151__)
  if constexpr (std::is_same<T, __half>::value)
    return __builtin_bit_cast(uint32_t, half_vec<2>{static_cast<_Float16>(lo), static_cast<_Float16>(hi)});
#endif
  return pack2<T>(lo, hi);
}

template <int N>
__device__ __forceinline__ float_vec<N> accumulator(const float (&c)[N]) {
  float_vec<N> v;
#pragma unroll
  for (int k = 0; k < N; ++k) v[k] = c[k];
  return v;
}

template <int N, class Vector>  // Vector: the builtin's float vector result (not deducible as float_vec<N>)
__device__ __forceinline__ void store(float (&c)[N], const Vector& v) {
#pragma unroll
  for (int k = 0; k < N; ++k) c[k] = v[k];
}
}  // namespace amd
#endif

#if defined(RSD_WAVE_MMA_RDNA3) || defined(RSD_WAVE_MMA_RDNA4)
// x of lane l ^ 16 (the other 16-lane row of l's 32 lanes, in wave32 and wave64 alike): v_permlanex16 with identity
// lane selects (lane l reads lane l % 16 of the other row), a VALU instruction where a shuffle takes a round trip
// through the LDS unit (ds_bpermute).
__device__ __forceinline__ uint32_t swap_rows16(uint32_t x) {
  return __builtin_amdgcn_permlanex16(x, x, 0x76543210u, 0xfedcba98u, false, false);
}
__device__ __forceinline__ float swap_rows16(float x) {
  return __builtin_bit_cast(float, swap_rows16(__builtin_bit_cast(uint32_t, x)));
}

// What the RDNA3 and RDNA4 policies share: wave 32, lane = 16 h + i, every lane owns query i (lanes i and i + 16
// hold the same one), 8 fp32 accumulator elements a lane, and the transposed products S^T = K Q^T and
// O^T = V^T P^T through the policy's own mma (its instruction's builtin).
template <class Policy>
struct Wave32Wmma16 {
  static constexpr int kSlots = 1;
  static constexpr bool kVTransposed = true;
  struct Acc { float v[8]; };

  __device__ static int slot_row(int) { return rsd::lane_id() % 16; }
  __device__ static constexpr int s_slot(int) { return 0; }
  __device__ static constexpr int o_slot(int) { return 0; }

  template <class T, class QFrag, class KFrag>
  __device__ static void scores(Acc& s, const QFrag& q, const KFrag& k) { Policy::template mma<T>(s.v, k.h, q.h); }
  template <class T, class PFrag, class VFrag>
  __device__ static void pv(Acc& o, const PFrag& p, const VFrag& v) { Policy::template mma<T>(o.v, v.h, p.w); }

  __device__ static float row_max(float x) { return fmaxf(x, swap_rows16(x)); }
  __device__ static float row_sum(float x) { return x + swap_rows16(x); }
};
#endif

#if defined(RSD_WAVE_MMA_CDNA)
// ---- AMD CDNA: v_mfma_f32_16x16x16, wave 64, lane = 16 * q + i (i: 0..15, q: 0..3) ---------------------
// A (16x16, m x k): lane holds A[i][4q..4q+3];  B (k x n): B[4q..4q+3][i];  C (m x n): C[4q..4q+3][i].
// S^T = K Q^T: A = K rows (key i, dims 4q..), B = Q rows (query i, dims 4q..) -> lane holds
// S[query i][keys 4q..4q+3], which is B of O^T = V^T P^T (k = key, n = query) as it stands; A = V^T
// (lane: V[keys 4q..4q+3][dim i]); the result O^T lane holds O[query i][dims 4q..4q+3].
// What the CDNA policies share (this one, and the FP8 one of rocm_sd/attention_fp8/wave_mma_fp8.h): every lane owns
// query i, and a 16x16 fp32 accumulator of the transposed products holds, in lane (q, i), keys or dims 4q..4q+3 of
// query i.
struct Wave64Mfma16 {
  static constexpr int kSlots = 1;
  struct Acc { float v[4]; };

  __device__ static int slot_row(int) { return rsd::lane_id() % 16; }
  __device__ static constexpr int s_slot(int) { return 0; }
  __device__ static constexpr int o_slot(int) { return 0; }
  __device__ static int s_key(int i) { return 4 * (rsd::lane_id() / 16) + i; }
  __device__ static int o_dim(int i) { return 4 * (rsd::lane_id() / 16) + i; }

  // Lanes i, i + 16, i + 32, i + 48 hold the same query.
  __device__ static float row_max(float x) { return xor_max<16, 32>(x); }
  __device__ static float row_sum(float x) { return xor_sum<16, 32>(x); }
};

struct CdnaMfma16 : Wave64Mfma16 {
  static constexpr bool kQFromShared = false, kVTransposed = false;
  struct QFrag { uint16_t h[4]; };
  struct PFrag { uint16_t h[4]; };
  struct KFrag { uint16_t h[4]; };  // A of S^T = K Q^T: key i, dims 4q..4q+3
  struct VFrag { uint16_t h[4]; };  // A of O^T = V^T P^T: dim i, keys 4q..4q+3

  template <class T>
  __device__ static QFrag load_q(const T* q, int ld, int d0) {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(q + (rsd::lane_id() % 16) * ld + d0 + 4 * (rsd::lane_id() / 16));
    return QFrag{{p[0], p[1], p[2], p[3]}};
  }

  template <class T>
  __device__ static void mma(float (&c)[4], const uint16_t (&a)[4], const uint16_t (&b)[4]) {
    const amd::float_vec<4> acc = amd::accumulator(c);
    if constexpr (std::is_same<T, __half>::value)
      amd::store(c, __builtin_amdgcn_mfma_f32_16x16x16f16(amd::operand<T>(a), amd::operand<T>(b), acc, 0, 0, 0));
    else
      amd::store(c, __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(amd::operand<T>(a), amd::operand<T>(b), acc, 0, 0, 0));
  }

  template <class T>
  __device__ static KFrag load_k(const T* k, int ld, int key0, int d0) {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(k + (key0 + rsd::lane_id() % 16) * ld + d0 + 4 * (rsd::lane_id() / 16));
    return KFrag{{p[0], p[1], p[2], p[3]}};
  }

  template <class T>
  __device__ static void scores(Acc& s, const QFrag& q, const KFrag& k) { mma<T>(s.v, k.h, q.h); }

  template <class T>
  __device__ static PFrag to_p(const Acc& p) {
    PFrag f;
#pragma unroll
    for (int k = 0; k < 4; ++k) f.h[k] = bits_of(from_float<T>(p.v[k]));
    return f;
  }

  template <class T>
  __device__ static VFrag load_v(const T* v, int ld, int key0, int d0) {
    const uint16_t* col = reinterpret_cast<const uint16_t*>(v + (key0 + 4 * (rsd::lane_id() / 16)) * ld + d0 + rsd::lane_id() % 16);
    return VFrag{{col[0], col[ld], col[2 * ld], col[3 * ld]}};
  }

  template <class T>
  __device__ static void pv(Acc& o, const PFrag& p, const VFrag& v) { mma<T>(o.v, v.h, p.h); }
};
using WaveMma = CdnaMfma16;

#elif defined(RSD_WAVE_MMA_RDNA3)
// ---- AMD RDNA3: v_wmma_f32_16x16x16_*_w32, wave 32, lane = 16 * h + i (i: 0..15, h: 0..1) ---------------
// A (m x k): lane holds A[i][0..15] (both halves of the wave the same); B (k x n): B[0..15][i];
// C (m x n, 8 floats): element e is C[2e + h][i].
// S^T = K Q^T: lane holds S[query i][keys 2e + h]. O^T = V^T P^T needs B = P^T with all 16 keys of
// query i in one lane: the other 8 come from lane i + 16 (h flipped), converted to 16 bits there, one
// v_permlanex16 per pair.
struct Rdna3Wmma16 : Wave32Wmma16<Rdna3Wmma16> {
  // Replicated operands make a Q fragment 8 VGPRs a lane per 16 head dims, as many as the fp32 output
  // accumulators: at large head dims Q is better read from shared memory (hip/attention/attention.hip kQRegisterLimit).
  static constexpr bool kQFromShared = true;
  struct QFrag { uint16_t h[16]; };
  struct PFrag { uint32_t w[8]; };  // packed pairs
  struct KFrag { uint16_t h[16]; };  // A of S^T = K Q^T: key i, dims 0..15
  struct VFrag { uint16_t h[16]; };  // A of O^T = V^T P^T: dim i, keys 0..15

  __device__ static int s_key(int e) { return 2 * e + rsd::lane_id() / 16; }
  __device__ static int o_dim(int e) { return 2 * e + rsd::lane_id() / 16; }

  template <class T>
  __device__ static QFrag load_q(const T* q, int ld, int d0) {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(q + (rsd::lane_id() % 16) * ld + d0);
    QFrag f;
#pragma unroll
    for (int k = 0; k < 16; ++k) f.h[k] = p[k];
    return f;
  }

  template <class T, class A, class B>
  __device__ static void mma(float (&c)[8], const A& a, const B& b) {
    const amd::float_vec<8> acc = amd::accumulator(c);
    if constexpr (std::is_same<T, __half>::value)
      amd::store(c, __builtin_amdgcn_wmma_f32_16x16x16_f16_w32(amd::operand<T>(a), amd::operand<T>(b), acc));
    else
      amd::store(c, __builtin_amdgcn_wmma_f32_16x16x16_bf16_w32(amd::operand<T>(a), amd::operand<T>(b), acc));
  }

  template <class T>
  __device__ static KFrag load_k(const T* k, int ld, int key0, int d0) {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(k + (key0 + rsd::lane_id() % 16) * ld + d0);
    KFrag f;
#pragma unroll
    for (int j = 0; j < 16; ++j) f.h[j] = p[j];
    return f;
  }

  // Each lane converts its own 8 probabilities (keys 2e + h) into 4 words of pairs, keys 4j + h and 4j + 2 + h,
  // and trades them with lane i ^ 16 for keys 4j + 1 - h and 4j + 3 - h; word 2j of the operand is then keys
  // 4j, 4j + 1 (the low halves of both words, the lower key's first) and word 2j + 1 keys 4j + 2, 4j + 3.
  // The two merges are byte permutes (v_perm_b32: selector bytes 0-3 name bytes of its second operand, 4-7 of its
  // first) whose selectors differ between the half-waves.
  template <class T>
  __device__ static PFrag to_p(const Acc& p) {
    const bool upper = rsd::lane_id() >= 16;
    const uint32_t even = upper ? 0x01000504u : 0x05040100u, odd = upper ? 0x03020706u : 0x07060302u;
    PFrag f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t mine = amd::pack_pair<T>(p.v[2 * j], p.v[2 * j + 1]), other = swap_rows16(mine);
      f.w[2 * j] = __builtin_amdgcn_perm(other, mine, even);
      f.w[2 * j + 1] = __builtin_amdgcn_perm(other, mine, odd);
    }
    return f;
  }

  template <class T>
  __device__ static VFrag load_v(const T* v, int ld, int key0, int d0) {
    const uint16_t* col = reinterpret_cast<const uint16_t*>(v + key0 * ld + d0 + rsd::lane_id() % 16);
    VFrag f;
#pragma unroll
    for (int j = 0; j < 16; ++j) f.h[j] = col[j * ld];
    return f;
  }

  // The same operand from the transposed value tile (row d: dim d's keys, 8-byte aligned rows): 16 consecutive
  // keys of dim d0 + i, a K fragment of the transpose.
  template <class T>
  __device__ static VFrag load_vt(const T* vt, int ld, int key0, int d0) {
    const KFrag k = load_k<T>(vt, ld, d0, key0);
    VFrag f;
#pragma unroll
    for (int j = 0; j < 16; ++j) f.h[j] = k.h[j];
    return f;
  }
};
using WaveMma = Rdna3Wmma16;
#elif defined(RSD_WAVE_MMA_RDNA4)
// ---- AMD RDNA4: v_wmma_f32_16x16x16_*, wave 32, lane = 16 * h + i (i: 0..15, h: 0..1) -----------------------
// No replication: the half-waves split the reduction index in groups of four. Element e of a lane's 8-element
// A / B operand is reduction index kidx(e) = 8 (e / 4) + 4 h + e % 4: A (m x k) lane holds A[i][kidx(0..7)],
// B (k x n) B[kidx(0..7)][i]; C (m x n, 8 floats): element e is C[8 h + e][i].
// S^T = K Q^T with the key tile's rows permuted (row r of A is key swap_bits_2_3(r)): the lane's score element e
// is then key kidx(e) of query i, exactly the key B of O^T = V^T P^T needs in element e, so P goes from the
// score accumulator to the next operand in place (no shuffles, unlike RDNA3). O^T lane holds O[query i][dims
// 8 h + e].
struct Rdna4Wmma16 : Wave32Wmma16<Rdna4Wmma16> {
  static constexpr bool kQFromShared = false;
  struct QFrag { uint16_t h[8]; };
  struct PFrag { uint32_t w[4]; };  // packed pairs
  struct KFrag { uint16_t h[8]; };  // A of S^T = K Q^T: key swap_bits_2_3(i), dims kidx(0..7)
  struct VFrag { uint16_t h[8]; };  // A of O^T = V^T P^T: dim i, keys kidx(0..7)

  __device__ static int kidx(int e) { return 8 * (e / 4) + 4 * (rsd::lane_id() / 16) + e % 4; }
  // Row r of the score product holds key r with bits 2 and 3 exchanged (an involution of 0..15).
  __device__ static constexpr int swap_bits_2_3(int r) { return (r & 3) | ((r & 4) << 1) | ((r & 8) >> 1); }

  __device__ static int s_key(int e) { return kidx(e); }
  __device__ static int o_dim(int e) { return 8 * (rsd::lane_id() / 16) + e; }

  // Elements kidx(0..7) of a row: two runs of four at 4 h and 8 + 4 h.
  template <class T>
  __device__ static void load_row_halves(uint16_t (&h)[8], const T* row) {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(row) + 4 * (rsd::lane_id() / 16);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      h[e] = p[e];
      h[4 + e] = p[8 + e];
    }
  }

  template <class T>
  __device__ static QFrag load_q(const T* q, int ld, int d0) {
    QFrag f;
    load_row_halves(f.h, q + (rsd::lane_id() % 16) * ld + d0);
    return f;
  }

  template <class T, class A, class B>
  __device__ static void mma(float (&c)[8], const A& a, const B& b) {
    const amd::float_vec<8> acc = amd::accumulator(c);
    if constexpr (std::is_same<T, __half>::value)
      amd::store(c, __builtin_amdgcn_wmma_f32_16x16x16_f16_w32_gfx12(amd::operand<T>(a), amd::operand<T>(b), acc));
    else
      amd::store(c, __builtin_amdgcn_wmma_f32_16x16x16_bf16_w32_gfx12(amd::operand<T>(a), amd::operand<T>(b), acc));
  }

  template <class T>
  __device__ static KFrag load_k(const T* k, int ld, int key0, int d0) {
    KFrag f;
    load_row_halves(f.h, k + (key0 + swap_bits_2_3(rsd::lane_id() % 16)) * ld + d0);
    return f;
  }

  template <class T>
  __device__ static PFrag to_p(const Acc& p) {
    PFrag f;
#pragma unroll
    for (int k = 0; k < 4; ++k) f.w[k] = pack2<T>(p.v[2 * k], p.v[2 * k + 1]);
    return f;
  }

  template <class T>
  __device__ static VFrag load_v(const T* v, int ld, int key0, int d0) {
    const uint16_t* col = reinterpret_cast<const uint16_t*>(v + key0 * ld + d0 + rsd::lane_id() % 16);
    VFrag f;
#pragma unroll
    for (int e = 0; e < 8; ++e) f.h[e] = col[kidx(e) * ld];
    return f;
  }

  // The same operand from the transposed value tile (row d: dim d's keys, 8-byte aligned rows): keys kidx(0..7)
  // of dim d0 + i, two runs of four.
  template <class T>
  __device__ static VFrag load_vt(const T* vt, int ld, int key0, int d0) {
    VFrag f;
    load_row_halves(f.h, vt + (d0 + rsd::lane_id() % 16) * ld + key0);
    return f;
  }
};
using WaveMma = Rdna4Wmma16;
#endif

}  // namespace rsd
