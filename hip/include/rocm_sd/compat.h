// rocm_sd compat layer: kernels are written in HIP; this header maps the HIP names they use to CUDA
// when the same source is compiled by nvcc, and gives wave-size-agnostic warp primitives.
//
// Rules for kernel code (see DESIGN.md, convention 6):
//   - include this header, never <cuda_runtime.h> or <hip/hip_runtime.h> directly;
//   - never assume a warp of 32: use RSD_WAVE (device code, compile time) or the device's
//     warpSize queried on the host; CDNA (gfx9) runs wave64, RDNA and NVIDIA wave32;
//   - use the rsd:: shuffles below; they hide the CUDA *_sync masks and HIP's mask-less forms.
#pragma once

#if defined(__HIP__) || defined(__HIP_PLATFORM_AMD__)  // clang -x hip, or a HIP toolchain header
#define RSD_PLATFORM_HIP 1
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
#else
#define RSD_PLATFORM_CUDA 1
#include <cuda_runtime.h>
#include <cuda_fp16.h>

// ---- HIP runtime API names used by rocm_sd, spelled for CUDA ----
#define hipError_t cudaError_t
#define hipSuccess cudaSuccess
#define hipGetErrorString cudaGetErrorString
#define hipGetLastError cudaGetLastError
#define hipStream_t cudaStream_t
#define hipGetDevice cudaGetDevice
#define hipSetDevice cudaSetDevice
#define hipGetDeviceCount cudaGetDeviceCount
#define hipDeviceProp_t cudaDeviceProp
#define hipGetDeviceProperties cudaGetDeviceProperties
#define hipDeviceGetAttribute cudaDeviceGetAttribute
#define hipDeviceAttributeMultiprocessorCount cudaDevAttrMultiProcessorCount
#define hipDeviceAttributeWarpSize cudaDevAttrWarpSize
#define hipDeviceAttributeL2CacheSize cudaDevAttrL2CacheSize
#define hipFuncAttributes cudaFuncAttributes
#define hipFuncGetAttributes(attr, fn) cudaFuncGetAttributes(attr, (const void*)(fn))
#define hipRuntimeGetVersion cudaRuntimeGetVersion
#define hipDriverGetVersion cudaDriverGetVersion
#define hipMemsetAsync cudaMemsetAsync
#define hipOccupancyMaxActiveBlocksPerMultiprocessor cudaOccupancyMaxActiveBlocksPerMultiprocessor
#endif

#include <stdint.h>

// ---- wave size in device code ----
// nvcc: 32. clang/hipcc: from the target's family macro (clang 21 deprecates __AMDGCN_WAVEFRONT_SIZE):
// gfx9 (GCN5 / CDNA: gfx90a, gfx942, gfx950) runs wave64 only; gfx10 / gfx11 / gfx12 (RDNA) compile wave32
// (rocm_sd never builds them with -mwavefrontsize64). The host pass has no wave size: host code must ask
// the device.
#if defined(RSD_PLATFORM_CUDA)
#define RSD_WAVE 32
#elif defined(__GFX9__)
#define RSD_WAVE 64
#else
#define RSD_WAVE 32
#endif

// Upper bound of waves in a block of at most 1024 threads, for sizing shared scratch arrays.
#define RSD_MAX_WAVES_PER_BLOCK 32

namespace rsd {

// Butterfly shuffle within a wave (all lanes of the wave must be active).
template <class T>
__device__ __forceinline__ T shfl_xor(T v, int lane_mask) {
#if defined(RSD_PLATFORM_CUDA)
  return __shfl_xor_sync(0xffffffffu, v, lane_mask, RSD_WAVE);
#else
  return __shfl_xor(v, lane_mask, RSD_WAVE);
#endif
}

// Read lane `src` of the wave.
template <class T>
__device__ __forceinline__ T shfl(T v, int src) {
#if defined(RSD_PLATFORM_CUDA)
  return __shfl_sync(0xffffffffu, v, src, RSD_WAVE);
#else
  return __shfl(v, src, RSD_WAVE);
#endif
}

__device__ __forceinline__ int lane_id() { return threadIdx.x % RSD_WAVE; }
__device__ __forceinline__ int wave_id() { return threadIdx.x / RSD_WAVE; }

// Store that should not linger in the last-level cache (output of a pass over a tensor larger
// than L2: keeping it would evict input lines the next pass wants).
template <class V>
__device__ __forceinline__ void store_streaming(V* ptr, const V& v) {
#if defined(RSD_PLATFORM_CUDA)
  if constexpr (sizeof(V) == 16) {
    __stcs(reinterpret_cast<uint4*>(ptr), *reinterpret_cast<const uint4*>(&v));
  } else if constexpr (sizeof(V) == 8) {
    __stcs(reinterpret_cast<uint2*>(ptr), *reinterpret_cast<const uint2*>(&v));
  } else if constexpr (sizeof(V) == 4) {
    __stcs(reinterpret_cast<unsigned int*>(ptr), *reinterpret_cast<const unsigned int*>(&v));
  } else {
    *ptr = v;
  }
#else
  if constexpr (sizeof(V) % 4 == 0) {
    const uint32_t* src = reinterpret_cast<const uint32_t*>(&v);
    uint32_t* dst = reinterpret_cast<uint32_t*>(ptr);
#pragma unroll
    for (int i = 0; i < int(sizeof(V) / 4); ++i) __builtin_nontemporal_store(src[i], dst + i);
  } else {
    *ptr = v;
  }
#endif
}

// ---- exchange between blocks of one grid, through global memory ----
// Used by kernels whose blocks must see each other's partial results within one launch. Their
// callers guarantee co-residency (see group_norm_resident.hip); these helpers give the ordering.
// Plain loads may hit a stale per-CU / per-SM L1 line, so reads of another block's data go through
// device-coherent loads.

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

// ---- global -> shared copies that may complete asynchronously ----
// NVIDIA sm_80+: cp.async (the copy proceeds while the wave computes; async_wait<N> waits until at most N
// committed groups are still in flight). Elsewhere a plain 16-byte load and store, done at once, so
// the same double-buffered kernel code is correct (without the overlap) on every target.
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

__device__ __forceinline__ void trap() {
#if defined(RSD_PLATFORM_CUDA)
  __trap();
#else
  __builtin_trap();
#endif
}

}  // namespace rsd
