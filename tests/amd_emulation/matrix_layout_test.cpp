// Unit tests of the emulated matrix instructions (rsd_emu/amdgcn_matrix.h) against AMD's documented layouts,
// written here a second time in the documents' own terms (register / lane / half), not through the header's
// layout structs, so that a wrong table in the header cannot agree with itself:
//   1. hand-checked entries of the Matrix Instruction Calculator's --register-layout tables;
//   2. one non-zero element at a time: A = e(i, k), B = e(k, j) must give D = e(i, j), at D's documented place,
//      for every (i, k, j); and C = e(i, j) with A = B = 0 must come back unchanged;
//   3. one random product per instruction against a plain matrix product;
//   4. v_cvt_pk_fp8_f32's packing (which byte, which half, what stays) and its refusals of undocumented inputs.
// Prints "ok <n> checks" or the first failure, exit status 1 on failure. With --tables it prints instead every
// entry of its tables in the calculator's notation, which tests/test_amd_emulation.py compares with the
// calculator's own output (matrix_layouts.json), entry by entry. The FP8 values themselves are compared with
// torch's by tests/test_amd_emulation.py through two more modes: --fp8-decode prints the value of every code of
// both formats, --cvt-pk converts the lines "<format> <old> <word_sel> <src0> <src1>" read from stdin.
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "rsd_emu/amdgcn_matrix.h"

using namespace rsd_emu::amdgcn;

namespace {

int checks = 0;

#define CHECK(cond, ...)                                      \
  do {                                                        \
    ++checks;                                                 \
    if (!(cond)) {                                            \
      std::printf("FAIL %s:%d: ", __FILE__, __LINE__);        \
      std::printf(__VA_ARGS__);                               \
      std::printf("\n");                                      \
      std::exit(1);                                           \
    }                                                         \
  } while (0)

// The documents' tables: (lane, VGPR, 16-bit half, or byte for 8-bit inputs) for inputs, (lane, VGPR) for the fp32
// accumulator.
struct Place {
  int lane, vgpr, half;
};

// v_mfma_f32_16x16x16f16 / bf16_1k (Matrix Instruction Calculator, CDNA2 / CDNA3).
Place mfma_a(int i, int k) { return {i + 16 * (k / 4), (k % 4) / 2, k % 2}; }
Place mfma_b(int k, int j) { return {j + 16 * (k / 4), (k % 4) / 2, k % 2}; }
Place mfma_d(int i, int j) { return {j + 16 * (i / 4), i % 4, 0}; }
// v_wmma_f32_16x16x16_{f16,bf16}_w32 (RDNA3 ISA 7.9; A and B also in lane + 16).
Place wmma_a(int i, int k) { return {i, k / 2, k % 2}; }
Place wmma_b(int k, int j) { return {j, k / 2, k % 2}; }
Place wmma_d(int i, int j) { return {j + 16 * (i % 2), i / 2, 0}; }
// v_wmma_f32_16x16x16_{f16,bf16} on gfx12 (RDNA4 ISA 7.12; the half-waves split K in groups of four).
Place gfx12_a(int i, int k) { return {i + 16 * ((k / 4) % 2), 2 * (k / 8) + (k % 4) / 2, k % 2}; }
Place gfx12_b(int k, int j) { return {j + 16 * ((k / 4) % 2), 2 * (k / 8) + (k % 4) / 2, k % 2}; }
Place gfx12_d(int i, int j) { return {j + 16 * (i / 8), i % 8, 0}; }
// v_mfma_f32_16x16x32_fp8_fp8 (Matrix Instruction Calculator, CDNA3: A[i][k] in lane 16 (k / 8) + i, GPR (k / 4) % 2,
// byte k % 4; D as v_mfma_f32_16x16x16f16).
Place mfma_fp8_a(int i, int k) { return {i + 16 * (k / 8), (k / 4) % 2, k % 4}; }
Place mfma_fp8_b(int k, int j) { return {j + 16 * (k / 8), (k / 4) % 2, k % 4}; }
// v_wmma_f32_16x16x16_fp8_fp8 on gfx12 (calculator, RDNA4: A[i][k] in lane 16 (k / 8) + i, GPR (k / 4) % 2, byte
// k % 4; D as the 16-bit gfx12 WMMA).
Place gfx12_fp8_a(int i, int k) { return {i + 16 * (k / 8), (k / 4) % 2, k % 4}; }
Place gfx12_fp8_b(int k, int j) { return {j + 16 * (k / 8), (k / 4) % 2, k % 4}; }

// The input formats: the two 16-bit ones (rsd_emu's Elem) and the two FP8 variants.
enum class Input { f16, bf16, e4m3fnuz, e4m3fn };

bool is_fp8(Input in) { return in == Input::e4m3fnuz || in == Input::e4m3fn; }
Elem elem_of(Input in) { return in == Input::f16 ? Elem::f16 : Elem::bf16; }
Fp8 fp8_of(Input in) { return in == Input::e4m3fnuz ? Fp8::e4m3fnuz : Fp8::e4m3fn; }

double value_of(Input in, uint16_t bits) {
  return is_fp8(in) ? fp8_to_double(uint8_t(bits), fp8_of(in)) : to_double(bits, elem_of(in));
}

// 1.0: fp16 0x3c00, bf16 0x3f80, e4m3fnuz 0x40 (exponent 8 = bias), e4m3fn 0x38 (exponent 7 = bias).
uint16_t one(Input in) {
  switch (in) {
    case Input::f16: return 0x3c00;
    case Input::bf16: return 0x3f80;
    case Input::e4m3fnuz: return 0x40;
    default: return 0x38;
  }
}

// Bits of a random value exactly representable in the input format (m / 8 with |m| <= 16: at most four significant
// bits, exact in all four). Encode by searching (tiny tables, test-only).
uint16_t bits_of_exact(Input in, float v) {
  for (uint32_t bits = 0; bits < (is_fp8(in) ? 0x100u : 0x10000u); ++bits)
    if (value_of(in, uint16_t(bits)) == v) return uint16_t(bits);
  std::abort();
}

struct Instruction {
  const char* name;
  const char* calculator;  // its key in matrix_layouts.json: "<calculator architecture> <instruction>"
  Input input;
  int lanes, inputs, acc, k;  // inputs: input elements a lane; k: the reduction length
  Place (*a)(int, int);
  Place (*b)(int, int);
  Place (*d)(int, int);
  bool replicated;  // WMMA w32: lanes 16..31 carry A and B too
};

// Inputs are kept as 16-bit codes (an FP8 code in the low byte) and narrowed for the FP8 instructions.
void run(const Instruction& ins, const std::vector<uint16_t>& a, const std::vector<uint16_t>& b,
         const std::vector<float>& c, std::vector<float>& d) {
  d.assign(c.size(), 0.f);
  if (is_fp8(ins.input)) {
    const std::vector<uint8_t> a8(a.begin(), a.end()), b8(b.begin(), b.end());
    const auto* a_lanes = reinterpret_cast<const uint8_t(*)[8]>(a8.data());
    const auto* b_lanes = reinterpret_cast<const uint8_t(*)[8]>(b8.data());
    if (ins.lanes == 64)
      mfma_f32_16x16x32_fp8(fp8_of(ins.input), a_lanes, b_lanes, reinterpret_cast<const float(*)[4]>(c.data()),
                            reinterpret_cast<float(*)[4]>(d.data()), 0, 0, 0);
    else
      wmma_f32_16x16x16_fp8_w32_gfx12(fp8_of(ins.input), a_lanes, b_lanes,
                                      reinterpret_cast<const float(*)[8]>(c.data()),
                                      reinterpret_cast<float(*)[8]>(d.data()));
  } else if (ins.inputs == 8)
    wmma_f32_16x16x16_w32_gfx12(elem_of(ins.input), reinterpret_cast<const uint16_t(*)[8]>(a.data()),
                                reinterpret_cast<const uint16_t(*)[8]>(b.data()),
                                reinterpret_cast<const float(*)[8]>(c.data()), reinterpret_cast<float(*)[8]>(d.data()));
  else if (ins.lanes == 64)
    mfma_f32_16x16x16(elem_of(ins.input), reinterpret_cast<const uint16_t(*)[4]>(a.data()),
                      reinterpret_cast<const uint16_t(*)[4]>(b.data()), reinterpret_cast<const float(*)[4]>(c.data()),
                      reinterpret_cast<float(*)[4]>(d.data()), 0, 0, 0);
  else
    wmma_f32_16x16x16_w32(elem_of(ins.input), reinterpret_cast<const uint16_t(*)[16]>(a.data()),
                          reinterpret_cast<const uint16_t(*)[16]>(b.data()),
                          reinterpret_cast<const float(*)[8]>(c.data()), reinterpret_cast<float(*)[8]>(d.data()));
}

// A VGPR holds two 16-bit inputs or four 8-bit ones.
int input_index(const Instruction& ins, Place p) {
  return p.lane * ins.inputs + (is_fp8(ins.input) ? 4 : 2) * p.vgpr + p.half;
}
int acc_index(const Instruction& ins, Place p) { return p.lane * ins.acc + p.vgpr; }

void put_input(const Instruction& ins, std::vector<uint16_t>& v, Place p, uint16_t bits) {
  v[input_index(ins, p)] = bits;
  if (ins.replicated) v[input_index(ins, {p.lane + 16, p.vgpr, p.half})] = bits;
}

void single_elements(const Instruction& ins) {
  std::vector<uint16_t> a(ins.lanes * ins.inputs), b(a.size());
  std::vector<float> c(ins.lanes * ins.acc), d;
  for (int i = 0; i < 16; ++i)
    for (int k = 0; k < ins.k; ++k)
      for (int j = 0; j < 16; ++j) {
        std::fill(a.begin(), a.end(), 0);
        std::fill(b.begin(), b.end(), 0);
        put_input(ins, a, ins.a(i, k), one(ins.input));
        put_input(ins, b, ins.b(k, j), one(ins.input));
        run(ins, a, b, c, d);
        const int want = acc_index(ins, ins.d(i, j));
        for (int x = 0; x < int(d.size()); ++x)
          CHECK(d[x] == (x == want ? 1.f : 0.f), "%s: A=e(%d,%d) B=e(%d,%d): D slot %d (lane %d vgpr %d) is %g",
                ins.name, i, k, k, j, x, x / ins.acc, x % ins.acc, d[x]);
      }
  std::fill(a.begin(), a.end(), 0);
  std::fill(b.begin(), b.end(), 0);
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      std::fill(c.begin(), c.end(), 0.f);
      c[acc_index(ins, ins.d(i, j))] = 3.f;
      run(ins, a, b, c, d);
      CHECK(d == c, "%s: C=3 e(%d,%d) does not pass through unchanged", ins.name, i, j);
    }
}

void random_product(const Instruction& ins, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> small(-16, 16);
  float A[16][32], B[32][16], C[16][16];
  std::vector<uint16_t> a(ins.lanes * ins.inputs), b(a.size());
  std::vector<float> c(ins.lanes * ins.acc), d;
  for (int r = 0; r < 16; ++r)
    for (int k = 0; k < ins.k; ++k) {
      A[r][k] = small(rng) / 8.f;
      B[k][r] = small(rng) / 8.f;
      put_input(ins, a, ins.a(r, k), bits_of_exact(ins.input, A[r][k]));
      put_input(ins, b, ins.b(k, r), bits_of_exact(ins.input, B[k][r]));
    }
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < 16; ++n) {
      C[r][n] = small(rng) / 4.f;
      c[acc_index(ins, ins.d(r, n))] = C[r][n];
    }
  run(ins, a, b, c, d);
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < 16; ++n) {
      double want = C[r][n];
      for (int k = 0; k < ins.k; ++k) want += double(A[r][k]) * B[k][n];
      CHECK(d[acc_index(ins, ins.d(r, n))] == float(want), "%s: random D[%d][%d] = %g, want %g", ins.name, r, n,
            d[acc_index(ins, ins.d(r, n))], want);
    }
}

// Entries read off the Matrix Instruction Calculator / ISA tables by hand.
struct HandChecked {
  const char* what;
  Place (*table)(int, int);
  int row, col;
  Place want;
};
const HandChecked kHandChecked[] = {
    {"mfma A[0][0]", mfma_a, 0, 0, {0, 0, 0}},      {"mfma A[0][4]", mfma_a, 0, 4, {16, 0, 0}},
    {"mfma A[1][5]", mfma_a, 1, 5, {17, 0, 1}},     {"mfma A[15][15]", mfma_a, 15, 15, {63, 1, 1}},
    {"mfma B[6][2]", mfma_b, 6, 2, {18, 1, 0}},     {"mfma D[5][3]", mfma_d, 5, 3, {19, 1, 0}},
    {"mfma D[15][15]", mfma_d, 15, 15, {63, 3, 0}}, {"wmma A[3][7]", wmma_a, 3, 7, {3, 3, 1}},
    {"wmma B[9][4]", wmma_b, 9, 4, {4, 4, 1}},      {"wmma D[0][0]", wmma_d, 0, 0, {0, 0, 0}},
    {"wmma D[1][0]", wmma_d, 1, 0, {16, 0, 0}},     {"wmma D[2][5]", wmma_d, 2, 5, {5, 1, 0}},
    {"wmma D[15][15]", wmma_d, 15, 15, {31, 7, 0}},  {"gfx12 A[0][4]", gfx12_a, 0, 4, {16, 0, 0}},
    {"gfx12 A[2][9]", gfx12_a, 2, 9, {2, 2, 1}},     {"gfx12 A[3][14]", gfx12_a, 3, 14, {19, 3, 0}},
    {"gfx12 B[7][1]", gfx12_b, 7, 1, {17, 1, 1}},    {"gfx12 D[8][0]", gfx12_d, 8, 0, {16, 0, 0}},
    {"gfx12 D[7][15]", gfx12_d, 7, 15, {15, 7, 0}},
    // fp8: half = byte. The calculator's CDNA3 A row 0 reads v0{0}.[7:0] .. v1{0}.[31:24], then v0{16}.[7:0]...
    {"mfma fp8 A[0][5]", mfma_fp8_a, 0, 5, {0, 1, 1}},
    {"mfma fp8 A[3][8]", mfma_fp8_a, 3, 8, {19, 0, 0}},
    {"mfma fp8 A[15][31]", mfma_fp8_a, 15, 31, {63, 1, 3}},
    {"mfma fp8 B[26][4]", mfma_fp8_b, 26, 4, {52, 0, 2}},
    {"gfx12 fp8 A[1][12]", gfx12_fp8_a, 1, 12, {17, 1, 0}},
    {"gfx12 fp8 B[3][9]", gfx12_fp8_b, 3, 9, {9, 0, 3}},
    {"gfx12 fp8 B[15][15]", gfx12_fp8_b, 15, 15, {31, 1, 3}},
};

void hand_checked() {
  for (const HandChecked& h : kHandChecked) {
    const Place p = h.table(h.row, h.col);
    CHECK(p.lane == h.want.lane && p.vgpr == h.want.vgpr && p.half == h.want.half, "%s: lane %d vgpr %d half %d",
          h.what, p.lane, p.vgpr, p.half);
  }
}

void wmma_refuses_unreplicated_operands() {
  std::vector<uint16_t> a(32 * 16, 0), b(32 * 16, 0);
  std::vector<float> c(32 * 8, 0.f), d;
  a[16 * 16 + 3] = one(Input::f16);  // lane 16 only
  const Instruction ins{"wmma_f16", "", Input::f16, 32, 16, 8, 16, wmma_a, wmma_b, wmma_d, true};
  bool refused = false;
  try {
    run(ins, a, b, c, d);
  } catch (const std::logic_error&) {
    refused = true;
  }
  CHECK(refused, "wmma accepted an A operand that differs between the two half-waves");
}

// The fp8 MFMA twice: gfx94x reads e4m3fnuz bytes, gfx950 OCP e4m3fn ones, in the one layout the calculator has
// (CDNA3's; the second entry has no table of its own, see amdgcn_matrix.h).
const Instruction kInstructions[] = {
    {"v_mfma_f32_16x16x16f16", "cdna3 v_mfma_f32_16x16x16_f16", Input::f16, 64, 4, 4, 16, mfma_a, mfma_b, mfma_d,
     false},
    {"v_mfma_f32_16x16x16bf16_1k", "cdna3 v_mfma_f32_16x16x16_bf16", Input::bf16, 64, 4, 4, 16, mfma_a, mfma_b, mfma_d,
     false},
    {"v_wmma_f32_16x16x16_f16_w32", "rdna3 v_wmma_f32_16x16x16_f16", Input::f16, 32, 16, 8, 16, wmma_a, wmma_b,
     wmma_d, true},
    {"v_wmma_f32_16x16x16_bf16_w32", "rdna3 v_wmma_f32_16x16x16_bf16", Input::bf16, 32, 16, 8, 16, wmma_a, wmma_b,
     wmma_d, true},
    {"v_wmma_f32_16x16x16_f16_w32_gfx12", "rdna4 v_wmma_f32_16x16x16_f16", Input::f16, 32, 8, 8, 16, gfx12_a, gfx12_b,
     gfx12_d, false},
    {"v_wmma_f32_16x16x16_bf16_w32_gfx12", "rdna4 v_wmma_f32_16x16x16_bf16", Input::bf16, 32, 8, 8, 16, gfx12_a,
     gfx12_b, gfx12_d, false},
    {"v_mfma_f32_16x16x32_fp8_fp8 (e4m3fnuz)", "cdna3 v_mfma_f32_16x16x32_fp8_fp8", Input::e4m3fnuz, 64, 8, 4, 32,
     mfma_fp8_a, mfma_fp8_b, mfma_d, false},
    {"v_mfma_f32_16x16x32_fp8_fp8 (e4m3fn, gfx950)", "", Input::e4m3fn, 64, 8, 4, 32, mfma_fp8_a, mfma_fp8_b, mfma_d,
     false},
    {"v_wmma_f32_16x16x16_fp8_fp8_w32_gfx12", "rdna4 v_wmma_f32_16x16x16_fp8_fp8", Input::e4m3fn, 32, 8, 8, 16,
     gfx12_fp8_a, gfx12_fp8_b, gfx12_d, false},
};

// "v<VGPR>{<lane>}" and, for inputs, the bits: ".[15:0]" / ".[31:16]" for 16-bit halves, ".[7:0]" .. ".[31:24]" for
// bytes; replicated inputs list lane + 16 as well.
void print_place(Place p, int input_bits, bool replicated) {
  for (int copy = 0; copy < (replicated ? 2 : 1); ++copy) {
    std::printf("%sv%d{%d}", copy ? " " : "", p.vgpr, p.lane + 16 * copy);
    if (input_bits) std::printf(".[%d:%d]", input_bits * (p.half + 1) - 1, input_bits * p.half);
  }
}

// One line per entry: "<calculator key>|<matrix>|<row>|<column>|<places>"; A is 16 x k, B k x 16, D 16 x 16.
void print_tables() {
  for (const Instruction& ins : kInstructions) {
    if (!*ins.calculator) continue;  // no table of its own
    for (const char* matrix : {"A", "B", "D"}) {
      const int rows = *matrix == 'B' ? ins.k : 16, cols = *matrix == 'A' ? ins.k : 16;
      for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c) {
          std::printf("%s|%s|%d|%d|", ins.calculator, matrix, r, c);
          if (*matrix == 'D') print_place(ins.d(r, c), 0, false);
          else print_place(*matrix == 'A' ? ins.a(r, c) : ins.b(r, c), is_fp8(ins.input) ? 8 : 16, ins.replicated);
          std::printf("\n");
        }
    }
  }
}

// ---- v_cvt_pk_fp8_f32 ----

uint32_t cvt(Fp8 f, float s0, float s1, uint32_t old, bool word_sel) {
  return cvt_pk_fp8_f32(f, s0, s1, old, word_sel);
}

bool refuses(Fp8 f, float s0, float s1) {
  try {
    cvt_pk_fp8_f32(f, s0, s1, 0, false);
  } catch (const std::logic_error&) {
    return true;
  }
  return false;
}

void cvt_pk_fp8() {
  // Packing: src0 in the low byte of the selected half, the other half of `old` kept.
  CHECK(cvt(Fp8::e4m3fn, 1.f, -2.f, 0xdeadbeef, false) == 0xdead0000u + (0xc0u << 8) + 0x38u, "cvt word 0: %08x",
        cvt(Fp8::e4m3fn, 1.f, -2.f, 0xdeadbeef, false));
  CHECK(cvt(Fp8::e4m3fn, 1.f, -2.f, 0xdeadbeef, true) == (0xc038u << 16) + 0xbeefu, "cvt word 1: %08x",
        cvt(Fp8::e4m3fn, 1.f, -2.f, 0xdeadbeef, true));
  CHECK(cvt(Fp8::e4m3fnuz, 1.f, 240.f, 0, false) == 0x7f40u, "cvt fnuz 1, 240: %08x",
        cvt(Fp8::e4m3fnuz, 1.f, 240.f, 0, false));
  // Zero: fnuz has no -0; fn keeps the sign. NaN is fnuz's 0x80.
  CHECK(cvt(Fp8::e4m3fnuz, -0.f, -1e-30f, 0, false) == 0u, "fnuz -0");
  CHECK(cvt(Fp8::e4m3fn, -0.f, -1e-30f, 0, false) == 0x8080u, "fn -0");
  CHECK(cvt(Fp8::e4m3fnuz, NAN, 0.f, 0, false) == 0x80u, "fnuz NaN");
  // Just below the overflow: rounds to max (fnuz: 247.99 < 248, the midpoint to 256; fn: 464 ties to even 448).
  CHECK(cvt(Fp8::e4m3fnuz, 247.9f, 0.f, 0, false) == 0x7fu, "fnuz 247.9");
  CHECK(cvt(Fp8::e4m3fn, 464.f, 0.f, 0, false) == 0x7eu, "fn 464");
  // Undocumented: beyond max, infinities, fn NaN (either source).
  CHECK(refuses(Fp8::e4m3fnuz, 248.f, 0.f) && refuses(Fp8::e4m3fnuz, 0.f, -1e10f), "fnuz overflow accepted");
  CHECK(refuses(Fp8::e4m3fn, 464.5f, 0.f) && refuses(Fp8::e4m3fn, 0.f, -480.f), "fn overflow accepted");
  CHECK(refuses(Fp8::e4m3fnuz, INFINITY, 0.f) && refuses(Fp8::e4m3fn, 0.f, -INFINITY), "infinity accepted");
  CHECK(refuses(Fp8::e4m3fn, NAN, 0.f) && refuses(Fp8::e4m3fn, 1.f, NAN), "fn NaN accepted");
}

Fp8 parse_format(const char* name) {
  if (std::strcmp(name, "e4m3fnuz") == 0) return Fp8::e4m3fnuz;
  if (std::strcmp(name, "e4m3fn") == 0) return Fp8::e4m3fn;
  std::fprintf(stderr, "unknown format %s\n", name);
  std::exit(2);
}

// --fp8-decode: "<format>|<code>|<value as %a>" for every code of both formats ("nan" for NaN).
void print_fp8_decode() {
  for (const char* name : {"e4m3fnuz", "e4m3fn"})
    for (int code = 0; code < 256; ++code) {
      const double v = fp8_to_double(uint8_t(code), parse_format(name));
      if (std::isnan(v)) std::printf("%s|%d|nan\n", name, code);
      else std::printf("%s|%d|%a\n", name, code, v);
    }
}

// --cvt-pk: for each stdin line "<format> <old> <word_sel> <src0> <src1>" (old an integer, sources hexadecimal or
// decimal floats), the result as a decimal uint32, or "refused: <why>".
void run_cvt_pk_lines() {
  char format[32], s0[64], s1[64];
  unsigned long old;
  int word_sel;
  while (std::scanf("%31s %lu %d %63s %63s", format, &old, &word_sel, s0, s1) == 5) {
    try {
      const uint32_t r = cvt_pk_fp8_f32(parse_format(format), std::strtof(s0, nullptr), std::strtof(s1, nullptr),
                                        uint32_t(old), word_sel != 0);
      std::printf("%" PRIu32 "\n", r);
    } catch (const std::logic_error& e) {
      std::printf("refused: %s\n", e.what());
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--tables") == 0) {
    print_tables();
    return 0;
  }
  if (argc > 1 && std::strcmp(argv[1], "--fp8-decode") == 0) {
    print_fp8_decode();
    return 0;
  }
  if (argc > 1 && std::strcmp(argv[1], "--cvt-pk") == 0) {
    run_cvt_pk_lines();
    return 0;
  }
  hand_checked();
  unsigned seed = 1;
  for (const Instruction& ins : kInstructions) {
    single_elements(ins);
    random_product(ins, seed++);
  }
  wmma_refuses_unreplicated_operands();
  cvt_pk_fp8();
  // fp16 denormals and bf16 rounding of inputs are exact conversions, not flushes.
  CHECK(f16_to_float(0x0001) == std::ldexp(1.f, -24), "fp16 smallest denormal");
  CHECK(f16_to_float(0xfbff) == -65504.f, "fp16 lowest");
  CHECK(bf16_to_float(0x4049) == 3.140625f, "bf16 3.140625");
  // fp8: the ends of both formats (every code against torch: tests/test_amd_emulation.py).
  CHECK(fp8_to_double(0x7f, Fp8::e4m3fnuz) == 240 && fp8_to_double(0x7e, Fp8::e4m3fn) == 448, "fp8 max");
  CHECK(fp8_to_double(0x01, Fp8::e4m3fnuz) == std::ldexp(1., -10) &&
            fp8_to_double(0x81, Fp8::e4m3fn) == -std::ldexp(1., -9),
        "fp8 smallest subnormals");
  CHECK(std::isnan(fp8_to_double(0x80, Fp8::e4m3fnuz)) && std::isnan(fp8_to_double(0xff, Fp8::e4m3fn)), "fp8 NaN");
  std::printf("ok %d checks\n", checks);
  return 0;
}
