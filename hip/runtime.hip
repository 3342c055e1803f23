// Build and device facts for `python -m rocm_sd info` and for _ext.py's load checks.
#include <mutex>
#include <string>

#include "rocm_sd/compat.h"
#include "rocm_sd/device.h"
#include "rocm_sd/runtime.h"

#ifndef ROCM_SD_TARGETS
#define ROCM_SD_TARGETS "unknown"
#endif
#ifndef ROCM_SD_SOURCE_HASH
#define ROCM_SD_SOURCE_HASH "unknown"
#endif

namespace rsd {
namespace {

// The smallest kernel there is: used to ask the runtime whether this binary holds code for a device.
__global__ void probe_kernel() {}

std::string last_error(hipError_t err) {
  (void)hipGetLastError();  // clear the sticky non-fatal error
  return hipGetErrorString(err);
}

}  // namespace

int device_attribute(int device, Attr which, int fallback) {
  static int cached[64][int(Attr::count)] = {};  // 0: not asked yet (no attribute is 0 on a real device)
  if (device < 0 || device >= 64) return fallback;
  int& slot = cached[device][int(which)];
  if (slot == 0) {
    int v = 0;
    hipError_t err = hipSuccess;
    switch (which) {
      case Attr::multiprocessors: err = hipDeviceGetAttribute(&v, hipDeviceAttributeMultiprocessorCount, device); break;
      case Attr::wave_size: err = hipDeviceGetAttribute(&v, hipDeviceAttributeWarpSize, device); break;
      default: err = hipDeviceGetAttribute(&v, hipDeviceAttributeL2CacheSize, device); break;
    }
    if (err != hipSuccess || v <= 0) {
      (void)hipGetLastError();
      v = fallback;
    }
    slot = v;
  }
  return slot;
}

DeviceGuard::DeviceGuard(int device) {
  hipError_t err = hipGetDevice(&previous_);
  if (err == hipSuccess && previous_ != device) {
    err = hipSetDevice(device);
    switched_ = err == hipSuccess;
  }
  if (err != hipSuccess) error_ = last_error(err);
}

DeviceGuard::~DeviceGuard() {
  if (switched_) (void)hipSetDevice(previous_);
}

BuildInfo build_info() {
  BuildInfo b;
#if defined(RSD_PLATFORM_HIP)
  b.platform = "hip";
#else
  b.platform = "cuda";
#endif
  b.targets = ROCM_SD_TARGETS;
  b.source_hash = ROCM_SD_SOURCE_HASH;
  b.runtime_version = 0;
  if (hipRuntimeGetVersion(&b.runtime_version) != hipSuccess) (void)hipGetLastError();
  return b;
}

std::string device_info(int device, DeviceInfo* out) {
  hipDeviceProp_t prop;
  hipError_t err = hipGetDeviceProperties(&prop, device);
  if (err != hipSuccess) return last_error(err);
  out->name = prop.name;
#if defined(RSD_PLATFORM_HIP)
  out->arch = prop.gcnArchName;
#else
  out->arch = "sm_" + std::to_string(prop.major) + std::to_string(prop.minor);
#endif
  out->multiprocessors = prop.multiProcessorCount;
  out->wave_size = prop.warpSize;
  out->l2_bytes = prop.l2CacheSize;
  out->driver_version = 0;
  if (hipDriverGetVersion(&out->driver_version) != hipSuccess) (void)hipGetLastError();
  return std::string();
}

std::string device_arch(int device) {
  static std::mutex mutex;
  static std::string cached[64];
  if (device < 0 || device >= 64) return std::string();
  std::lock_guard<std::mutex> lock(mutex);
  DeviceInfo info;
  if (cached[device].empty() && device_info(device, &info).empty())
    cached[device] = info.arch.substr(0, info.arch.find(':'));
  return cached[device];
}

std::string check_kernel_image(int device) {
  DeviceGuard guard(device);
  if (!guard.error().empty()) return guard.error();
  hipFuncAttributes attr;
  const hipError_t err = hipFuncGetAttributes(&attr, reinterpret_cast<const void*>(&probe_kernel));
  return err == hipSuccess ? std::string() : last_error(err);
}

}  // namespace rsd
