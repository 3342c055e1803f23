// The coalesced copy between NCHW and NHWC (channels_last): a batched transpose
//
//   out[n, s, r] = in[n, r, s]        NCHW -> NHWC: r = channel, s = pixel;  NHWC -> NCHW: r = pixel, s = channel
//
// Two kernels:
//   tiled (16-bit types, both sizes multiples of 64, 16-byte aligned: every SD activation in fp16 / bf16):
//       a block moves a 64 x 64 tile through shared memory. It reads rows of the tile with 16-byte loads
//       (eight threads cover 128 contiguous bytes of a row) and writes rows of the transposed tile the same
//       way; the transpose itself is shared-memory reads of single elements, whose rows are padded by one
//       4-byte word so that the 8 rows a wave reads at once fall in different banks. Measured on H200 (bench/results,
//       2026-11-22-layout_copy-5751c22-*, with streaming stores from 16 MiB): 80.0-83.7% of the 1 GiB copy ceiling
//       at 32-64 MiB and 96% of a same-size copy at 16 MiB, from 54-65% for the register transpose below.
//   register (everything else): each thread moves one VEC x VEC block (VEC elements make one 16-byte
//       vector where the sizes and pointers allow) through its registers: VEC vector loads along s, a
//       register transpose, VEC vector stores along r. The thread at (a, b) of the block (b = tid % 8
//       fastest) owns rows r0 + VEC b and columns s0 + VEC a, so among the lanes of a wave (32 or 64)
//       eight consecutive b cover 8 VEC contiguous elements of one output row (128 bytes at 16-byte
//       vectors), and each input row is read in runs of (wave / 8) vectors.
#include <cstdint>
#include <string>

#include "rocm_sd/api.h"
#include "rocm_sd/common.h"
#include "rocm_sd/compat.h"
#include "rocm_sd/launch.h"

namespace rsd {
namespace {

constexpr int kThreads = 256;
constexpr int kRowThreads = 8;                       // threads along r (fastest)
constexpr int kColThreads = kThreads / kRowThreads;  // threads along s

template <class T, int VEC>
__global__ void __launch_bounds__(kThreads)
    layout_copy_kernel(const T* __restrict__ in, T* __restrict__ out, int64_t rows, int64_t cols, int64_t row_tiles,
                       int64_t col_tiles) {
  constexpr int kTileR = kRowThreads * VEC, kTileS = kColThreads * VEC;
  const int64_t tile = blockIdx.x;
  const int64_t n = tile / (row_tiles * col_tiles);
  const int64_t within = tile - n * row_tiles * col_tiles;
  const int64_t tile_r = within / col_tiles, tile_s = within - tile_r * col_tiles;
  const int b = threadIdx.x % kRowThreads, a = threadIdx.x / kRowThreads;
  const int64_t r0 = tile_r * kTileR + int64_t(b) * VEC, s0 = tile_s * kTileS + int64_t(a) * VEC;
  if (r0 >= rows || s0 >= cols) return;  // VEC divides rows and cols: a block is all in or all out
  const T* src = in + n * rows * cols;
  T* dst = out + n * rows * cols;
  if constexpr (sizeof(T) == 2 && VEC == 8) {
    // 2-byte elements as 32-bit pairs: output rows 2k and 2k + 1 take the low and the high halves of word k of
    // two input rows at a time, one byte permute per output word (16-bit element moves cost one each).
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
  } else {
    Vec<T, VEC> block[VEC];
#pragma unroll
    for (int i = 0; i < VEC; ++i) block[i] = load_vec<T, VEC>(src + (r0 + i) * cols + s0);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      Vec<T, VEC> column;
#pragma unroll
      for (int i = 0; i < VEC; ++i) column.v[i] = block[i].v[j];
      store_vec(dst + (s0 + j) * rows + r0, column, false);
    }
  }
}

constexpr int kTile = 64;  // tiled kernel: kTile x kTile elements a block

// Grid: one block per (image, tile row, tile column). Requires rows and cols multiples of kTile and both
// pointers 16-byte aligned (tiled_fits).
template <class T>
__global__ void __launch_bounds__(kThreads)
    layout_copy_tiled(const T* __restrict__ in, T* __restrict__ out, int64_t rows, int64_t cols, int64_t row_tiles,
                      int64_t col_tiles, bool streaming) {
  constexpr int kChunk = 16 / int(sizeof(T));                  // elements of one 16-byte access
  constexpr int kPitch = kTile + 4 / int(sizeof(T));            // one 4-byte word of padding a row
  constexpr int kAccesses = kTile * (kTile / kChunk) / kThreads;  // 16-byte accesses a thread, each way
  static_assert(kTile * (kTile / kChunk) % kThreads == 0, "whole accesses per thread");
  __shared__ T tile[kTile * kPitch];
  const int64_t block = blockIdx.x;
  const int64_t n = block / (row_tiles * col_tiles);
  const int64_t within = block - n * row_tiles * col_tiles;
  const int64_t tile_r = within / col_tiles, tile_s = within - tile_r * col_tiles;
  const T* src = in + n * rows * cols + tile_r * kTile * cols + tile_s * kTile;
  T* dst = out + n * rows * cols + tile_s * kTile * rows + tile_r * kTile;
  constexpr int kChunksPerRow = kTile / kChunk;
  Vec<uint32_t, 4> v[kAccesses];
#pragma unroll
  for (int k = 0; k < kAccesses; ++k) {  // all loads first: kAccesses x 16 bytes in flight a thread
    const int idx = threadIdx.x + k * kThreads, r = idx / kChunksPerRow, chunk = idx % kChunksPerRow;
    v[k] = load_vec<uint32_t, 4>(reinterpret_cast<const uint32_t*>(src + int64_t(r) * cols + chunk * kChunk));
  }
#pragma unroll
  for (int k = 0; k < kAccesses; ++k) {
    const int idx = threadIdx.x + k * kThreads, r = idx / kChunksPerRow, chunk = idx % kChunksPerRow;
    uint32_t* words = reinterpret_cast<uint32_t*>(tile + r * kPitch + chunk * kChunk);  // 4-byte aligned rows
#pragma unroll
    for (int q = 0; q < 4; ++q) words[q] = v[k].v[q];
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < kAccesses; ++k) {
    const int idx = threadIdx.x + k * kThreads, s_in_tile = idx / kChunksPerRow, chunk = idx % kChunksPerRow;
    Vec<T, kChunk> column;
#pragma unroll
    for (int i = 0; i < kChunk; ++i) column.v[i] = tile[(chunk * kChunk + i) * kPitch + s_in_tile];
    store_vec(dst + int64_t(s_in_tile) * rows + chunk * kChunk, column, streaming);
  }
}

template <class T, int VEC>
void launch_vec(const LayoutCopyArgs& a, int64_t rows, int64_t cols, hipStream_t stream) {
  const int64_t row_tiles = ceil_div(rows, kRowThreads * VEC), col_tiles = ceil_div(cols, kColThreads * VEC);
  layout_copy_kernel<T, VEC><<<unsigned(a.n * row_tiles * col_tiles), kThreads, 0, stream>>>(
      static_cast<const T*>(a.in), static_cast<T*>(a.out), rows, cols, row_tiles, col_tiles);
}

template <class T>
void launch(const LayoutCopyArgs& a, int64_t rows, int64_t cols, int vec, bool tiled, hipStream_t stream) {
  if (tiled) {
    const int64_t row_tiles = rows / kTile, col_tiles = cols / kTile;
    // Streaming (evict-first) stores for large outputs: measured on H200 at 64 / 32 / 16 MiB, 40.4 -> 38.5,
    // 22.5 -> 20.9, 13.0 -> 11.6 us (the written lines no longer push out input lines still to be read).
    // Smaller outputs keep normal stores, so that the op after the copy finds them in L2.
    const bool streaming = a.n * rows * cols * int64_t(sizeof(T)) >= (int64_t(16) << 20);
    layout_copy_tiled<T><<<unsigned(a.n * row_tiles * col_tiles), kThreads, 0, stream>>>(
        static_cast<const T*>(a.in), static_cast<T*>(a.out), rows, cols, row_tiles, col_tiles, streaming);
    return;
  }
  switch (vec) {
    case 8: if constexpr (sizeof(T) == 2) launch_vec<T, 8>(a, rows, cols, stream); break;
    case 4: launch_vec<T, 4>(a, rows, cols, stream); break;
    case 2: launch_vec<T, 2>(a, rows, cols, stream); break;
    default: launch_vec<T, 1>(a, rows, cols, stream); break;
  }
}

// (rows, cols) of each image's [rows, cols] input matrix.
void matrix_of(const LayoutCopyArgs& a, int64_t* rows, int64_t* cols) {
  *rows = a.to_channels_last ? a.c : a.hw;
  *cols = a.to_channels_last ? a.hw : a.c;
}

// A vector is VEC consecutive elements of a row on both sides: VEC divides both sizes.
int pick_vec(const LayoutCopyArgs& a) {
  const int along_c = widest_vec(a.dtype, a.c, {a.in, a.out}), along_hw = widest_vec(a.dtype, a.hw, {a.in, a.out});
  return along_c < along_hw ? along_c : along_hw;
}

// 16-bit types only: in fp32 the tiled kernel measured within +-10% of the register one, slower in half the
// cases (four 4-byte shared-memory reads a vector instead of eight 2-byte ones, 2-way bank conflicts).
bool tiled_fits(const LayoutCopyArgs& a) {
  int64_t rows, cols;
  matrix_of(a, &rows, &cols);
  return elem_bytes(a.dtype) == 2 && rows % kTile == 0 && cols % kTile == 0 && aligned(a.in, 16) &&
         aligned(a.out, 16);
}

int64_t block_count(const LayoutCopyArgs& a, int vec, bool tiled) {
  int64_t rows, cols;
  matrix_of(a, &rows, &cols);
  if (tiled) return a.n * (rows / kTile) * (cols / kTile);
  return a.n * ceil_div(rows, kRowThreads * vec) * ceil_div(cols, kColThreads * vec);
}

}  // namespace

std::string layout_copy_check(const LayoutCopyArgs& a) {
  if (a.n <= 0 || a.c <= 0 || a.hw <= 0) return "empty tensor";
  const int eb = elem_bytes(a.dtype);
  if (!aligned(a.in, eb) || !aligned(a.out, eb)) return "misaligned data pointer";
  if (block_count(a, pick_vec(a), tiled_fits(a)) >= (int64_t(1) << 31)) return "more than 2^31 blocks";
  return std::string();
}

std::string layout_copy_describe(const LayoutCopyArgs& a) {
  const std::string why = layout_copy_check(a);
  if (!why.empty()) return "error: " + why;
  const int vec = pick_vec(a);
  const bool tiled = tiled_fits(a);
  return "vec=" + std::to_string(tiled ? 16 / elem_bytes(a.dtype) : vec) + (tiled ? " tile=64x64" : "") +
         " blocks=" + std::to_string(block_count(a, vec, tiled));
}

std::string layout_copy_forward(const LayoutCopyArgs& a) {
  std::string why = layout_copy_check(a);
  if (!why.empty()) return why;
  DeviceGuard guard(a.device);
  if (!guard.error().empty()) return guard.error();
  int64_t rows, cols;
  matrix_of(a, &rows, &cols);
  const int vec = pick_vec(a);
  const bool tiled = tiled_fits(a);
  hipStream_t stream = static_cast<hipStream_t>(a.stream);
  switch (a.dtype) {
    case DType::f32: launch<float>(a, rows, cols, vec, tiled, stream); break;
    case DType::f16: launch<__half>(a, rows, cols, vec, tiled, stream); break;
    case DType::bf16: launch<bf16>(a, rows, cols, vec, tiled, stream); break;
  }
  const hipError_t err = hipGetLastError();
  if (err != hipSuccess) return std::string("layout_copy launch failed: ") + hipGetErrorString(err);
  return std::string();
}

}  // namespace rsd
