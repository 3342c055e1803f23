// Device attributes the launchers need on every call, asked from the runtime once per device.
#pragma once

#include <string>

namespace rsd {

enum class Attr : int { multiprocessors = 0, wave_size, l2_bytes, count };

// The attribute of `device`, or `fallback` when the runtime cannot answer. Callers pick fallbacks
// that are safe rather than fast (e.g. a wave of 64 sizes grids for more waves than needed).
int device_attribute(int device, Attr which, int fallback);

// Makes `device` current for the guard's lifetime (launches, occupancy queries and memsets act on
// the current device); restores the previous one. error() is non-empty when the switch failed.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  const std::string& error() const { return error_; }

 private:
  int previous_ = -1;
  bool switched_ = false;
  std::string error_;
};

}  // namespace rsd
