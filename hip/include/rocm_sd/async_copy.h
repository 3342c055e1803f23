// Global -> shared memory copies that may complete asynchronously, for the double-buffered attention kernels
// (rocm_sd/attention/impl.h).
// NVIDIA sm_80+: cp.async (the copy proceeds while the wave computes; async_wait<N> waits until at most N
// committed groups are still in flight). Elsewhere a plain 16-byte load and store, done at once, so
// the same double-buffered kernel code is correct (without the overlap) on every target.
#pragma once

#include "rocm_sd/compat.h"

namespace rsd {

// `valid` false writes 16 zero bytes and reads nothing (cp.async with source size 0).
__device__ __forceinline__ void copy16_async(void* smem, const void* gmem, bool valid) {
#if defined(RSD_PLATFORM_CUDA) && (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800)
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" : : "r"(address), "l"(gmem), "r"(valid ? 16 : 0) : "memory");
#else
  // A clang vector, not a struct: the struct form was kept in scratch memory by hipcc (four private stores and
  // loads around every 16-byte copy of the attention kernels' tiles on gfx90a / gfx940 / gfx1030).
  typedef uint32_t u32x4 __attribute__((ext_vector_type(4)));
  u32x4 value = {0u, 0u, 0u, 0u};
  if (valid) value = *static_cast<const u32x4*>(gmem);
  *static_cast<u32x4*>(smem) = value;
#endif
}

__device__ __forceinline__ void async_commit() {
#if defined(RSD_PLATFORM_CUDA) && (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800)
  asm volatile("cp.async.commit_group;" : : : "memory");
#endif
}

template <int kPending>
__device__ __forceinline__ void async_wait() {
#if defined(RSD_PLATFORM_CUDA) && (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800)
  asm volatile("cp.async.wait_group %0;" : : "n"(kPending) : "memory");
#endif
}

}  // namespace rsd
