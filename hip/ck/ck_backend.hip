// The Composable Kernel instances in _C, looked up by name. The instances themselves are generated
// (ck_templates/generate.py) and compiled only on ROCm with CK headers (ROCM_SD_WITH_CK); without them
// the lists are empty and every call says why, so the Python side needs no special case.
#include <climits>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "rocm_sd/ck/api.h"
#include "rocm_sd/compat.h"
#include "rocm_sd/device.h"
#include "rocm_sd/runtime.h"  // device_arch

#if defined(ROCM_SD_WITH_CK)
#include "ck_registry.h"
#endif

namespace rsd {
namespace {

#if defined(ROCM_SD_WITH_CK)
// Whether an entry compiled for `targets` (its registry row: "gfx942;gfx950") has code for a GPU of `arch`
// (gcnArchName, "gfx942:sramecc+:xnack-", or its processor alone); every entry when `arch` is empty.
bool built_for(const char* targets, const std::string& arch) {
  if (arch.empty()) return true;
  const std::string processor = arch.substr(0, arch.find(':'));
  const std::string list = targets;
  for (size_t start = 0; start <= list.size();) {
    size_t end = list.find(';', start);
    if (end == std::string::npos) end = list.size();
    const std::string target = list.substr(start, end - start);
    if (target.substr(0, target.find(':')) == processor) return true;
    start = end + 1;
  }
  return false;
}

template <typename Table>
std::vector<std::string> names_of(const Table& table, const std::string& arch) {
  std::vector<std::string> out;
  for (const auto& entry : table)
    if (built_for(entry.targets, arch)) out.push_back(entry.name);
  return out;
}

// Runs the instance of `table` named `name` on `device`: "" on success, else why it could not (among the
// reasons: the device's arch is not one the instance was compiled for, whose code object would lack it).
template <typename Table, typename Args>
std::string run_named(const Table& table, const std::string& name, int device, const Args& args) {
  for (const auto& entry : table) {
    if (name != entry.name) continue;
    const std::string arch = device_arch(device);
    if (arch.empty()) return "cannot read the architecture of GPU " + std::to_string(device);
    if (!built_for(entry.targets, arch))
      return name + " is built for " + entry.targets + " only, not for this GPU (" + arch + ")";
    DeviceGuard guard(device);
    const char* why = entry.run(args);
    if (why != nullptr) return why;
    const hipError_t err = hipGetLastError();
    return err == hipSuccess ? std::string() : std::string("CK launch failed: ") + hipGetErrorString(err);
  }
  return "no Composable Kernel instance named " + name + " in this build";
}

// CK indexes with 32-bit ints: every size and offset must fit (they do at every SD shape).
bool fits_int32(std::initializer_list<int64_t> sizes) {
  for (int64_t size : sizes)
    if (size > INT32_MAX) return false;
  return true;
}
constexpr const char* kTooLarge = "a size or stride does not fit CK's 32-bit indices";
#else
std::string without_ck(const std::string& name) {
  return "rocm_sd was built without Composable Kernel (it is built on ROCm when CK headers are found); "
         "cannot run " + name;
}
#endif

}  // namespace

std::vector<CkGroupNormInstance> ck_group_norm_instances(const std::string& arch) {
  std::vector<CkGroupNormInstance> out;
#if defined(ROCM_SD_WITH_CK)
  for (const auto& entry : ck::kGroupNormInstances)
    if (built_for(entry.targets, arch)) out.push_back({entry.name, entry.silu});
#else
  (void)arch;
#endif
  return out;
}

std::string ck_group_norm_forward(const std::string& name, const CkGroupNormCall& a) {
#if defined(ROCM_SD_WITH_CK)
  return run_named(ck::kGroupNormInstances, name, a.device,
                   ck::GroupNormArgs{a.x, a.gamma, a.beta, a.y, a.n, a.h, a.w, a.c, a.groups, a.eps, a.stream});
#else
  (void)a;
  return without_ck(name);
#endif
}

std::vector<std::string> ck_attention_instances(const std::string& arch) {
#if defined(ROCM_SD_WITH_CK)
  return names_of(ck::kAttentionInstances, arch);
#else
  (void)arch;
  return {};
#endif
}

std::string ck_attention_forward(const std::string& name, const AttentionArgs& a) {
#if defined(ROCM_SD_WITH_CK)
  if (a.dtype != DType::f16) return "CK attention instances take fp16";
  if (!fits_int32({a.batch, a.heads, a.q_len, a.kv_len, a.head_dim, a.q_stride[0], a.k_stride[0], a.v_stride[0],
                   a.out_stride[0], a.batch * a.out_stride[0]}))
    return kTooLarge;
  ck::AttentionArgs args{a.q, a.k, a.v, a.out, static_cast<int>(a.batch), static_cast<int>(a.heads),
                         static_cast<int>(a.q_len), static_cast<int>(a.kv_len), static_cast<int>(a.head_dim),
                         {}, {}, {}, {}, a.scale, a.stream};
  for (int i = 0; i < 3; ++i) {
    args.q_stride[i] = static_cast<int>(a.q_stride[i]);
    args.k_stride[i] = static_cast<int>(a.k_stride[i]);
    args.v_stride[i] = static_cast<int>(a.v_stride[i]);
    args.out_stride[i] = static_cast<int>(a.out_stride[i]);
  }
  return run_named(ck::kAttentionInstances, name, a.device, args);
#else
  (void)a;
  return without_ck(name);
#endif
}

std::vector<std::string> ck_linear_geglu_instances(const std::string& arch) {
#if defined(ROCM_SD_WITH_CK)
  return names_of(ck::kLinearGegluInstances, arch);
#else
  (void)arch;
  return {};
#endif
}

std::string ck_linear_geglu_forward(const std::string& name, const CkLinearGegluCall& a) {
#if defined(ROCM_SD_WITH_CK)
  if (!fits_int32({a.m * a.x_stride, 2 * a.n * a.k, a.m * a.n})) return kTooLarge;
  return run_named(ck::kLinearGegluInstances, name, a.device,
                   ck::LinearGegluArgs{a.x, a.weight, a.bias, a.gate, a.out, static_cast<int>(a.m),
                                       static_cast<int>(a.n), static_cast<int>(a.k), static_cast<int>(a.x_stride),
                                       a.stream});
#else
  (void)a;
  return without_ck(name);
#endif
}

std::vector<std::string> ck_conv_bias_residual_instances(const std::string& arch) {
#if defined(ROCM_SD_WITH_CK)
  return names_of(ck::kConvBiasResidualInstances, arch);
#else
  (void)arch;
  return {};
#endif
}

std::string ck_conv_bias_residual_forward(const std::string& name, const CkConvBiasResidualCall& a) {
#if defined(ROCM_SD_WITH_CK)
  const int64_t ho = a.h + 2 * a.pad_h - a.r + 1, wo = a.w + 2 * a.pad_w - a.s + 1;
  if (!fits_int32({a.n * a.h * a.w * a.c, a.k * a.r * a.s * a.c, a.n * ho * wo * a.k})) return kTooLarge;
  auto i32 = [](int64_t v) { return static_cast<int>(v); };
  return run_named(ck::kConvBiasResidualInstances, name, a.device,
                   ck::ConvBiasResidualArgs{a.x, a.weight, a.bias, a.residual, a.out, i32(a.n), i32(a.c), i32(a.h),
                                            i32(a.w), i32(a.k), i32(a.r), i32(a.s), i32(a.pad_h), i32(a.pad_w),
                                            a.scale, a.stream});
#else
  (void)a;
  return without_ck(name);
#endif
}

}  // namespace rsd
