// Build and device facts for `python -m rocm_sd info` and for _ext.py's load checks.
#include <string>

#include "rocm_sd/api.h"
#include "rocm_sd/compat.h"

#ifndef ROCM_SD_TARGETS
#define ROCM_SD_TARGETS "unknown"
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

BuildInfo build_info() {
  BuildInfo b;
#if defined(RSD_PLATFORM_HIP)
  b.platform = "hip";
#else
  b.platform = "cuda";
#endif
  b.targets = ROCM_SD_TARGETS;
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

std::string check_kernel_image(int device) {
  int previous = -1;
  hipError_t err = hipGetDevice(&previous);
  if (err != hipSuccess) return last_error(err);
  if (previous != device && (err = hipSetDevice(device)) != hipSuccess) return last_error(err);
  hipFuncAttributes attr;
  err = hipFuncGetAttributes(&attr, reinterpret_cast<const void*>(&probe_kernel));
  std::string why = err == hipSuccess ? std::string() : last_error(err);
  if (previous != device) (void)hipSetDevice(previous);
  return why;
}

}  // namespace rsd
