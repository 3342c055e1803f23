// Wave-level FP8 matrix-unit tiles for the FP8 attention (hip/attention_fp8/attention_fp8.hip), one policy per
// instruction family, with the interface of the 16-bit policies (rocm_sd/attention/wave_mma.h) so that the online
// softmax and the output store (rocm_sd/attention/impl.h) serve both:
//
//   NvMmaE4m3     NVIDIA sm_89+   mma.sync m16n8k32 e4m3 (two per 16x16 tile), wave 32, OCP e4m3fn
//   CdnaMfmaFp8   AMD gfx942      v_mfma_f32_16x16x32_fp8_fp8, wave 64, e4m3fnuz (max 240)
//                 AMD gfx950      the same instruction, OCP e4m3fn (max 448)
//   Rdna4WmmaFp8  AMD gfx12       v_wmma_f32_16x16x16_fp8_fp8 (gfx12 builtin), wave 32, OCP e4m3fn
//
// RDNA3 (gfx11) has no FP8 matrix instruction: no policy, and the host refuses it.
//
// Operands are bytes: Q and K rows [token][dim] (kQkK dims a product), and V transposed, [dim][key] (kPvK keys a
// product), so that every fragment is a few 2-, 4- or 8-byte loads from shared memory. Scores and the output
// accumulate in fp32 in 16x16 tiles whose layouts are the 16-bit policies' (the same s_key / o_dim / slot maps).
//
// P V reduces over keys, and the order of a reduction is free: each policy numbers the keys of its P operand in
// the order its score accumulator already holds them (to_p), and reads V's keys in that same order (load_v), so the
// probabilities go from the score registers to the next product without moving between lanes.
//
// The AMD layouts are AMD's Matrix Instruction Calculator's (tests/amd_emulation/matrix_layouts.json) and have been
// executed only by the CPU emulation (tests/amd_emulation): no AMD GPU has run this code.
#pragma once

#include "rocm_sd/attention/wave_mma.h"
#include "rocm_sd/common.h"
#include "rocm_sd/compat.h"

#if defined(RSD_PLATFORM_CUDA)
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 890
#define RSD_WAVE_MMA_FP8_NV 1
#endif
#elif defined(__gfx940__) || defined(__gfx941__) || defined(__gfx942__) || defined(__gfx950__)
#define RSD_WAVE_MMA_FP8_CDNA 1
#elif defined(__gfx1200__) || defined(__gfx1201__)
#define RSD_WAVE_MMA_FP8_RDNA4 1
#endif

#if defined(RSD_WAVE_MMA_FP8_NV) || defined(RSD_WAVE_MMA_FP8_CDNA) || defined(RSD_WAVE_MMA_FP8_RDNA4)
#define RSD_HAS_WAVE_MMA_FP8 1
#endif

namespace rsd {

__device__ __forceinline__ uint32_t load_u32(const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }
__device__ __forceinline__ uint32_t load_u16(const uint8_t* p) { return *reinterpret_cast<const uint16_t*>(p); }

#if defined(RSD_WAVE_MMA_FP8_NV)
// ---- NVIDIA: mma.sync.m16n8k32 e4m3, lane = 4 g + t (g: 0..7, t: 0..3) ------------------------------------
// A (16x32, row-major, bytes): a0 = (g, 4t..4t+3), a1 = (g+8, 4t..), a2 = (g, 16+4t..), a3 = (g+8, 16+4t..)
// B (32x8, k x n):            b0 = (k 4t..4t+3, n g), b1 = (k 16+4t.., n g)
// C (16x8, fp32):             c0,c1 = (g, 2t..2t+1), c2,c3 = (g+8, 2t..2t+1)   (as m16n8k16)
// The score tile of 16 keys is two m16n8 products; its lane holds keys 2t, 2t+1, 8+2t, 9+2t of rows g and g+8.
// P V takes 32 keys (two score tiles n0, n1): reduction index 4t + j names key {2t, 2t+1, 8+2t, 9+2t}[j] of n0,
// 16 + 4t + j the same key of n1, which are exactly the lane's own probabilities.
// On sm_90 ptxas runs these products on the fp16 tensor cores (the instruction is native on sm_89 and sm_120):
// there the kernel computes the same values, at no gain (bench/results/notes).
struct NvMmaE4m3 {
  static constexpr int kSlots = 2;
  static constexpr int kQkK = 32, kPvK = 32;  // head dims a score product reduces, keys a P V product reduces
  static constexpr float kP8Max = 448.f;       // probabilities are encoded as p * kP8Max
  struct QFrag { uint32_t r[4]; };
  struct KFrag { uint32_t r[4]; };  // B of two m16n8k32 products: keys 0..7 and 8..15
  struct Acc { float v[8]; };
  struct PFrag { uint32_t r[4]; };
  struct VFrag { uint32_t r[4]; };  // B of two products: dims 0..7 and 8..15

  __device__ static int slot_row(int slot) { return rsd::lane_id() / 4 + 8 * slot; }
  __device__ static constexpr int acc_slot(int i) { return (i % 4) / 2; }
  __device__ static int acc_col(int i) { return 8 * (i / 4) + 2 * (rsd::lane_id() % 4) + i % 2; }
  __device__ static int s_key(int i) { return acc_col(i); }
  __device__ static int o_dim(int i) { return acc_col(i); }
  __device__ static constexpr int s_slot(int i) { return acc_slot(i); }
  __device__ static constexpr int o_slot(int i) { return acc_slot(i); }

  __device__ static void mma(float* c, const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }

  // Rows of 16 queries x dims d0..d0+31 (`ld` bytes a row).
  __device__ static QFrag load_q(const uint8_t* q, int ld, int d0) {
    const int g = rsd::lane_id() / 4, t = rsd::lane_id() % 4;
    const uint8_t* top = q + g * ld + d0 + 4 * t;
    const uint8_t* bottom = top + 8 * ld;
    return QFrag{{load_u32(top), load_u32(bottom), load_u32(top + 16), load_u32(bottom + 16)}};
  }

  __device__ static KFrag load_k(const uint8_t* k, int ld, int key0, int d0) {
    const int g = rsd::lane_id() / 4, t = rsd::lane_id() % 4;
    const uint8_t* lo = k + (key0 + g) * ld + d0 + 4 * t;
    const uint8_t* hi = lo + 8 * ld;
    return KFrag{{load_u32(lo), load_u32(lo + 16), load_u32(hi), load_u32(hi + 16)}};
  }

  __device__ static void scores(Acc& s, const QFrag& q, const KFrag& k) {
    mma(s.v, q.r, k.r[0], k.r[1]);
    mma(s.v + 4, q.r, k.r[2], k.r[3]);
  }

  // Two floats as e4m3fn codes, `lo` in the low byte (satfinite: nothing here exceeds 448).
  __device__ static uint32_t encode2(float lo, float hi) {
    uint16_t pair;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(hi), "f"(lo));
    return pair;
  }

  // Probabilities of the score tiles p[0], p[1] (keys 0..31 of the group), times kP8Max, as P's A operand.
  __device__ static PFrag to_p(const Acc* p) {
    auto word = [](const Acc& a, int row) {  // keys 2t, 2t+1, 8+2t, 9+2t of row slot `row`
      return encode2(a.v[2 * row] * kP8Max, a.v[2 * row + 1] * kP8Max) |
             (encode2(a.v[4 + 2 * row] * kP8Max, a.v[5 + 2 * row] * kP8Max) << 16);
    };
    return PFrag{{word(p[0], 0), word(p[0], 1), word(p[1], 0), word(p[1], 1)}};
  }

  // Transposed values ([dim][key], `ld` bytes a dim) for keys key0..key0+31 and dims d0..d0+15, in to_p's key order.
  __device__ static VFrag load_v(const uint8_t* vt, int ld, int key0, int d0) {
    const int g = rsd::lane_id() / 4, t = rsd::lane_id() % 4;
    auto keys = [&](int dim, int first) {
      const uint8_t* row = vt + dim * ld + key0 + first + 2 * t;
      return load_u16(row) | (load_u16(row + 8) << 16);
    };
    return VFrag{{keys(d0 + g, 0), keys(d0 + g, 16), keys(d0 + 8 + g, 0), keys(d0 + 8 + g, 16)}};
  }

  __device__ static void pv(Acc& o, const PFrag& p, const VFrag& v) {
    mma(o.v, p.r, v.r[0], v.r[1]);
    mma(o.v + 4, p.r, v.r[2], v.r[3]);
  }

  __device__ static float row_max(float x) { return xor_max<1, 2>(x); }
  __device__ static float row_sum(float x) { return xor_sum<1, 2>(x); }
};
using WaveMmaFp8 = NvMmaE4m3;
#endif

#if defined(RSD_WAVE_MMA_FP8_CDNA) || defined(RSD_WAVE_MMA_FP8_RDNA4)
namespace amd {
// Two floats as the target's FP8 codes (v_cvt_pk_fp8_f32: round to nearest even; gfx942 encodes e4m3fnuz, gfx950
// and gfx12 OCP e4m3fn), `lo` in the low byte.
__device__ __forceinline__ uint32_t encode2_fp8(float lo, float hi) {
  return uint32_t(__builtin_amdgcn_cvt_pk_fp8_f32(lo, hi, 0, false)) & 0xFFFFu;
}
typedef int int2_vec __attribute__((ext_vector_type(2)));
__device__ __forceinline__ int2_vec as_int2(uint64_t v) { return __builtin_bit_cast(int2_vec, v); }
__device__ __forceinline__ uint64_t load_u64(const uint8_t* p) { return *reinterpret_cast<const uint64_t*>(p); }
__device__ __forceinline__ uint64_t join(uint32_t lo, uint32_t hi) { return uint64_t(lo) | (uint64_t(hi) << 32); }
// The 8-byte operand of lane l = 16 g + i in both AMD fp8 layouts (row i holds reduction indices 8 g..8 g+7): bytes
// col0 + 8 g.. of row row0 + i, rows `ld` bytes apart.
__device__ __forceinline__ uint64_t lane_bytes8(const uint8_t* base, int ld, int row0, int col0) {
  return load_u64(base + (row0 + rsd::lane_id() % 16) * ld + col0 + 8 * (rsd::lane_id() / 16));
}
}  // namespace amd
#endif

#if defined(RSD_WAVE_MMA_FP8_CDNA)
// ---- AMD CDNA3 / CDNA4: v_mfma_f32_16x16x32_fp8_fp8, wave 64, lane = 16 q + i (i: 0..15, q: 0..3) ------------
// A (16x32, m x k): lane holds A[i][8q..8q+7] (8 bytes); B (k x n): B[8q..8q+7][i]; C (m x n): C[4q..4q+3][i].
// As the 16-bit policy, the transposed products: S^T = K Q^T leaves lane (q, i) S[query i][keys 4q..4q+3] of a
// 16-key tile. O^T = V^T P^T over 32 keys (two tiles n0, n1): reduction index 8q + j is key 4q + j of n0 (j < 4)
// or of n1 (j >= 4), the lane's own probabilities; V^T's A operand reads the same keys of dim i.
struct CdnaMfmaFp8 : Wave64Mfma16 {
  static constexpr int kQkK = 32, kPvK = 32;
#if defined(__gfx950__)
  static constexpr float kP8Max = 448.f;  // OCP e4m3fn
#else
  static constexpr float kP8Max = 240.f;  // e4m3fnuz
#endif
  struct QFrag { uint64_t b; };
  struct KFrag { uint64_t b; };
  struct PFrag { uint64_t b; };
  struct VFrag { uint64_t b; };

  __device__ static void mma(float (&c)[4], uint64_t a, uint64_t b) {
    const amd::float_vec<4> acc = amd::accumulator(c);
    amd::store(c, __builtin_amdgcn_mfma_f32_16x16x32_fp8_fp8(static_cast<long>(a), static_cast<long>(b), acc, 0, 0, 0));
  }

  __device__ static QFrag load_q(const uint8_t* q, int ld, int d0) { return QFrag{amd::lane_bytes8(q, ld, 0, d0)}; }
  __device__ static KFrag load_k(const uint8_t* k, int ld, int key0, int d0) {
    return KFrag{amd::lane_bytes8(k, ld, key0, d0)};
  }
  __device__ static void scores(Acc& s, const QFrag& q, const KFrag& k) { mma(s.v, k.b, q.b); }

  __device__ static PFrag to_p(const Acc* p) {
    auto four = [](const Acc& a) {
      return amd::encode2_fp8(a.v[0] * kP8Max, a.v[1] * kP8Max) | (amd::encode2_fp8(a.v[2] * kP8Max, a.v[3] * kP8Max) << 16);
    };
    return PFrag{amd::join(four(p[0]), four(p[1]))};
  }

  __device__ static VFrag load_v(const uint8_t* vt, int ld, int key0, int d0) {
    const uint8_t* row = vt + (d0 + rsd::lane_id() % 16) * ld + key0 + 4 * (rsd::lane_id() / 16);
    return VFrag{amd::join(load_u32(row), load_u32(row + 16))};
  }
  __device__ static void pv(Acc& o, const PFrag& p, const VFrag& v) { mma(o.v, v.b, p.b); }
};
using WaveMmaFp8 = CdnaMfmaFp8;

#elif defined(RSD_WAVE_MMA_FP8_RDNA4)
// ---- AMD RDNA4: v_wmma_f32_16x16x16_fp8_fp8 (gfx12), wave 32, lane = 16 h + i (i: 0..15, h: 0..1) ------------
// A (16x16, m x k): lane holds A[i][8h..8h+7] (8 bytes); B (k x n): B[8h..8h+7][i]; C (m x n, 8 floats): element e
// is C[8h + e][i]. Unlike the 16-bit gfx12 WMMA (wave_mma.h's Rdna4Wmma16), each half-wave holds one contiguous run
// of the reduction index: S^T = K Q^T leaves lane (h, i) S[query i][keys 8h..8h+7], exactly B of O^T = V^T P^T
// over the same 16 keys, so one score tile is one P operand, with no permutation.
struct Rdna4WmmaFp8 : Wave32Wmma16<Rdna4WmmaFp8> {
  static constexpr bool kQFromShared = false;
  static constexpr int kQkK = 16, kPvK = 16;
  static constexpr float kP8Max = 448.f;
  struct QFrag { uint64_t b; };
  struct KFrag { uint64_t b; };
  struct PFrag { uint64_t b; };
  struct VFrag { uint64_t b; };

  __device__ static int s_key(int e) { return 8 * (rsd::lane_id() / 16) + e; }
  __device__ static int o_dim(int e) { return 8 * (rsd::lane_id() / 16) + e; }

  __device__ static void mma(float (&c)[8], uint64_t a, uint64_t b) {
    const amd::float_vec<8> acc = amd::accumulator(c);
    amd::store(c, __builtin_amdgcn_wmma_f32_16x16x16_fp8_fp8_w32_gfx12(amd::as_int2(a), amd::as_int2(b), acc));
  }

  __device__ static QFrag load_q(const uint8_t* q, int ld, int d0) { return QFrag{amd::lane_bytes8(q, ld, 0, d0)}; }
  __device__ static KFrag load_k(const uint8_t* k, int ld, int key0, int d0) {
    return KFrag{amd::lane_bytes8(k, ld, key0, d0)};
  }
  __device__ static void scores(Acc& s, const QFrag& q, const KFrag& k) { mma(s.v, k.b, q.b); }

  __device__ static PFrag to_p(const Acc* p) {
    uint32_t w[2];
#pragma unroll
    for (int k = 0; k < 2; ++k)
      w[k] = amd::encode2_fp8(p[0].v[4 * k] * kP8Max, p[0].v[4 * k + 1] * kP8Max) |
             (amd::encode2_fp8(p[0].v[4 * k + 2] * kP8Max, p[0].v[4 * k + 3] * kP8Max) << 16);
    return PFrag{amd::join(w[0], w[1])};
  }

  __device__ static VFrag load_v(const uint8_t* vt, int ld, int key0, int d0) {
    return VFrag{amd::lane_bytes8(vt, ld, d0, key0)};
  }
  __device__ static void pv(Acc& o, const PFrag& p, const VFrag& v) { mma(o.v, v.b, p.b); }
};
using WaveMmaFp8 = Rdna4WmmaFp8;
#endif

}  // namespace rsd
