// The AMD matrix-core instructions rocm_sd calls, executed on the CPU for one whole wave at a time:
//
//   v_mfma_f32_16x16x16f16 / v_mfma_f32_16x16x16bf16_1k   CDNA (gfx90a, gfx94x, gfx950), wave 64
//   v_wmma_f32_16x16x16_f16_w32 / ..._bf16_w32             RDNA3 (gfx11), wave 32
//   v_wmma_f32_16x16x16_f16 / ..._bf16 (gfx12 builtins)    RDNA4 (gfx12), wave 32
//
// Each computes D = A B + C for 16x16 matrices (A: M x K, B: K x N, C, D: M x N) with 16-bit inputs and fp32
// C / D, the operands spread over the lanes of a wave. This file is the one place where those spreads are
// written down; the wave's lanes are plain arrays here (lane-major), so the semantics can be unit-tested
// without any kernel (tests/amd_emulation/matrix_layout_test.cpp). How a per-lane builtin call in kernel
// code reaches these functions: rsd_emu/wave_ops.h.
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
// Arithmetic: 16-bit inputs are converted exactly (fp16 and bf16 values are exact in fp32), every product is
// exact, and D = sum + C is formed in double and rounded once to fp32 (round to nearest even). The hardware also
// accumulates in fp32 but its internal order and rounding of the 16-term dot product are not documented bit
// for bit: kernel tests compare with tolerances, never bit patterns. fp16 denormal inputs are honoured (MFMA and
// WMMA do not flush 16-bit inputs).
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

// Where a matrix element lives: lane and element of that lane's operand vector.
struct Slot {
  int lane, element;
};

struct Mfma16x16x16 {
  static constexpr int kLanes = 64, kInput = 4, kAcc = 4;
  static Slot a(int row, int k) { return {row + 16 * (k / 4), k % 4}; }
  static Slot b(int k, int col) { return {col + 16 * (k / 4), k % 4}; }
  static Slot d(int row, int col) { return {col + 16 * (row / 4), row % 4}; }
};

struct Wmma16x16x16W32 {
  static constexpr int kLanes = 32, kInput = 16, kAcc = 8;
  // The copy in lanes 0..15; lanes 16..31 hold the same (checked).
  static Slot a(int row, int k) { return {row, k}; }
  static Slot b(int k, int col) { return {col, k}; }
  static Slot d(int row, int col) { return {col + 16 * (row % 2), row / 2}; }
};

struct Wmma16x16x16W32Gfx12 {
  static constexpr int kLanes = 32, kInput = 8, kAcc = 8;
  static Slot a(int row, int k) { return {row + 16 * ((k / 4) % 2), 4 * (k / 8) + k % 4}; }
  static Slot b(int k, int col) { return {col + 16 * ((k / 4) % 2), 4 * (k / 8) + k % 4}; }
  static Slot d(int row, int col) { return {col + 16 * (row / 8), row % 8}; }
};

// D = A B + C for one wave. a, b: kLanes x kInput 16-bit bits; c, d: kLanes x kAcc floats (d may alias c).
template <class Layout>
void matrix_fma(Elem elem, const uint16_t* a, const uint16_t* b, const float* c, float* d) {
  constexpr int L = Layout::kInput, ACC = Layout::kAcc;
  double A[16][16], B[16][16], C[16][16];
  for (int r = 0; r < 16; ++r)
    for (int k = 0; k < 16; ++k) {
      const Slot sa = Layout::a(r, k), sb = Layout::b(r, k), sc = Layout::d(r, k);
      A[r][k] = to_double(a[sa.lane * L + sa.element], elem);
      B[r][k] = to_double(b[sb.lane * L + sb.element], elem);
      C[r][k] = c[sc.lane * ACC + sc.element];
    }
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < 16; ++n) {
      double sum = C[r][n];
      for (int k = 0; k < 16; ++k) sum += A[r][k] * B[k][n];
      const Slot s = Layout::d(r, n);
      d[s.lane * ACC + s.element] = float(sum);
    }
}

inline void require(bool ok, const char* what) {
  if (!ok) throw std::logic_error(what);
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

}  // namespace amdgcn
}  // namespace rsd_emu
