// Exchange between blocks of one grid, through global memory, for kernels whose blocks must see each other's
// partial results within one launch (the GroupNorm kernels: rocm_sd/group_norm/impl.h). Their callers guarantee
// co-residency (see hip/group_norm/group_norm_resident.hip); these helpers give the ordering. Plain loads may hit
// a stale per-CU / per-SM L1 line, so reads of another block's data go through device-coherent loads.
#pragma once

#include "rocm_sd/compat.h"

namespace rsd {

// Adds 1 to *counter, with release semantics: what this thread wrote before is visible to whoever
// acquires the new value. No value comes back, so the thread does not wait for the round trip.
__device__ __forceinline__ void arrive_release(unsigned* counter) {
#if defined(RSD_PLATFORM_CUDA)
  asm volatile("red.release.gpu.global.add.u32 [%0], 1;" : : "l"(counter) : "memory");
#else
  __hip_atomic_fetch_add(counter, 1u, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_AGENT);
#endif
}

__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
#if defined(RSD_PLATFORM_CUDA)
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
#else
  return __hip_atomic_load(p, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_AGENT);
#endif
}

// A float another block wrote (after an acquire that synchronised with its release).
__device__ __forceinline__ float load_coherent(const float* p) {
#if defined(RSD_PLATFORM_CUDA)
  return __ldcg(p);
#else
  return __hip_atomic_load(p, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
#endif
}

// Spins until *counter >= target. Returns false after a bound of several seconds instead of hanging
// forever: the caller then traps, which the host sees as a launch failure rather than a frozen GPU.
// The first polls do not sleep: the waits of the single-pass kernels are short (microseconds), and a sleep
// can overshoot what it asks for.
__device__ __forceinline__ bool wait_at_least(const unsigned* counter, unsigned target) {
  for (uint32_t spins = 0; spins < (1u << 26); ++spins) {
    if (load_acquire(counter) >= target) return true;
    if (spins < 32) continue;
#if defined(RSD_PLATFORM_CUDA)
    __nanosleep(64);
#else
    __builtin_amdgcn_s_sleep(1);
#endif
  }
  return false;
}

}  // namespace rsd
