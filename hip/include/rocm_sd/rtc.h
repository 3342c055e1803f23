// Runtime compilation (rocm_sd/jit/: hiprtc on ROCm, NVRTC on NVIDIA) compiles the same kernel sources as the
// build of _C, device code only. RSD_RTC is 1 there: sources keep their host-only parts (system headers, launchers,
// entry points returning std::string) inside `#if !RSD_RTC`. Included first by compat.h and by the api.h headers.
#pragma once

#if defined(__HIPCC_RTC__) || defined(__CUDACC_RTC__)
#define RSD_RTC 1
#else
#define RSD_RTC 0
#endif

#if RSD_RTC
// Neither compiler offers <stdint.h> (NVRTC has no C library headers; hiprtc's clashes with its own definitions in
// namespace __hip_internal). These are hiprtc's own types, so repeating them at global scope is legal there.
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long long int64_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
#endif

#if defined(__CUDACC_RTC__)
// The one <type_traits> name the kernels use (hiprtc has it built in).
namespace std {
template <class A, class B>
struct is_same {
  static constexpr bool value = false;
};
template <class A>
struct is_same<A, A> {
  static constexpr bool value = true;
};
}  // namespace std
#endif

// <math.h>'s INFINITY (both compilers have the math functions built in, not the header's macros).
#if defined(__CUDACC_RTC__) && !defined(INFINITY)
#define INFINITY __int_as_float(0x7f800000)
#elif defined(__HIPCC_RTC__) && !defined(INFINITY)
#define INFINITY __builtin_huge_valf()
#endif
