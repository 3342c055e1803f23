// HIP's cross-lane builtins as wave-wide operations of the emulation (rsd_emu/lanes.h): a kernel's lane calls
// them with its own operands, as on the GPU; the call returns once the whole wave has called, with the result
// the instruction gives that lane.
//
//   __shfl_xor / __shfl        HIP's definitions (hip/amd_detail/amd_warp_functions.h) over ds_bpermute:
//                              the source lane index is computed per lane, then every lane reads the value
//                              its index names. A source outside the width's segment falls back to the lane
//                              itself (__shfl_xor), as HIP does; a source lane that does not exist fails.
//   __builtin_amdgcn_mfma_*    rsd_emu/amdgcn_matrix.h, for a wave of 64
//   __builtin_amdgcn_wmma_*    rsd_emu/amdgcn_matrix.h, for a wave of 32 (gfx11's and gfx12's builtins)
//   __builtin_amdgcn_cvt_pk_fp8_f32   rsd_emu/amdgcn_matrix.h, per lane (no other lane involved)
//   __builtin_amdgcn_permlanex16   v_permlanex16_b32 (gfx10+: the gfx11 / gfx12 targets here), wave-wide
//   __builtin_amdgcn_perm          v_perm_b32, per lane
//
// The FP8 builtins exist only where the real compiler has them (the fp8 MFMA and the conversion: gfx940/941/942
// and gfx950; the fp8 WMMA and the conversion: gfx12), so code that calls one elsewhere fails to compile here as
// it would for the GPU; their bytes are e4m3fnuz on gfx94x and OCP e4m3fn on gfx950 and gfx12 (kFp8 below).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "rsd_emu/amdgcn_matrix.h"
#include "rsd_emu/lanes.h"

namespace rsd_emu {

template <class T>
struct ShuffleIn {
  T value;
  int source;  // lane in the wave to read
};

template <class T>
T bpermute(const char* name, T value, int source) {
  return wave_collective<ShuffleIn<T>, T>(name, ShuffleIn<T>{value, source}, [name](const ShuffleIn<T>* in, T* out, int lanes) {
    for (int l = 0; l < lanes; ++l) {
      // ds_bpermute addresses lanes modulo the wave size (address bits [7:2] on wave64, [6:2] on wave32).
      const int source_lane = in[l].source & (wave_size() - 1);
      if (source_lane >= lanes) fail(std::string(name) + " reads lane " + std::to_string(source_lane) + " of a partial wave");
      out[l] = in[source_lane].value;
    }
  });
}

inline int lane_in_wave() { return this_lane().linear % wave_size(); }

}  // namespace rsd_emu

namespace rsd_emu {

struct PermlaneIn {
  uint32_t value, sel_lo, sel_hi;
};

// v_permlanex16_b32 as the RDNA3 / RDNA4 ISA documents it: the lanes form rows of 16, paired (0, 1), (2, 3); lane l
// reads, from the other row of its pair, the lane that its 4-bit select names: bits [4 (l % 16) + 3 : 4 (l % 16)]
// of {sel_hi, sel_lo}, which are scalar operands (one value for the wave). old, fi and bound_ctrl only decide what
// a lane reads from an inactive source lane; every lane of the wave takes part here, and a partial wave fails.
inline uint32_t permlanex16(uint32_t old, uint32_t src0, uint32_t sel_lo, uint32_t sel_hi, bool fi, bool bound_ctrl) {
  (void)old, (void)fi, (void)bound_ctrl;
  const char* name = "v_permlanex16_b32";
  return wave_collective<PermlaneIn, uint32_t>(name, PermlaneIn{src0, sel_lo, sel_hi}, [name](const PermlaneIn* in,
                                                                                              uint32_t* out, int lanes) {
    if (lanes != wave_size()) fail(std::string(name) + " in a partial wave");
    const uint64_t sel = uint64_t(in[0].sel_hi) << 32 | in[0].sel_lo;
    for (int l = 0; l < lanes; ++l) {
      if (in[l].sel_lo != in[0].sel_lo || in[l].sel_hi != in[0].sel_hi)
        fail(std::string(name) + ": lane selects differ between lanes (they are scalar operands)");
      out[l] = in[((l / 16) ^ 1) * 16 + int(sel >> (4 * (l % 16)) & 0xf)].value;
    }
  });
}

// v_perm_b32 (ISA: "byte permute"): byte k of the result is chosen by byte k of sel from the eight bytes
// {s0 (bytes 4-7), s1 (bytes 0-3)}: 0-7 that byte, 8-11 the sign bit of byte 1, 3, 5 or 7 repeated over the byte,
// 12 zero, 13 and above 0xff.
inline uint32_t perm_b32(uint32_t s0, uint32_t s1, uint32_t sel) {
  const uint64_t in = uint64_t(s0) << 32 | s1;
  uint32_t out = 0;
  for (int k = 0; k < 4; ++k) {
    const uint32_t b = sel >> (8 * k) & 0xff;
    const uint32_t byte = b >= 13 ? 0xff : b == 12 ? 0 : b >= 8 ? ((in >> (16 * (b - 8) + 15)) & 1) * 0xff
                                                              : uint32_t(in >> (8 * b)) & 0xff;
    out |= byte << (8 * k);
  }
  return out;
}

}  // namespace rsd_emu

#if defined(__GFX11__) || defined(__GFX12__)
#define __builtin_amdgcn_permlanex16(old, src0, src1, src2, fi, bound_ctrl) \
  ::rsd_emu::permlanex16(old, src0, src1, src2, fi, bound_ctrl)
#endif
#define __builtin_amdgcn_perm(s0, s1, sel) ::rsd_emu::perm_b32(s0, s1, sel)

template <class T>
T __shfl_xor(T var, int lane_mask, int width = rsd_emu::wave_size()) {
  const int self = rsd_emu::lane_in_wave();
  int index = self ^ lane_mask;
  index = index >= ((self + width) & ~(width - 1)) ? self : index;
  return rsd_emu::bpermute("__shfl_xor", var, index);
}

template <class T>
T __shfl(T var, int src_lane, int width = rsd_emu::wave_size()) {
  const int self = rsd_emu::lane_in_wave();
  const int index = (src_lane & (width - 1)) + (self & ~(width - 1));
  return rsd_emu::bpermute("__shfl", var, index);
}

// ---- matrix instructions: the clang builtins' vector operand types ----
namespace rsd_emu {
typedef _Float16 half4 __attribute__((ext_vector_type(4)));
typedef _Float16 half8 __attribute__((ext_vector_type(8)));
typedef _Float16 half16 __attribute__((ext_vector_type(16)));
typedef short short4 __attribute__((ext_vector_type(4)));
typedef short short8 __attribute__((ext_vector_type(8)));
typedef short short16 __attribute__((ext_vector_type(16)));
typedef float float4 __attribute__((ext_vector_type(4)));
typedef float float8 __attribute__((ext_vector_type(8)));

template <int N, int ACC, class Code = uint16_t>
struct MatrixOperands {
  Code a[N], b[N];
  float c[ACC];
};
template <int ACC>
struct Accumulator {
  float d[ACC];
};

template <int N, class V>
void bits_of(uint16_t (&bits)[N], const V& v) {
  for (int k = 0; k < N; ++k) {
    auto element = v[k];
    std::memcpy(&bits[k], &element, 2);
  }
}

// An 8-bit operand (the fp8 builtins' `long` or int2): its bytes in memory order, which is the registers' (byte b of
// VGPR v is bits [8b + 7 : 8b] of the lane's 32-bit register, little-endian, as on the GPU).
template <int N, class V>
void bits_of(uint8_t (&bytes)[N], const V& v) {
  static_assert(sizeof(V) == N, "an fp8 operand is N bytes");
  std::memcpy(bytes, &v, N);
}

// One matrix instruction for the wave: gathers every lane's A, B and C, runs `instruction(a, b, c, d)` on the
// lane-major arrays (rsd_emu/amdgcn_matrix.h), and hands each lane its D. Code: the input element's bits (16-bit
// halves or fp8 bytes).
template <int LANES, int N, int ACC, class Result, class Code = uint16_t, class In, class Acc, class Instruction>
Result matrix_instruction(const char* name, const In& a, const In& b, const Acc& c, Instruction instruction) {
  MatrixOperands<N, ACC, Code> in;
  bits_of(in.a, a);
  bits_of(in.b, b);
  for (int k = 0; k < ACC; ++k) in.c[k] = c[k];
  const Accumulator<ACC> d = wave_collective<MatrixOperands<N, ACC, Code>, Accumulator<ACC>>(
      name, in, [=](const MatrixOperands<N, ACC, Code>* ins, Accumulator<ACC>* outs, int lanes) {
        if (lanes != LANES) fail(std::string(name) + " needs a full wave of " + std::to_string(LANES) + " lanes");
        Code av[LANES][N], bv[LANES][N];
        float cv[LANES][ACC], dv[LANES][ACC];
        for (int l = 0; l < LANES; ++l) {
          std::memcpy(av[l], ins[l].a, sizeof(av[l]));
          std::memcpy(bv[l], ins[l].b, sizeof(bv[l]));
          std::memcpy(cv[l], ins[l].c, sizeof(cv[l]));
        }
        try {
          instruction(av, bv, cv, dv);
        } catch (const std::logic_error& e) {
          fail(std::string(name) + ": " + e.what());
        }
        for (int l = 0; l < LANES; ++l) std::memcpy(outs[l].d, dv[l], sizeof(dv[l]));
      });
  Result r;
  for (int k = 0; k < ACC; ++k) r[k] = d.d[k];
  return r;
}

template <class In, class Acc>
float4 mfma_16x16x16(const char* name, amdgcn::Elem elem, const In& a, const In& b, const Acc& c, int cbsz, int abid,
                     int blgp) {
  return matrix_instruction<64, 4, 4, float4>(name, a, b, c, [=](auto av, auto bv, auto cv, auto dv) {
    amdgcn::mfma_f32_16x16x16(elem, av, bv, cv, dv, cbsz, abid, blgp);
  });
}

template <class In, class Acc>
float8 wmma_16x16x16_w32(const char* name, amdgcn::Elem elem, const In& a, const In& b, const Acc& c) {
  return matrix_instruction<32, 16, 8, float8>(name, a, b, c, [=](auto av, auto bv, auto cv, auto dv) {
    amdgcn::wmma_f32_16x16x16_w32(elem, av, bv, cv, dv);
  });
}

template <class In, class Acc>
float8 wmma_16x16x16_w32_gfx12(const char* name, amdgcn::Elem elem, const In& a, const In& b, const Acc& c) {
  return matrix_instruction<32, 8, 8, float8>(name, a, b, c, [=](auto av, auto bv, auto cv, auto dv) {
    amdgcn::wmma_f32_16x16x16_w32_gfx12(elem, av, bv, cv, dv);
  });
}

// The FP8 format of the emulated architecture (build.py defines the target macros as clang does).
#if defined(__gfx940__) || defined(__gfx941__) || defined(__gfx942__)
#define RSD_EMU_FP8 1
constexpr amdgcn::Fp8 kFp8 = amdgcn::Fp8::e4m3fnuz;
#elif defined(__gfx950__) || defined(__GFX12__)
#define RSD_EMU_FP8 1
constexpr amdgcn::Fp8 kFp8 = amdgcn::Fp8::e4m3fn;
#endif

#if defined(RSD_EMU_FP8)
template <class In, class Acc>
float4 mfma_16x16x32_fp8(const char* name, const In& a, const In& b, const Acc& c, int cbsz, int abid, int blgp) {
  return matrix_instruction<64, 8, 4, float4, uint8_t>(name, a, b, c, [=](auto av, auto bv, auto cv, auto dv) {
    amdgcn::mfma_f32_16x16x32_fp8(kFp8, av, bv, cv, dv, cbsz, abid, blgp);
  });
}

template <class In, class Acc>
float8 wmma_16x16x16_fp8_w32_gfx12(const char* name, const In& a, const In& b, const Acc& c) {
  return matrix_instruction<32, 8, 8, float8, uint8_t>(name, a, b, c, [=](auto av, auto bv, auto cv, auto dv) {
    amdgcn::wmma_f32_16x16x16_fp8_w32_gfx12(kFp8, av, bv, cv, dv);
  });
}

// Per lane: no other lane takes part, so the lane converts on its own; an undocumented case fails the launch.
inline int cvt_pk_fp8_f32(float src0, float src1, int old, bool word_sel) {
  try {
    return int(amdgcn::cvt_pk_fp8_f32(kFp8, src0, src1, uint32_t(old), word_sel));
  } catch (const std::logic_error& e) {
    fail(std::string(e.what()) + " (lane " + std::to_string(lane_in_wave()) + ")");
  }
}
#endif

}  // namespace rsd_emu

#define __builtin_amdgcn_mfma_f32_16x16x16f16(a, b, c, cbsz, abid, blgp) \
  ::rsd_emu::mfma_16x16x16("v_mfma_f32_16x16x16f16", ::rsd_emu::amdgcn::Elem::f16, a, b, c, cbsz, abid, blgp)
#define __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(a, b, c, cbsz, abid, blgp) \
  ::rsd_emu::mfma_16x16x16("v_mfma_f32_16x16x16bf16_1k", ::rsd_emu::amdgcn::Elem::bf16, a, b, c, cbsz, abid, blgp)
#define __builtin_amdgcn_wmma_f32_16x16x16_f16_w32(a, b, c) \
  ::rsd_emu::wmma_16x16x16_w32("v_wmma_f32_16x16x16_f16_w32", ::rsd_emu::amdgcn::Elem::f16, a, b, c)
#define __builtin_amdgcn_wmma_f32_16x16x16_bf16_w32(a, b, c) \
  ::rsd_emu::wmma_16x16x16_w32("v_wmma_f32_16x16x16_bf16_w32", ::rsd_emu::amdgcn::Elem::bf16, a, b, c)
#define __builtin_amdgcn_wmma_f32_16x16x16_f16_w32_gfx12(a, b, c) \
  ::rsd_emu::wmma_16x16x16_w32_gfx12("v_wmma_f32_16x16x16_f16 (gfx12)", ::rsd_emu::amdgcn::Elem::f16, a, b, c)
#define __builtin_amdgcn_wmma_f32_16x16x16_bf16_w32_gfx12(a, b, c) \
  ::rsd_emu::wmma_16x16x16_w32_gfx12("v_wmma_f32_16x16x16_bf16 (gfx12)", ::rsd_emu::amdgcn::Elem::bf16, a, b, c)
#if defined(RSD_EMU_FP8)
#if defined(__gfx940__) || defined(__gfx941__) || defined(__gfx942__) || defined(__gfx950__)
#define __builtin_amdgcn_mfma_f32_16x16x32_fp8_fp8(a, b, c, cbsz, abid, blgp) \
  ::rsd_emu::mfma_16x16x32_fp8("v_mfma_f32_16x16x32_fp8_fp8", a, b, c, cbsz, abid, blgp)
#endif
#if defined(__GFX12__)
#define __builtin_amdgcn_wmma_f32_16x16x16_fp8_fp8_w32_gfx12(a, b, c) \
  ::rsd_emu::wmma_16x16x16_fp8_w32_gfx12("v_wmma_f32_16x16x16_fp8_fp8 (gfx12)", a, b, c)
#endif
#define __builtin_amdgcn_cvt_pk_fp8_f32(src0, src1, old, word_sel) \
  ::rsd_emu::cvt_pk_fp8_f32(src0, src1, old, word_sel)
#endif
