// rocm_sd compat layer: kernels are written in HIP; this header maps the HIP names they use to CUDA
// when the same source is compiled by nvcc, and gives wave-size-agnostic warp primitives.
//
// Rules for kernel code (see DESIGN.md, convention 6):
//   - include this header, never <cuda_runtime.h> or <hip/hip_runtime.h> directly;
//   - never assume a warp of 32: use RSD_WAVE (device code, compile time) or the device's
//     warpSize queried on the host; CDNA (gfx9) runs wave64, RDNA and NVIDIA wave32;
//   - use the rsd:: shuffles below; they hide the CUDA *_sync masks and HIP's mask-less forms.
// The same platform split for exchanges between the blocks of a grid is in grid_sync.h, for asynchronous
// global -> shared copies in async_copy.h: included by the kernels that use them.
#pragma once

#include "rocm_sd/rtc.h"

#if defined(__HIP__) || defined(__HIP_PLATFORM_AMD__)  // clang -x hip, or a HIP toolchain header
#define RSD_PLATFORM_HIP 1
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
#else
#define RSD_PLATFORM_CUDA 1
#if !RSD_RTC  // NVRTC compiles device code only: no runtime API header (and none of its names is used there)
#include <cuda_runtime.h>
#endif
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

#if !RSD_RTC  // hiprtc and rocm_sd/rtc.h (NVRTC) define the fixed-width integers
#include <stdint.h>
#endif

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

__device__ __forceinline__ void trap() {
#if defined(RSD_PLATFORM_CUDA)
  __trap();
#else
  __builtin_trap();
#endif
}

}  // namespace rsd
