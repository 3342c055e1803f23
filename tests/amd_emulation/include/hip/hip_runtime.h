// Stand-in for <hip/hip_runtime.h> when rocm_sd's kernel sources are compiled as host C++ for the CPU
// emulation (tests/amd_emulation): the device-code keywords become host C++, threadIdx / blockIdx name the
// running fiber's coordinates (rsd_emu/lanes.h), the cross-lane builtins become wave-wide operations
// (rsd_emu/wave_ops.h), and the runtime calls rocm_sd's launchers make act on one emulated device.
// Triple-chevron launches are rewritten to rsd_emu::launch(kernel, grid, block, shmem, stream)(args...) by
// tests/amd_emulation/build.py before compiling (no C++ compiler parses <<< >>>).
#pragma once

#include <math.h>  // fmaxf, expf... in the global namespace, as device code names them

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "rsd_emu/lanes.h"

#if !defined(RSD_EMU_ARCH)
#error "RSD_EMU_ARCH (e.g. \"gfx942\") names the emulated device"
#endif

// ---- device-code keywords ----
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
// Shared memory is per block; a block runs on one OS thread from start to end (lanes.h), so a thread_local
// static is exactly one copy per running block. tests/amd_emulation/build.py rewrites every `__shared__`
// declaration of the compiled sources into one, poisoned for each block (rsd_emu::declare_shared); one it did not
// see (in a header) would escape the poisoning, so it does not compile.
#define __shared__ _Pragma("GCC error \"__shared__ outside the sources build.py rewrites (a header?) is not emulated\"")

using dim3 = rsd_emu::Dim3;
#define threadIdx (::rsd_emu::this_lane().thread_idx)
#define blockIdx (::rsd_emu::this_block().block_idx)
#define blockDim (::rsd_emu::this_block().block_dim)
#define gridDim (::rsd_emu::this_block().grid_dim)

inline void __syncthreads() { rsd_emu::block_barrier(); }
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

// ---- math and bit functions of the device libraries, at host precision ----
inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __uint_as_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint32_t __float_as_uint(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
// HIP's min / max overloads for integers (mixed types in their common type, as HIP's templates).
template <class A, class B>
inline std::common_type_t<A, B> min(A a, B b) { return a < b ? a : b; }
template <class A, class B>
inline std::common_type_t<A, B> max(A a, B b) { return a < b ? b : a; }
inline uint32_t __umulhi(uint32_t a, uint32_t b) { return uint32_t((uint64_t(a) * b) >> 32); }

// ---- __bf16, as far as the device pass uses it: a conversion from float ----
// Host clang before 17 cannot convert to __bf16, and a newer one converts by the host's runtime library. The GPU's
// conversion, on every target without a bf16 conversion instruction (gfx9 before gfx950, gfx11, gfx12), is what
// clang 21 emits for static_cast<__bf16>(float): v_bfe_u32 (bit 16), v_add3_u32 (+ 0x7fff + that bit),
// v_or_b32 (| 0x400000), v_cmp_u_f32 (NaN?), v_cndmask_b32, the upper half kept. Round to nearest even, no
// denormal flushed; a NaN keeps its sign and payload and gets the quiet bit (so it cannot round to infinity).
namespace rsd_emu {
struct Bf16 {
  uint16_t bits;
  Bf16(float v) {  // implicit, as a builtin type converts
    uint32_t u;
    std::memcpy(&u, &v, 4);
    bits = uint16_t((v != v ? u | 0x400000u : u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
};
}  // namespace rsd_emu
#define __bf16 ::rsd_emu::Bf16

// ---- HIP's vector type float2, as far as kernels use it: members x, y, 8-byte aligned ----
struct alignas(8) float2 {
  float x, y;
};
inline float2 make_float2(float x, float y) { return float2{x, y}; }

// ---- atomics with HIP memory scopes: host atomics (one coherent memory, scopes are moot) ----
#define __HIP_MEMORY_SCOPE_AGENT 3
namespace rsd_emu {
template <class T>
T atomic_load(const T* p, int order) {
  T v;
  __atomic_load(p, &v, order);
  return v;
}
}  // namespace rsd_emu
#define __hip_atomic_load(p, order, scope) ::rsd_emu::atomic_load(p, order)
#define __hip_atomic_fetch_add(p, v, order, scope) __atomic_fetch_add(p, v, order)
// HIP's atomicAdd: relaxed, device scope; returns the old value.
template <class T>
T atomicAdd(T* p, T v) {
  return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
// HIP's atomicMax (unsigned): relaxed, device scope; returns the old value.
inline unsigned atomicMax(unsigned* p, unsigned v) {
  unsigned old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (old < v && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return old;
}
#define __builtin_amdgcn_s_sleep(n) ::rsd_emu::yield()
// A scheduling hint for the compiler (what may move across it); nothing to execute.
#define __builtin_amdgcn_sched_barrier(mask) ((void)(mask))
// A kernel that traps (the resident GroupNorm's wait past its bound) fails its launch, as on the GPU, instead of
// killing the process that runs the emulation.
#define __builtin_trap() ::rsd_emu::fail("the kernel trapped (__builtin_trap)")

// ---- runtime API ----
enum hipError_t { hipSuccess = 0, hipErrorInvalidDevice = 101, hipErrorLaunchFailure = 719 };
enum hipDeviceAttribute_t {
  hipDeviceAttributeMultiprocessorCount,
  hipDeviceAttributeWarpSize,
  hipDeviceAttributeL2CacheSize,
};
typedef struct ihipStream_t* hipStream_t;
struct hipDeviceProp_t {
  char name[256];
  char gcnArchName[256];
  int multiProcessorCount, warpSize, l2CacheSize, major, minor;
};
struct hipFuncAttributes {
  int maxThreadsPerBlock, numRegs;
  size_t sharedSizeBytes, localSizeBytes;
};

hipError_t hipGetLastError();
const char* hipGetErrorString(hipError_t e);
hipError_t hipGetDevice(int* device);
hipError_t hipSetDevice(int device);
hipError_t hipGetDeviceCount(int* count);
hipError_t hipDeviceGetAttribute(int* value, hipDeviceAttribute_t attr, int device);
hipError_t hipGetDeviceProperties(hipDeviceProp_t* prop, int device);
hipError_t hipRuntimeGetVersion(int* v);
hipError_t hipDriverGetVersion(int* v);
hipError_t hipMemsetAsync(void* p, int value, size_t bytes, hipStream_t stream);

namespace rsd_emu {
// The emulated device: few multiprocessors, each holding a couple of blocks, so that kernels sized from
// these numbers launch small grids whose blocks all run at once (one OS thread each).
constexpr int kMultiprocessors = 4;
constexpr int kBlocksPerMultiprocessor = 2;

void set_launch_error(const std::string& message);

// kernel<<<grid, block, shmem, stream>>>(args...) is rewritten to launch(kernel, grid, block, shmem, stream)(args...).
template <class... Params>
auto launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes = 0, hipStream_t = nullptr) {
  return [=](auto&&... args) {
    if (shared_bytes != 0) {
      set_launch_error("dynamic shared memory is not emulated");
      return;
    }
    std::tuple<std::decay_t<Params>...> params(std::forward<decltype(args)>(args)...);
    const std::function<void()> body = [&]() { std::apply(kernel, params); };
    set_launch_error(run_grid(grid, block, body, kMultiprocessors * kBlocksPerMultiprocessor));
  };
}
}  // namespace rsd_emu

template <class Kernel>
hipError_t hipOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, Kernel, int, size_t) {
  *blocks = rsd_emu::kBlocksPerMultiprocessor;
  return hipSuccess;
}
inline hipError_t hipFuncGetAttributes(hipFuncAttributes* attr, const void*) {
  *attr = hipFuncAttributes{1024, 0, 0, 0};
  return hipSuccess;
}

#include "rsd_emu/wave_ops.h"
