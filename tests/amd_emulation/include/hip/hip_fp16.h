// Stand-in for <hip/hip_fp16.h> in the CPU emulation: __half as its bits, with exact round-to-nearest-even
// conversions through clang's _Float16 (the emulation is compiled with clang).
#pragma once

#include <cstdint>

struct __half {
  uint16_t bits;
};

inline float __half2float(__half h) { return float(__builtin_bit_cast(_Float16, h.bits)); }
inline __half __float2half_rn(float f) { return __half{__builtin_bit_cast(uint16_t, _Float16(f))}; }
