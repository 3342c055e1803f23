// Host-side helpers every kernel launcher uses: element sizes, alignment, vector width, grid size.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "rocm_sd/api.h"
#include "rocm_sd/device.h"

namespace rsd {

inline int elem_bytes(DType d) { return d == DType::f32 ? 4 : 2; }
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline size_t round_up(size_t v, size_t m) { return (v + m - 1) / m * m; }
inline bool aligned(const void* p, int bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Widest access of at most 16 bytes such that its element count divides `unit` (the run of elements a
// vector must not cross: a plane, a row, a group's channels) and every pointer is aligned for it.
inline int widest_vec(DType dtype, int64_t unit, std::initializer_list<const void*> pointers) {
  const int eb = elem_bytes(dtype);
  for (int vec = 16 / eb; vec > 1; vec /= 2) {
    if (unit % vec == 0 && std::all_of(pointers.begin(), pointers.end(), [&](const void* p) {
          return aligned(p, vec * eb);
        }))
      return vec;
  }
  return 1;
}

// Blocks for a grid-stride loop over `work_items` (one per thread): enough to fill every
// multiprocessor `blocks_per_sm` times (bytes in flight, no tail wave), no more.
inline unsigned grid_stride_blocks(int device, int64_t work_items, int threads, int blocks_per_sm = 8) {
  const int64_t fill = int64_t(blocks_per_sm) * device_attribute(device, Attr::multiprocessors, 80);
  return unsigned(std::max<int64_t>(1, std::min(ceil_div(work_items, threads), fill)));
}

}  // namespace rsd
