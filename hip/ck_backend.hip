// The Composable Kernel instances in _C, looked up by name. The instances themselves are generated
// (ck_templates/generate.py) and compiled only on ROCm with CK headers (ROCM_SD_WITH_CK); without them
// the list is empty and every call says why, so the Python side needs no special case.
#include <climits>
#include <cstdint>
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

std::vector<std::string> ck_attention_instances() {
  std::vector<std::string> out;
#if defined(ROCM_SD_WITH_CK)
  for (const auto& entry : ck::kAttentionInstances) out.push_back(entry.name);
#endif
  return out;
}

std::string ck_attention_forward(const std::string& name, const AttentionArgs& a) {
#if defined(ROCM_SD_WITH_CK)
  if (a.dtype != DType::f16) return "CK attention instances take fp16";
  // CK indexes with 32-bit ints: sizes and strides must fit (they do at every SD shape).
  const int64_t sizes[] = {a.batch, a.heads, a.q_len, a.kv_len, a.head_dim, a.q_stride[0], a.k_stride[0],
                           a.v_stride[0], a.out_stride[0], a.batch * a.out_stride[0]};
  for (int64_t size : sizes)
    if (size > INT32_MAX) return "a size or stride does not fit CK's 32-bit indices";
  ck::AttentionArgs args{a.q, a.k, a.v, a.out, static_cast<int>(a.batch), static_cast<int>(a.heads),
                         static_cast<int>(a.q_len), static_cast<int>(a.kv_len), static_cast<int>(a.head_dim),
                         {}, {}, {}, {}, a.scale, a.stream};
  for (int i = 0; i < 3; ++i) {
    args.q_stride[i] = static_cast<int>(a.q_stride[i]);
    args.k_stride[i] = static_cast<int>(a.k_stride[i]);
    args.v_stride[i] = static_cast<int>(a.v_stride[i]);
    args.out_stride[i] = static_cast<int>(a.out_stride[i]);
  }
  for (const auto& entry : ck::kAttentionInstances) {
    if (name != entry.name) continue;
    DeviceGuard guard(a.device);
    const char* why = entry.run(args);
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
