// Lets current Composable Kernel headers compile with older HIP headers (Debian's hipcc 5.2, which CI
// uses for the AMD compile checks): CK now names two helpers that HIP 6 headers define.
#pragma once
#include <hip/hip_version.h>
#if HIP_VERSION_MAJOR < 6
#include <cassert>
#include <type_traits>
namespace __hip_internal {
using std::is_same;
}
#ifndef __hip_assert
#define __hip_assert(x) assert(x)
#endif
#endif
