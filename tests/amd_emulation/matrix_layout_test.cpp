// Unit tests of the emulated matrix instructions (rsd_emu/amdgcn_matrix.h) against AMD's documented layouts,
// written here a second time in the documents' own terms (register / lane / half), not through the header's
// layout structs, so that a wrong table in the header cannot agree with itself:
//   1. hand-checked entries of the Matrix Instruction Calculator's --register-layout tables;
//   2. one non-zero element at a time: A = e(i, k), B = e(k, j) must give D = e(i, j), at D's documented place,
//      for every (i, k, j); and C = e(i, j) with A = B = 0 must come back unchanged;
//   3. one random product per instruction against a plain matrix product.
// Prints "ok <n> checks" or the first failure, exit status 1 on failure. With --tables it prints instead every
// entry of its tables in the calculator's notation, which tests/test_amd_emulation.py compares with the
// calculator's own output (matrix_layouts.json), entry by entry.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
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

// The documents' tables: (lane, VGPR, 16-bit half) for inputs, (lane, VGPR) for the fp32 accumulator.
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

uint16_t one(Elem e) { return e == Elem::f16 ? 0x3c00 : 0x3f80; }

// Bits of a random value exactly representable in the 16-bit format (small integers over 8: exact in both).
uint16_t bits_of_exact(Elem e, float v) {
  // v = m / 8 with |m| <= 32: exact in fp16 and bf16. Encode by searching (tiny tables, test-only).
  for (uint32_t bits = 0; bits < 0x10000; ++bits)
    if (to_double(uint16_t(bits), e) == v) return uint16_t(bits);
  std::abort();
}

struct Instruction {
  const char* name;
  const char* calculator;  // its key in matrix_layouts.json: "<calculator architecture> <instruction>"
  Elem elem;
  int lanes, inputs, acc;
  Place (*a)(int, int);
  Place (*b)(int, int);
  Place (*d)(int, int);
  bool replicated;  // WMMA w32: lanes 16..31 carry A and B too
};

void run(const Instruction& ins, const std::vector<uint16_t>& a, const std::vector<uint16_t>& b,
         const std::vector<float>& c, std::vector<float>& d) {
  d.assign(c.size(), 0.f);
  if (ins.inputs == 8)
    wmma_f32_16x16x16_w32_gfx12(ins.elem, reinterpret_cast<const uint16_t(*)[8]>(a.data()),
                                reinterpret_cast<const uint16_t(*)[8]>(b.data()),
                                reinterpret_cast<const float(*)[8]>(c.data()), reinterpret_cast<float(*)[8]>(d.data()));
  else if (ins.lanes == 64)
    mfma_f32_16x16x16(ins.elem, reinterpret_cast<const uint16_t(*)[4]>(a.data()),
                      reinterpret_cast<const uint16_t(*)[4]>(b.data()), reinterpret_cast<const float(*)[4]>(c.data()),
                      reinterpret_cast<float(*)[4]>(d.data()), 0, 0, 0);
  else
    wmma_f32_16x16x16_w32(ins.elem, reinterpret_cast<const uint16_t(*)[16]>(a.data()),
                          reinterpret_cast<const uint16_t(*)[16]>(b.data()),
                          reinterpret_cast<const float(*)[8]>(c.data()), reinterpret_cast<float(*)[8]>(d.data()));
}

int input_index(const Instruction& ins, Place p) { return p.lane * ins.inputs + 2 * p.vgpr + p.half; }
int acc_index(const Instruction& ins, Place p) { return p.lane * ins.acc + p.vgpr; }

void put_input(const Instruction& ins, std::vector<uint16_t>& v, Place p, uint16_t bits) {
  v[input_index(ins, p)] = bits;
  if (ins.replicated) v[input_index(ins, {p.lane + 16, p.vgpr, p.half})] = bits;
}

void single_elements(const Instruction& ins) {
  std::vector<uint16_t> a(ins.lanes * ins.inputs), b(a.size());
  std::vector<float> c(ins.lanes * ins.acc), d;
  for (int i = 0; i < 16; ++i)
    for (int k = 0; k < 16; ++k)
      for (int j = 0; j < 16; ++j) {
        std::fill(a.begin(), a.end(), 0);
        std::fill(b.begin(), b.end(), 0);
        put_input(ins, a, ins.a(i, k), one(ins.elem));
        put_input(ins, b, ins.b(k, j), one(ins.elem));
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
  std::uniform_int_distribution<int> small(-32, 32);
  float A[16][16], B[16][16], C[16][16];
  std::vector<uint16_t> a(ins.lanes * ins.inputs), b(a.size());
  std::vector<float> c(ins.lanes * ins.acc), d;
  for (int r = 0; r < 16; ++r)
    for (int s = 0; s < 16; ++s) {
      A[r][s] = small(rng) / 8.f;
      B[r][s] = small(rng) / 8.f;
      C[r][s] = small(rng) / 4.f;
      put_input(ins, a, ins.a(r, s), bits_of_exact(ins.elem, A[r][s]));
      put_input(ins, b, ins.b(r, s), bits_of_exact(ins.elem, B[r][s]));
      c[acc_index(ins, ins.d(r, s))] = C[r][s];
    }
  run(ins, a, b, c, d);
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < 16; ++n) {
      double want = C[r][n];
      for (int k = 0; k < 16; ++k) want += double(A[r][k]) * B[k][n];
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
  a[16 * 16 + 3] = one(Elem::f16);  // lane 16 only
  const Instruction ins{"wmma_f16", "", Elem::f16, 32, 16, 8, wmma_a, wmma_b, wmma_d, true};
  bool refused = false;
  try {
    run(ins, a, b, c, d);
  } catch (const std::logic_error&) {
    refused = true;
  }
  CHECK(refused, "wmma accepted an A operand that differs between the two half-waves");
}

const Instruction kInstructions[] = {
    {"v_mfma_f32_16x16x16f16", "cdna3 v_mfma_f32_16x16x16_f16", Elem::f16, 64, 4, 4, mfma_a, mfma_b, mfma_d, false},
    {"v_mfma_f32_16x16x16bf16_1k", "cdna3 v_mfma_f32_16x16x16_bf16", Elem::bf16, 64, 4, 4, mfma_a, mfma_b, mfma_d,
     false},
    {"v_wmma_f32_16x16x16_f16_w32", "rdna3 v_wmma_f32_16x16x16_f16", Elem::f16, 32, 16, 8, wmma_a, wmma_b, wmma_d,
     true},
    {"v_wmma_f32_16x16x16_bf16_w32", "rdna3 v_wmma_f32_16x16x16_bf16", Elem::bf16, 32, 16, 8, wmma_a, wmma_b, wmma_d,
     true},
    {"v_wmma_f32_16x16x16_f16_w32_gfx12", "rdna4 v_wmma_f32_16x16x16_f16", Elem::f16, 32, 8, 8, gfx12_a, gfx12_b,
     gfx12_d, false},
    {"v_wmma_f32_16x16x16_bf16_w32_gfx12", "rdna4 v_wmma_f32_16x16x16_bf16", Elem::bf16, 32, 8, 8, gfx12_a, gfx12_b,
     gfx12_d, false},
};

// "v<VGPR>{<lane>}" and, for 16-bit inputs, ".[15:0]" / ".[31:16]"; replicated inputs list lane + 16 as well.
void print_place(Place p, bool input, bool replicated) {
  for (int copy = 0; copy < (replicated ? 2 : 1); ++copy) {
    std::printf("%sv%d{%d}", copy ? " " : "", p.vgpr, p.lane + 16 * copy);
    if (input) std::printf(p.half ? ".[31:16]" : ".[15:0]");
  }
}

// One line per entry: "<calculator key>|<matrix>|<row>|<column>|<places>".
void print_tables() {
  for (const Instruction& ins : kInstructions)
    for (const char* matrix : {"A", "B", "D"})
      for (int r = 0; r < 16; ++r)
        for (int c = 0; c < 16; ++c) {
          std::printf("%s|%s|%d|%d|", ins.calculator, matrix, r, c);
          if (*matrix == 'D') print_place(ins.d(r, c), false, false);
          else print_place(*matrix == 'A' ? ins.a(r, c) : ins.b(r, c), true, ins.replicated);
          std::printf("\n");
        }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--tables") == 0) {
    print_tables();
    return 0;
  }
  hand_checked();
  unsigned seed = 1;
  for (const Instruction& ins : kInstructions) {
    single_elements(ins);
    random_product(ins, seed++);
  }
  wmma_refuses_unreplicated_operands();
  // fp16 denormals and bf16 rounding of inputs are exact conversions, not flushes.
  CHECK(f16_to_float(0x0001) == std::ldexp(1.f, -24), "fp16 smallest denormal");
  CHECK(f16_to_float(0xfbff) == -65504.f, "fp16 lowest");
  CHECK(bf16_to_float(0x4049) == 3.140625f, "bf16 3.140625");
  std::printf("ok %d checks\n", checks);
  return 0;
}
