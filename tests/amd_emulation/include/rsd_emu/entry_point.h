// What the C entry points of the emulated kernels (tests/amd_emulation/entry_<family>.cpp) share: each fills its
// family's argument struct of api.h and calls the same host launcher the real build exports, so launch sizing by
// the device's wave size runs too, and returns "" on success, else the launcher's or the emulation's error
// (for tests/test_amd_emulation.py, through ctypes).
#pragma once

#include <string>

namespace rsd_emu {
inline const char* answer(std::string s) {
  thread_local std::string result;
  result = std::move(s);
  return result.c_str();
}
}  // namespace rsd_emu
