// The AMD matrix-core instructions rocm_sd calls, executed on the CPU for one whole wave at a time, and the FP8
// conversion that feeds the FP8 ones:
//
//   v_mfma_f32_16x16x16f16 / v_mfma_f32_16x16x16bf16_1k   CDNA (gfx90a, gfx94x, gfx950), wave 64
//   v_wmma_f32_16x16x16_f16_w32 / ..._bf16_w32             RDNA3 (gfx11), wave 32
//   v_wmma_f32_16x16x16_f16 / ..._bf16 (gfx12 builtins)    RDNA4 (gfx12), wave 32
//   v_mfma_f32_16x16x32_fp8_fp8                            CDNA3 (gfx94x: e4m3fnuz), CDNA4 (gfx950: e4m3fn), wave 64
//   v_wmma_f32_16x16x16_fp8_fp8 (gfx12 builtin)            RDNA4 (gfx12: e4m3fn), wave 32
//   v_cvt_pk_fp8_f32                                       gfx94x (e4m3fnuz), gfx950 and gfx12 (e4m3fn); per lane
//
// Each matrix instruction computes D = A B + C (A: 16 x K, B: K x 16, C, D: 16 x 16; K = 16, or 32 for the fp8
// MFMA) with 16-bit or 8-bit inputs and fp32 C / D, the operands spread over the lanes of a wave. This file is the
// one place where those spreads are written down; the wave's lanes are plain arrays here (lane-major), so the
// semantics can be unit-tested without any kernel (tests/amd_emulation/matrix_layout_test.cpp). How a per-lane
// builtin call in kernel code reaches these functions: rsd_emu/wave_ops.h.
//
// Layouts (lane l, element e of the lane's operand vector; the vectors are what the clang builtins take):
//
// v_mfma_f32_16x16x16{f16,bf16_1k}, 64 lanes, l = 16 q + i (i = l % 16, q = l / 16):
//   A: 4 halves a lane (2 VGPRs)   element e of lane l = A[i][4q + e]      (row i, k = 4q..4q+3)
//   B: 4 halves a lane (2 VGPRs)   element e of lane l = B[4q + e][i]      (column i, k = 4q..4q+3)
//   C/D: 4 floats a lane (4 VGPRs) element e of lane l = D[4q + e][i]      (column i, rows 4q..4q+3)
//   Sources: AMD Matrix Instruction Calculator (github.com/ROCm/amd_matrix_instruction_calculator,
//   `--instruction v_mfma_f32_16x16x16f16 --register-layout` for CDNA2 / CDNA3: A[i][k] in lane i + 16 (k / 4),
//   VGPR (k % 4) / 2, half k % 2; B[k][j] in lane j + 16 (k / 4); D[i][j] in lane j + 16 (i / 4), VGPR i % 4);
//   CDNA3 ISA guide, section 7.1 "Dependent and Independent Matrix Operations" / the MFMA operand figures;
//   LLVM IntrinsicsAMDGPU.td (int_amdgcn_mfma_f32_16x16x16f16: v4f16, v4f16, v4f32, cbsz, abid, blgp;
//   ..._16x16x16bf16_1k: v4i16 raw bf16 bits). CBSZ / ABID / BLGP (operand broadcasts) must be 0: rsd
//   never sets them, and their semantics are not emulated.
//
// v_wmma_f32_16x16x16_{f16,bf16}_w32, 32 lanes, l = 16 h + i (i = l % 16, h = l / 16):
//   A: 16 halves a lane (8 VGPRs)  element e of lane l = A[i][e]           (row i, all 16 k)
//   B: 16 halves a lane (8 VGPRs)  element e of lane l = B[e][i]           (column i, all 16 k)
//      lanes 16..31 must hold the same A and B as lanes 0..15 (RDNA3 ISA guide, section 7.9 "Wave Matrix
//      Multiply Accumulate": the inputs are replicated across the two halves of a wave32); the emulation
//      refuses operands that differ, since the ISA does not say what the hardware does with them.
//   C/D: 8 floats a lane (8 VGPRs)  element e of lane l = D[2e + h][i]      (column i, rows interleaved)
//   Sources: RDNA3 ISA reference guide section 7.9 and its WMMA operand tables; GPUOpen, "How to accelerate AI
//   applications on RDNA 3 using WMMA" (a_frag[e] = A[lane % 16][e], b_frag[e] = B[e][lane % 16],
//   D row = 2 e + lane / 16); the Matrix Instruction Calculator's RDNA3 tables; LLVM IntrinsicsAMDGPU.td
//   (int_amdgcn_wmma_f32_16x16x16_f16: v16f16, v16f16, v8f32; ..._bf16: v16i16 raw bits).
//
// v_wmma_f32_16x16x16_{f16,bf16} on gfx12 (builtins ..._w32_gfx12), 32 lanes, l = 16 h + i:
//   A: 8 halves a lane (4 VGPRs)   element e of lane l = A[i][8 (e / 4) + 4 h + e % 4]   (no replication: the
//                                  half-waves split K in groups of four)
//   B: 8 halves a lane (4 VGPRs)   element e of lane l = B[8 (e / 4) + 4 h + e % 4][i]
//   C/D: 8 floats a lane (8 VGPRs) element e of lane l = D[8 h + e][i]      (column i, rows 8h..8h+7)
//   Sources: the Matrix Instruction Calculator's RDNA4 tables (`-a rdna4 -i v_wmma_f32_16x16x16_f16 -A -R`:
//   A[i][k] in lane i + 16 ((k / 4) % 2), VGPR 2 (k / 8) + (k % 4) / 2, half k % 2; D[i][j] in lane j + 16 (i / 8),
//   VGPR i % 8), kept in tests/amd_emulation/matrix_layouts.json; RDNA4 ISA guide, section 7.12 "Wave Matrix
//   Multiply Accumulate"; LLVM IntrinsicsAMDGPU.td / BuiltinsAMDGPU.def (v8f16 or v8i16 raw bf16, v8f32).
//
// v_mfma_f32_16x16x32_fp8_fp8, 64 lanes, l = 16 q + i (i = l % 16, q = l / 16); A and B are 64-bit (the builtin's
// `long`), 8 bytes a lane, byte b of the operand in VGPR b / 4, bits [8 (b % 4) + 7 : 8 (b % 4)]:
//   A: byte e of lane l = A[i][8q + e]         (row i, k = 8q..8q+7)
//   B: byte e of lane l = B[8q + e][i]         (column i, k = 8q..8q+7)
//   C/D: as v_mfma_f32_16x16x16f16             element e of lane l = D[4q + e][i]
//   Sources: the Matrix Instruction Calculator's CDNA3 tables (`-a cdna3 -i v_mfma_f32_16x16x32_fp8_fp8 -d`:
//   A[i][k] in lane 16 (k / 8) + i, GPR (k / 4) % 2, bits [8 (k % 4) + 7 : 8 (k % 4)]; B[k][j] in lane
//   16 (k / 8) + j; D[i][j] in lane 16 (i / 4) + j, GPR i % 4; "CBSZ and ABID bits supported: False", "BLGP bits
//   supported: False"), kept in tests/amd_emulation/matrix_layouts.json; LLVM IntrinsicsAMDGPU.td
//   (int_amdgcn_mfma_f32_16x16x32_fp8_fp8: i64, i64, v4f32, cbsz, abid, blgp; gfx940 and gfx950). The calculator
//   at the pinned commit has no CDNA4 (gfx950) tables: gfx950 runs the same instruction with the same layout here,
//   reading OCP bytes (gfx950's FP8 is OCP e4m3fn: HIP's amd_hip_ocp_fp_cxx.hpp builds its __hipext_ocp_fp8_e4m3 on
//   gfx950's fp8 builtins). That gfx950 keeps CDNA3's layout is an assumption no table here checks.
//
// v_wmma_f32_16x16x16_fp8_fp8 on gfx12 (builtin ..._w32_gfx12), 32 lanes, l = 16 h + i; A and B are two ints (int2),
// 8 bytes a lane, byte b in VGPR b / 4, bits [8 (b % 4) + 7 : 8 (b % 4)]:
//   A: byte e of lane l = A[i][8h + e]         (the half-waves split K in halves, unlike the 16-bit gfx12 WMMA)
//   B: byte e of lane l = B[8h + e][i]
//   C/D: as the 16-bit gfx12 WMMA               element e of lane l = D[8h + e][i]
//   Sources: the calculator's RDNA4 tables (`-a rdna4 -i v_wmma_f32_16x16x16_fp8_fp8 -w 32 -d`: A[i][k] in lane
//   16 (k / 8) + i, GPR (k / 4) % 2, bits [8 (k % 4) + 7 : 8 (k % 4)]; B[k][j] in lane 16 (k / 8) + j; D[i][j] in
//   lane 16 (i / 8) + j, GPR i % 8; "Src0: FP8 (OCP 4-bit exponent, 3-bit mantissa ...)"), kept in
//   matrix_layouts.json; LLVM BuiltinsAMDGPU.def (__builtin_amdgcn_wmma_f32_16x16x16_fp8_fp8_w32_gfx12: V2i, V2i, V8f).
//
// FP8 bytes (e4m3: sign, 4 exponent bits, 3 mantissa bits, with subnormals; neither variant has infinities):
//   e4m3fnuz (gfx940/941/942): bias 8, max 240, 0x80 the only NaN, no negative zero (the calculator's CDNA3 tables:
//            "FP8 (AMD 4-bit exponent, 3-bit mantissa ...)"; amd_hip_fp8.h's __HIP_E4M3_FNUZ).
//   e4m3fn   (gfx950, gfx12): the OCP 8-bit floating point specification's E4M3: bias 7, max 448, S.1111.111 NaN.
//   They are torch.float8_e4m3fnuz / torch.float8_e4m3fn (tests/test_amd_emulation.py compares all 256 codes).
//
// Arithmetic: 16-bit and 8-bit inputs are converted exactly (fp16, bf16 and fp8 values are exact in fp32), every
// product is exact, and D = sum + C is formed in double and rounded once to fp32 (round to nearest even). The
// hardware also accumulates in fp32 but its internal order and rounding of the dot product are not documented bit
// for bit: kernel tests compare with tolerances, never bit patterns. fp16 denormal inputs are honoured (MFMA and
// WMMA do not flush 16-bit inputs); fp8 subnormal inputs are taken at their value too, which no document found here
// states for the fp8 instructions. A NaN input makes NaN of every D element it reaches.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>

namespace rsd_emu {
namespace amdgcn {

enum class Elem { f16, bf16 };

// Exact value of a 16-bit float given by its bits.
inline float f16_to_float(uint16_t h) {
  const int sign = h >> 15, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  float magnitude;
  if (exponent == 0)
    magnitude = std::ldexp(float(mantissa), -24);  // zero and denormals
  else if (exponent == 31)
    magnitude = mantissa ? NAN : INFINITY;
  else
    magnitude = std::ldexp(float(mantissa | 0x400), exponent - 25);
  return sign ? -magnitude : magnitude;
}

inline float bf16_to_float(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline double to_double(uint16_t bits, Elem elem) {
  return elem == Elem::f16 ? f16_to_float(bits) : bf16_to_float(bits);
}

inline void require(bool ok, const char* what) {
  if (!ok) throw std::logic_error(what);
}

// The two FP8 e4m3 variants (above); which one an instruction reads or writes is the emulated architecture's
// (rsd_emu/wave_ops.h chooses by the target macros).
enum class Fp8 { e4m3fnuz, e4m3fn };

inline int fp8_bias(Fp8 f) { return f == Fp8::e4m3fnuz ? 8 : 7; }
inline double fp8_max(Fp8 f) { return f == Fp8::e4m3fnuz ? 240.0 : 448.0; }

// Exact value of an FP8 code (NaN for the format's NaN codes).
inline double fp8_to_double(uint8_t code, Fp8 f) {
  if (f == Fp8::e4m3fnuz ? code == 0x80 : (code & 0x7f) == 0x7f) return NAN;
  const int exponent = (code >> 3) & 0xf, mantissa = code & 7, bias = fp8_bias(f);
  const double magnitude = exponent == 0 ? std::ldexp(double(mantissa), 1 - bias - 3)  // zero and subnormals
                                         : std::ldexp(double(8 | mantissa), exponent - bias - 3);
  return code & 0x80 ? -magnitude : magnitude;
}

// fp32 -> FP8 as v_cvt_pk_fp8_f32 converts each source.
//
// Emulated, where the sources agree: round to nearest even, FP8 subnormals kept. AMD's HIP header
// hip/amd_detail/amd_hip_fp8.h (cast_to_f8_from_f32, gfx94x) takes v_cvt_pk_fp8_f32 for its round-to-nearest-even
// conversion ("RNE CVT"; v_cvt_sr_fp8_f32 for stochastic rounding), and its software twin (cast_to_f8, from rocBLAS)
// rounds to nearest even into the subnormals; amd_hip_ocp_fp_cxx.hpp does the same on gfx950 with the OCP format.
// A result that rounds to zero is +0 in e4m3fnuz (no -0 there) and keeps the source's sign in e4m3fn (an IEEE
// conversion; torch agrees). fp32 denormal sources (|x| < 2^-126) give that zero whether or not MODE flushes them:
// the smallest FP8 subnormal is 2^-9 (e4m3fn) / 2^-10 (e4m3fnuz). A NaN source gives 0x80 in e4m3fnuz, the format's
// only NaN (amd_hip_fp8.h leaves NaN to the instruction: "propagate NAN/INF, no clipping").
//
// Not documented, and refused (std::logic_error, which rsd_emu turns into a failed launch) instead of guessed:
//   - a finite source whose rounded magnitude exceeds the format's max (240 / 448), and +-infinity: saturate to max
//     or NaN? No ISA text found says. It depends on the VOP3 CLAMP bit (the builtin never sets it) and, in AMD's ISA
//     emulator (ROCm rocm-systems, rocjitsu: f32_to_fp8_e4m3_rne_mode(x, wf.fp16_ovfl())), on MODE.FP16_OVFL; AMD's
//     headers disagree on the default (amd_hip_fp8.h clamps with fmed3 before the instruction when it wants
//     saturation; amd_hip_ocp_host.hpp, the host twin of the gfx950 builtin, returns NaN). torch saturates e4m3fn
//     and returns NaN for e4m3fnuz.
//   - a NaN source in e4m3fn: which of its NaN codes (0x7f or 0xff, i.e. the sign) is not documented.
inline uint8_t fp8_from_float(float x, Fp8 f) {
  const bool fnuz = f == Fp8::e4m3fnuz;
  if (std::isnan(x)) {
    require(fnuz, "v_cvt_pk_fp8_f32: the e4m3fn code of a NaN (0x7f or 0xff) is not documented");
    return 0x80;
  }
  require(!std::isinf(x), "v_cvt_pk_fp8_f32: converting an infinity (saturate or NaN?) is not documented");
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const double a = std::fabs(double(x));
  const int bias = fp8_bias(f), min_exponent = 1 - bias;  // the smallest normal is 2^(1 - bias)
  int exponent = min_exponent;
  if (a != 0) {
    std::frexp(a, &exponent);
    exponent -= 1;  // a = 1.m * 2^exponent
  }
  // Three mantissa bits: the quantum of a's binade (the subnormal quantum below the smallest normal). a / quantum is
  // exact (a power of two), and nearbyint rounds it to nearest even (the default rounding mode).
  const int quantum = (exponent < min_exponent ? min_exponent : exponent) - 3;
  const double rounded = std::ldexp(std::nearbyint(std::ldexp(a, -quantum)), quantum);
  require(rounded <= fp8_max(f),
          "v_cvt_pk_fp8_f32: converting a value beyond the format's max (saturate or NaN?) is not documented");
  if (rounded == 0) return fnuz ? 0 : sign;
  int e = 0;
  std::frexp(rounded, &e);
  e -= 1;
  const int code = e < min_exponent ? int(std::ldexp(rounded, 3 - min_exponent))  // subnormal: exponent field 0
                                    : ((e + bias) << 3) | (int(std::ldexp(rounded, 3 - e)) & 7);
  return uint8_t(code | sign);
}

// v_cvt_pk_fp8_f32, __builtin_amdgcn_cvt_pk_fp8_f32(src0, src1, old, word_sel), for one lane: src0 and src1 as FP8
// codes, src0 in the low byte, written to bits [15:0] of `old` (word_sel false) or [31:16] (true); the other half
// keeps old's bits. Sources: LLVM's intrinsic, i32 @llvm.amdgcn.cvt.pk.fp8.f32(float, float, i32 old, i1 word_sel)
// (as LLVM's AMDGPU codegen tests declare it: `old` is the destination's previous value); amd_hip_fp8.h ("false ->
// WORD0"); amd_hip_ocp_fp_cxx.hpp (__hipext_ocp_fp8x2_e4m3(a, b): the builtin's result, or on the host
// from_float(b) << 8 | from_float(a): src0's code in the low byte).
inline uint32_t cvt_pk_fp8_f32(Fp8 f, float src0, float src1, uint32_t old, bool word_sel) {
  const uint32_t pair = uint32_t(fp8_from_float(src0, f)) | (uint32_t(fp8_from_float(src1, f)) << 8);
  return word_sel ? (old & 0x0000ffffu) | (pair << 16) : (old & 0xffff0000u) | pair;
}

// Where a matrix element lives: lane and element of that lane's operand vector.
struct Slot {
  int lane, element;
};

struct Mfma16x16x16 {
  static constexpr int kLanes = 64, kInput = 4, kAcc = 4, kK = 16;
  static Slot a(int row, int k) { return {row + 16 * (k / 4), k % 4}; }
  static Slot b(int k, int col) { return {col + 16 * (k / 4), k % 4}; }
  static Slot d(int row, int col) { return {col + 16 * (row / 4), row % 4}; }
};

struct Wmma16x16x16W32 {
  static constexpr int kLanes = 32, kInput = 16, kAcc = 8, kK = 16;
  // The copy in lanes 0..15; lanes 16..31 hold the same (checked).
  static Slot a(int row, int k) { return {row, k}; }
  static Slot b(int k, int col) { return {col, k}; }
  static Slot d(int row, int col) { return {col + 16 * (row % 2), row / 2}; }
};

struct Wmma16x16x16W32Gfx12 {
  static constexpr int kLanes = 32, kInput = 8, kAcc = 8, kK = 16;
  static Slot a(int row, int k) { return {row + 16 * ((k / 4) % 2), 4 * (k / 8) + k % 4}; }
  static Slot b(int k, int col) { return {col + 16 * ((k / 4) % 2), 4 * (k / 8) + k % 4}; }
  static Slot d(int row, int col) { return {col + 16 * (row / 8), row % 8}; }
};

// The fp8 layouts: an element is a byte of the lane's 8-byte operand.
struct Mfma16x16x32Fp8 {
  static constexpr int kLanes = 64, kInput = 8, kAcc = 4, kK = 32;
  static Slot a(int row, int k) { return {row + 16 * (k / 8), k % 8}; }
  static Slot b(int k, int col) { return {col + 16 * (k / 8), k % 8}; }
  static Slot d(int row, int col) { return Mfma16x16x16::d(row, col); }
};

struct Wmma16x16x16Fp8Gfx12 {
  static constexpr int kLanes = 32, kInput = 8, kAcc = 8, kK = 16;
  static Slot a(int row, int k) { return {row + 16 * (k / 8), k % 8}; }
  static Slot b(int k, int col) { return {col + 16 * (k / 8), k % 8}; }
  static Slot d(int row, int col) { return Wmma16x16x16W32Gfx12::d(row, col); }
};

// D = A B + C for one wave. a, b: kLanes x kInput input codes (16-bit or 8-bit), `value(code)` the exact value of
// one; c, d: kLanes x kAcc floats (d may alias c).
template <class Layout, class Code, class Value>
void matrix_fma_of(Value value, const Code* a, const Code* b, const float* c, float* d) {
  constexpr int L = Layout::kInput, ACC = Layout::kAcc, K = Layout::kK;
  double A[16][K], B[K][16], C[16][16];
  for (int r = 0; r < 16; ++r)
    for (int k = 0; k < K; ++k) {
      const Slot sa = Layout::a(r, k), sb = Layout::b(k, r);
      A[r][k] = value(a[sa.lane * L + sa.element]);
      B[k][r] = value(b[sb.lane * L + sb.element]);
    }
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < 16; ++n) {
      const Slot sc = Layout::d(r, n);
      C[r][n] = c[sc.lane * ACC + sc.element];
    }
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < 16; ++n) {
      double sum = C[r][n];
      for (int k = 0; k < K; ++k) sum += A[r][k] * B[k][n];
      const Slot s = Layout::d(r, n);
      d[s.lane * ACC + s.element] = float(sum);
    }
}

template <class Layout>
void matrix_fma(Elem elem, const uint16_t* a, const uint16_t* b, const float* c, float* d) {
  matrix_fma_of<Layout>([elem](uint16_t bits) { return to_double(bits, elem); }, a, b, c, d);
}

template <class Layout>
void matrix_fma(Fp8 format, const uint8_t* a, const uint8_t* b, const float* c, float* d) {
  matrix_fma_of<Layout>([format](uint8_t code) { return fp8_to_double(code, format); }, a, b, c, d);
}

// v_mfma_f32_16x16x16f16 (elem f16) and v_mfma_f32_16x16x16bf16_1k (elem bf16): 64 lanes.
inline void mfma_f32_16x16x16(Elem elem, const uint16_t (*a)[4], const uint16_t (*b)[4], const float (*c)[4],
                              float (*d)[4], int cbsz, int abid, int blgp) {
  require(cbsz == 0 && abid == 0 && blgp == 0, "mfma: CBSZ / ABID / BLGP broadcasts are not emulated");
  matrix_fma<Mfma16x16x16>(elem, &a[0][0], &b[0][0], &c[0][0], &d[0][0]);
}

// v_wmma_f32_16x16x16_f16_w32 (elem f16) and v_wmma_f32_16x16x16_bf16_w32 (elem bf16): 32 lanes.
inline void wmma_f32_16x16x16_w32(Elem elem, const uint16_t (*a)[16], const uint16_t (*b)[16],
                                  const float (*c)[8], float (*d)[8]) {
  for (int lane = 0; lane < 16; ++lane) {
    require(std::memcmp(a[lane], a[lane + 16], sizeof(a[0])) == 0,
            "wmma w32: lanes 16..31 must hold the same A operand as lanes 0..15");
    require(std::memcmp(b[lane], b[lane + 16], sizeof(b[0])) == 0,
            "wmma w32: lanes 16..31 must hold the same B operand as lanes 0..15");
  }
  matrix_fma<Wmma16x16x16W32>(elem, &a[0][0], &b[0][0], &c[0][0], &d[0][0]);
}

// v_wmma_f32_16x16x16_f16 / _bf16 on gfx12 (elem f16 / bf16): 32 lanes, every lane its own operands.
inline void wmma_f32_16x16x16_w32_gfx12(Elem elem, const uint16_t (*a)[8], const uint16_t (*b)[8],
                                        const float (*c)[8], float (*d)[8]) {
  matrix_fma<Wmma16x16x16W32Gfx12>(elem, &a[0][0], &b[0][0], &c[0][0], &d[0][0]);
}

// v_mfma_f32_16x16x32_fp8_fp8: 64 lanes, 8 FP8 bytes of A and of B a lane (e4m3fnuz on gfx94x, e4m3fn on gfx950).
// The calculator lists no CBSZ / ABID / BLGP support for it; the builtin still takes them: they must be 0.
inline void mfma_f32_16x16x32_fp8(Fp8 format, const uint8_t (*a)[8], const uint8_t (*b)[8], const float (*c)[4],
                                  float (*d)[4], int cbsz, int abid, int blgp) {
  require(cbsz == 0 && abid == 0 && blgp == 0, "mfma fp8: CBSZ / ABID / BLGP must be 0");
  matrix_fma<Mfma16x16x32Fp8>(format, &a[0][0], &b[0][0], &c[0][0], &d[0][0]);
}

// v_wmma_f32_16x16x16_fp8_fp8 on gfx12: 32 lanes, every lane its own 8 FP8 (e4m3fn) bytes of A and of B.
inline void wmma_f32_16x16x16_fp8_w32_gfx12(Fp8 format, const uint8_t (*a)[8], const uint8_t (*b)[8],
                                            const float (*c)[8], float (*d)[8]) {
  matrix_fma<Wmma16x16x16Fp8Gfx12>(format, &a[0][0], &b[0][0], &c[0][0], &d[0][0]);
}

}  // namespace amdgcn
}  // namespace rsd_emu
