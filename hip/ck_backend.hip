// The Composable Kernel instances in _C, looked up by name. The instances themselves are generated
// (ck_templates/generate.py) and compiled only on ROCm with CK headers (ROCM_SD_WITH_CK); without them
// the list is empty and every call says why, so the Python side needs no special case.
#include <string>
#include <vector>

#include "rocm_sd/api.h"
#include "rocm_sd/compat.h"
#include "rocm_sd/device.h"

#if defined(ROCM_SD_WITH_CK)
#include "ck_registry.h"
#endif

namespace rsd {

std::vector<CkGroupNormInstance> ck_group_norm_instances() {
  std::vector<CkGroupNormInstance> out;
#if defined(ROCM_SD_WITH_CK)
  for (const auto& entry : ck::kGroupNormInstances) out.push_back({entry.name, entry.silu});
#endif
  return out;
}

std::string ck_group_norm_forward(const std::string& name, const CkGroupNormCall& a) {
#if defined(ROCM_SD_WITH_CK)
  for (const auto& entry : ck::kGroupNormInstances) {
    if (name != entry.name) continue;
    DeviceGuard guard(a.device);
    const char* why = entry.run({a.x, a.gamma, a.beta, a.y, a.n, a.h, a.w, a.c, a.groups, a.eps, a.stream});
    if (why != nullptr) return why;
    const hipError_t err = hipGetLastError();
    return err == hipSuccess ? std::string() : std::string("CK launch failed: ") + hipGetErrorString(err);
  }
  return "no Composable Kernel instance named " + name + " in this build";
#else
  (void)a;
  return "rocm_sd was built without Composable Kernel (it is built on ROCm when CK headers are found); "
         "cannot run " + name;
#endif
}

}  // namespace rsd
