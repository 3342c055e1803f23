// The host interface of hip/runtime.hip: build and device facts (see rocm_sd/api.h).
#pragma once

#include <string>

namespace rsd {

struct BuildInfo {
  std::string platform;  // "hip" or "cuda"
  std::string targets;   // GPU targets compiled in, ';'-separated (gfx90a;... or 80;90)
  int runtime_version;   // hipRuntimeGetVersion / cudaRuntimeGetVersion of the headers built against
  std::string source_hash;  // of hip/ and ck_templates/ at build time: tuning results are tied to it
};
BuildInfo build_info();

struct DeviceInfo {
  std::string name;
  std::string arch;  // gcnArchName on HIP ("gfx942:sramecc+:xnack-"), "sm_90" on CUDA
  int multiprocessors;
  int wave_size;
  int l2_bytes;
  int driver_version;
};
// Returns an empty string on success, else the runtime's error.
std::string device_info(int device, DeviceInfo* out);

// The device's processor name without feature suffixes ("gfx942", "sm_90"), asked of the runtime once per device
// (its property query is slow, and the kernels' checks ask on every call); "" if the runtime cannot say.
std::string device_arch(int device);

// Whether this build holds machine code the device can run; empty string if yes, else why not.
std::string check_kernel_image(int device);

}  // namespace rsd
