// Standalone layout-copy (NCHW <-> NHWC) variant timing, fp16: the experiment behind hip/layout_copy.hip's tiled
// kernel (bench/results/2026-11-22-layout_copy-variants-h200.md). Not part of the package or of CI:
//   nvcc -std=c++17 -O3 -Ihip/include -arch=sm_90 bench/experiments/layout_copy_variants.cu -o /tmp/lc && /tmp/lc
#include "rocm_sd/common.h"
#include <cstdio>
#include <vector>
using namespace rsd;
using T = __half;

// K0/K1/K2: the library's register transpose with ROW_THREADS threads along r.
template <int ROW_THREADS, int TILES>
__global__ void __launch_bounds__(256) reg_transpose(const T* __restrict__ in, T* __restrict__ out, int64_t rows, int64_t cols,
                                                     int64_t row_tiles, int64_t col_tiles) {
  constexpr int VEC = 8, kColThreads = 256 / ROW_THREADS;
  constexpr int kTileR = ROW_THREADS * VEC, kTileS = kColThreads * VEC;
  for (int t = 0; t < TILES; ++t) {
    const int64_t tile = int64_t(blockIdx.x) * TILES + t;
    const int64_t n = tile / (row_tiles * col_tiles);
    const int64_t within = tile - n * row_tiles * col_tiles;
    const int64_t tile_r = within / col_tiles, tile_s = within - tile_r * col_tiles;
    const int b = threadIdx.x % ROW_THREADS, a = threadIdx.x / ROW_THREADS;
    const int64_t r0 = tile_r * kTileR + int64_t(b) * VEC, s0 = tile_s * kTileS + int64_t(a) * VEC;
    const T* src = in + n * rows * cols;
    T* dst = out + n * rows * cols;
    uint32_t words[8][4];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const Vec<uint32_t, 4> row = load_vec<uint32_t, 4>(reinterpret_cast<const uint32_t*>(src + (r0 + i) * cols + s0));
#pragma unroll
      for (int k = 0; k < 4; ++k) words[i][k] = row.v[k];
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      Vec<uint32_t, 4> low, high;
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        const uint32_t x = words[2 * m][k], y = words[2 * m + 1][k];
        low.v[m] = (x & 0xffffu) | (y << 16);
        high.v[m] = (x >> 16) | (y & 0xffff0000u);
      }
      store_vec(reinterpret_cast<uint32_t*>(dst + (s0 + 2 * k) * rows + r0), low, false);
      store_vec(reinterpret_cast<uint32_t*>(dst + (s0 + 2 * k + 1) * rows + r0), high, false);
    }
  }
}

// K3: shared-memory tile TR x TS (r x s), 16-byte global accesses on both sides, 128+ contiguous bytes per row.
template <int TR, int TS, bool STREAM = false>
__global__ void __launch_bounds__(256) smem_transpose(const T* __restrict__ in, T* __restrict__ out, int64_t rows, int64_t cols,
                                                      int64_t row_tiles, int64_t col_tiles) {
  constexpr int PITCH = TS + 2;  // 2-byte padding: consecutive rows shift by one bank
  __shared__ T tile_s[TR * PITCH];
  const int64_t tile = blockIdx.x;
  const int64_t n = tile / (row_tiles * col_tiles);
  const int64_t within = tile - n * row_tiles * col_tiles;
  const int64_t tr = within / col_tiles, ts = within - tr * col_tiles;
  const T* src = in + n * rows * cols + tr * TR * cols + ts * TS;
  T* dst = out + n * rows * cols + ts * TS * rows + tr * TR;
  constexpr int kChunksPerRow = TS / 8;
  constexpr int kLoads = TR * kChunksPerRow / 256;
  Vec<uint32_t, 4> v[kLoads];
#pragma unroll
  for (int k = 0; k < kLoads; ++k) {
    const int idx = threadIdx.x + k * 256, r = idx / kChunksPerRow, ch = idx % kChunksPerRow;
    v[k] = load_vec<uint32_t, 4>(reinterpret_cast<const uint32_t*>(src + int64_t(r) * cols + ch * 8));
  }
#pragma unroll
  for (int k = 0; k < kLoads; ++k) {
    const int idx = threadIdx.x + k * 256, r = idx / kChunksPerRow, ch = idx % kChunksPerRow;
    uint32_t* w = reinterpret_cast<uint32_t*>(tile_s + r * PITCH + ch * 8);  // PITCH even: 4-byte aligned
#pragma unroll
    for (int q = 0; q < 4; ++q) w[q] = v[k].v[q];
  }
  __syncthreads();
  constexpr int kOutChunksPerRow = TR / 8;
  constexpr int kStores = TS * kOutChunksPerRow / 256;
#pragma unroll
  for (int k = 0; k < kStores; ++k) {
    const int idx = threadIdx.x + k * 256, s = idx / kOutChunksPerRow, rc = idx % kOutChunksPerRow;
    Vec<T, 8> o;
#pragma unroll
    for (int i = 0; i < 8; ++i) o.v[i] = tile_s[(rc * 8 + i) * PITCH + s];
    store_vec(dst + int64_t(s) * rows + rc * 8, o, STREAM);
  }
}

__global__ void copy_kernel(const uint4* __restrict__ in, uint4* __restrict__ out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) out[i] = in[i];
}

int main() {
  struct Case { int n, c, hw; bool to_nhwc; };
  std::vector<Case> cases = {{1, 128, 512 * 512, true}, {1, 128, 512 * 512, false}, {1, 256, 256 * 256, true},
                             {1, 256, 256 * 256, false}, {1, 512, 128 * 128, true}, {1, 512, 128 * 128, false},
                             {2, 320, 64 * 64, true}, {2, 320, 64 * 64, false}};
  const int kBufs = 4;
  const size_t max_elems = size_t(1) * 128 * 512 * 512;
  std::vector<T*> ins(kBufs), outs(kBufs);
  for (int i = 0; i < kBufs; ++i) { cudaMalloc(&ins[i], max_elems * 2); cudaMalloc(&outs[i], max_elems * 2); }
  T* ref; cudaMalloc(&ref, max_elems * 2);
  std::vector<uint16_t> host(max_elems);
  for (size_t i = 0; i < max_elems; ++i) host[i] = uint16_t((i * 2654435761u) >> 7);
  for (int i = 0; i < kBufs; ++i) cudaMemcpy(ins[i], host.data(), max_elems * 2, cudaMemcpyHostToDevice);
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  auto time = [&](auto launch) {
    for (int w = 0; w < 3; ++w) launch(w % kBufs);
    cudaEventRecord(e0);
    const int iters = 40;
    for (int it = 0; it < iters; ++it) launch(it % kBufs);
    cudaEventRecord(e1); cudaEventSynchronize(e1);
    float ms; cudaEventElapsedTime(&ms, e0, e1);
    return ms * 1000.f / iters;
  };
  printf("%-26s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s\n", "case", "copy", "reg8", "reg4", "reg2", "reg8x2", "reg4x2", "smem64x64", "smem64x128", "s64x64cs", "s128x64", "s32x64");
  for (const Case& cs : cases) {
    const int64_t rows = cs.to_nhwc ? cs.c : cs.hw, cols = cs.to_nhwc ? cs.hw : cs.c;
    const size_t elems = size_t(cs.n) * cs.c * cs.hw, bytes = elems * 2;
    float t_copy = time([&](int i) { copy_kernel<<<132 * 8, 256>>>((const uint4*)ins[i], (uint4*)outs[i], int64_t(bytes / 16)); });
    std::vector<float> ts;
    auto check = [&](const char* name) {  // compare outs[0] with the reference transpose (from reg8)
      std::vector<uint16_t> a(elems), b(elems);
      cudaMemcpy(a.data(), outs[0], bytes, cudaMemcpyDeviceToHost);
      cudaMemcpy(b.data(), ref, bytes, cudaMemcpyDeviceToHost);
      if (a != b) printf("MISMATCH %s\n", name);
    };
    auto reg = [&](auto kernel, int row_threads, int tiles) {
      const int64_t rt = rows / (row_threads * 8), ct = cols / ((256 / row_threads) * 8);
      const int64_t blocks = cs.n * rt * ct / tiles;
      return time([&](int i) { kernel<<<unsigned(blocks), 256>>>(ins[i], outs[i], rows, cols, rt, ct); });
    };
    // reference: simple elementwise transpose
    {
      std::vector<uint16_t> in_h(elems), out_h(elems);
      cudaMemcpy(in_h.data(), ins[0], bytes, cudaMemcpyDeviceToHost);
      for (int64_t nn = 0; nn < cs.n; ++nn)
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t s = 0; s < cols; ++s) out_h[nn * rows * cols + s * rows + r] = in_h[nn * rows * cols + r * cols + s];
      cudaMemcpy(ref, out_h.data(), bytes, cudaMemcpyHostToDevice);
    }
    ts.push_back(reg(reg_transpose<8, 1>, 8, 1)); check("reg8");
    ts.push_back((rows % 32 == 0 && cols % 512 == 0) ? reg(reg_transpose<4, 1>, 4, 1) : -1.f); if (ts.back() > 0) check("reg4");
    ts.push_back((rows % 16 == 0 && cols % 1024 == 0) ? reg(reg_transpose<2, 1>, 2, 1) : -1.f); if (ts.back() > 0) check("reg2");
    ts.push_back(reg(reg_transpose<8, 2>, 8, 2)); check("reg8x2");
    ts.push_back((rows % 32 == 0 && cols % 512 == 0) ? reg(reg_transpose<4, 2>, 4, 2) : -1.f); if (ts.back() > 0) check("reg4x2");
    auto smem = [&](auto kernel, int TR, int TS) {
      if (rows % TR || cols % TS) return -1.f;
      const int64_t rt = rows / TR, ct = cols / TS;
      float t = time([&](int i) { kernel<<<unsigned(cs.n * rt * ct), 256>>>(ins[i], outs[i], rows, cols, rt, ct); });
      check("smem");
      return t;
    };
    ts.push_back(smem(smem_transpose<64, 64>, 64, 64));
    ts.push_back(smem(smem_transpose<64, 128>, 64, 128));
    ts.push_back(smem(smem_transpose<64, 64, true>, 64, 64));
    ts.push_back(smem(smem_transpose<128, 64>, 128, 64));
    ts.push_back(smem(smem_transpose<32, 64>, 32, 64));
    char name[64]; snprintf(name, sizeof name, "(%d,%d,%d) %s", cs.n, cs.c, cs.hw, cs.to_nhwc ? "to_nhwc" : "to_nchw");
    printf("%-26s %9.1f", name, t_copy);
    for (float t : ts) printf(" %9.1f", t);
    printf("   us; best %% of same-bytes copy: ");
    float best = 1e9; for (float t : ts) if (t > 0 && t < best) best = t;
    printf("%.1f%%, GB/s %.0f\n", 100.f * t_copy / best, 2.0 * bytes / best / 1e3);
  }
  // ceiling: 1 GiB copy
  { size_t b = size_t(1) << 29; uint4 *x, *y; cudaMalloc(&x, b); cudaMalloc(&y, b);
    float t = 0; for (int r = 0; r < 2; ++r) { cudaEventRecord(e0); for (int i = 0; i < 10; ++i) copy_kernel<<<132 * 8, 256>>>(x, y, int64_t(b / 16)); cudaEventRecord(e1); cudaEventSynchronize(e1); cudaEventElapsedTime(&t, e0, e1); }
    printf("copy ceiling (512 MiB each way): %.0f GB/s\n", 2.0 * b * 10 / (t * 1e-3) / 1e9); }
  return 0;
}
