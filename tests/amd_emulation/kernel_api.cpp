// C entry points of the emulated kernels for tests/test_amd_emulation.py (ctypes): each fills the family's
// argument struct of api.h and calls the same host launcher the real build exports, so launch sizing by the
// device's wave size runs too. Each returns "" on success, else the launcher's or the emulation's error.
#include <string>

#include "rocm_sd/api.h"

namespace {
thread_local std::string result;
const char* answer(std::string s) {
  result = std::move(s);
  return result.c_str();
}
}  // namespace

extern "C" {

const char* rsd_emu_layer_norm(const void* x, const void* residual, void* sum, void* y, const void* gamma,
                               const void* beta, int dtype, int param_dtype, int64_t rows, int64_t c, float eps) {
  rsd::LayerNormArgs a{};
  a.x = x;
  a.y = y;
  a.gamma = gamma;
  a.beta = beta;
  a.dtype = rsd::DType(dtype);
  a.param_dtype = rsd::DType(param_dtype);
  a.rows = rows;
  a.c = c;
  a.eps = eps;
  a.stream = nullptr;
  a.device = 0;
  a.residual = residual;
  a.sum = sum;
  return answer(rsd::layer_norm_forward(a));
}

}  // extern "C"
