// PYBIND11_MODULE(_C): the Python face of the kernels. Pointers and streams travel as integers;
// no torch and no GPU runtime headers here (see rocm_sd/api.h).
//
// One convention for every op <op> (its entry points in rocm_sd/<op>/api.h, bound under the same names):
//   <op>_check(args..., device) -> str              why the kernel cannot take these arguments, "" when it can
//   <op>_forward(args..., stream, device)           enqueues the kernels; raises RuntimeError with the reason
//   <op>_describe(...) -> str, <op>_workspace_bytes(...) -> int     where the op has them
// and for the Composable Kernel instances (rocm_sd/ck/api.h):
//   ck_<op>_instances(arch="")                      the instances with code for a GPU of `arch`
//   ck_<op>_forward(name, args..., stream, device)  runs one instance by name; raises why it cannot
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <stdexcept>

#include "rocm_sd/ada_layer_norm/api.h"
#include "rocm_sd/attention/api.h"
#include "rocm_sd/attention_fp8/api.h"
#include "rocm_sd/bias_residual/api.h"
#include "rocm_sd/ck/api.h"
#include "rocm_sd/geglu/api.h"
#include "rocm_sd/gelu_tanh/api.h"
#include "rocm_sd/group_norm/api.h"
#include "rocm_sd/im2col_quantize/api.h"
#include "rocm_sd/layer_norm/api.h"
#include "rocm_sd/parity_shuffle/api.h"
#include "rocm_sd/quantize/api.h"
#include "rocm_sd/rms_norm/api.h"
#include "rocm_sd/runtime.h"

namespace py = pybind11;

namespace {

const void* as_ptr(uintptr_t p) { return reinterpret_cast<const void*>(p); }
const void* as_ptr_or_null(uintptr_t p) { return p ? as_ptr(p) : nullptr; }
void* as_mut_ptr(uintptr_t p) { return reinterpret_cast<void*>(p); }

void raise_if(const std::string& error) {
  if (!error.empty()) throw std::runtime_error(error);
}

rsd::GroupNormArgs group_norm_args(uintptr_t x, uintptr_t y, uintptr_t gamma, uintptr_t beta, int dtype,
                                   int param_dtype, int layout, int64_t n, int64_t c, int64_t hw, int groups,
                                   double eps, bool silu, uintptr_t workspace, uintptr_t stream, int device,
                                   int path = 0) {
  rsd::GroupNormArgs a;
  a.x = as_ptr(x);
  a.y = as_mut_ptr(y);
  a.gamma = as_ptr_or_null(gamma);
  a.beta = as_ptr_or_null(beta);
  a.dtype = static_cast<rsd::DType>(dtype);
  a.param_dtype = static_cast<rsd::DType>(param_dtype);
  a.layout = static_cast<rsd::Layout>(layout);
  a.n = n;
  a.c = c;
  a.hw = hw;
  a.groups = groups;
  a.eps = static_cast<float>(eps);
  a.silu = silu;
  a.workspace = as_mut_ptr(workspace);
  a.stream = as_mut_ptr(stream);
  a.device = device;
  a.path = static_cast<rsd::GroupNormPath>(path);
  return a;
}

rsd::GegluArgs geglu_args(uintptr_t x, uintptr_t y, int dtype, int64_t rows, int64_t d, uintptr_t stream,
                          int device, uintptr_t q, uintptr_t scale, int format, double bound) {
  return {as_ptr(x), as_mut_ptr(y), static_cast<rsd::DType>(dtype), rows, d, as_mut_ptr(stream), device,
          q ? as_mut_ptr(q) : nullptr, static_cast<float*>(scale ? as_mut_ptr(scale) : nullptr),
          static_cast<rsd::QuantFormat>(format), static_cast<float>(bound)};
}

rsd::GeluTanhArgs gelu_tanh_args(uintptr_t x, uintptr_t bias, uintptr_t y, int dtype, int64_t rows, int64_t d,
                                  uintptr_t stream, int device, uintptr_t q, uintptr_t scale, int format, double bound) {
  return {as_ptr(x), as_ptr_or_null(bias), y ? as_mut_ptr(y) : nullptr, static_cast<rsd::DType>(dtype), rows, d,
          as_mut_ptr(stream), device, q ? as_mut_ptr(q) : nullptr,
          static_cast<float*>(scale ? as_mut_ptr(scale) : nullptr), static_cast<rsd::QuantFormat>(format),
          static_cast<float>(bound)};
}

rsd::QuantizeRowsArgs quantize_rows_args(uintptr_t x, uintptr_t q, uintptr_t scale, int dtype, int format, int64_t rows,
                                         int64_t k, uintptr_t stream, int device, int64_t rows_per_batch = 0,
                                         int64_t batch_stride = 0) {
  return {as_ptr(x), as_mut_ptr(q), static_cast<float*>(as_mut_ptr(scale)), static_cast<rsd::DType>(dtype),
          static_cast<rsd::QuantFormat>(format), rows, k, as_mut_ptr(stream), device, rows_per_batch, batch_stride};
}

rsd::Im2colQuantizeArgs im2col_quantize_args(uintptr_t x, uintptr_t q, uintptr_t scale, int dtype, int format, int64_t n,
                                             int64_t h, int64_t w, int64_t c, int kh, int kw, int stride_h,
                                             int stride_w, int pad_h, int pad_w, double bound, uintptr_t stream,
                                             int device) {
  return {as_ptr(x), as_mut_ptr(q), static_cast<float*>(as_mut_ptr(scale)), static_cast<rsd::DType>(dtype),
          static_cast<rsd::QuantFormat>(format), n, h, w, c, kh, kw, stride_h, stride_w, pad_h, pad_w,
          static_cast<float>(bound), as_mut_ptr(stream), device};
}

rsd::BiasResidualArgs bias_residual_args(uintptr_t x, uintptr_t residual, uintptr_t bias, uintptr_t y, int dtype,
                                         int layout, int64_t n, int64_t c, int64_t hw, double scale, uintptr_t stream,
                                         int device) {
  return {as_ptr(x), as_ptr(residual), as_ptr(bias), as_mut_ptr(y), static_cast<rsd::DType>(dtype),
          static_cast<rsd::Layout>(layout), n, c, hw, static_cast<float>(scale), as_mut_ptr(stream), device};
}

rsd::ParityShuffleArgs parity_shuffle_args(uintptr_t parities, uintptr_t bias, uintptr_t out, int dtype, int64_t n,
                                           int64_t h, int64_t w, int64_t c, uintptr_t stream, int device) {
  return {as_ptr(parities), as_ptr_or_null(bias), as_mut_ptr(out), static_cast<rsd::DType>(dtype), n, h, w, c,
          as_mut_ptr(stream), device};
}

rsd::LayerNormArgs layer_norm_args(uintptr_t x, uintptr_t y, uintptr_t gamma, uintptr_t beta, int dtype,
                                   int param_dtype, int64_t rows, int64_t c, double eps, uintptr_t stream, int device,
                                   uintptr_t residual, uintptr_t sum, uintptr_t q, uintptr_t scale, int format,
                                   double bound) {
  return {as_ptr(x), as_mut_ptr(y), as_ptr_or_null(gamma), as_ptr_or_null(beta), static_cast<rsd::DType>(dtype),
          static_cast<rsd::DType>(param_dtype), rows, c, static_cast<float>(eps), as_mut_ptr(stream), device,
          as_ptr_or_null(residual), sum ? as_mut_ptr(sum) : nullptr, q ? as_mut_ptr(q) : nullptr,
          static_cast<float*>(scale ? as_mut_ptr(scale) : nullptr), static_cast<rsd::QuantFormat>(format),
          static_cast<float>(bound)};
}

using Strides2 = std::array<int64_t, 2>;

rsd::AdaLayerNormArgs ada_layer_norm_args(uintptr_t x, uintptr_t out, uintptr_t scale, uintptr_t shift, int dtype,
                                          int64_t batch, int64_t tokens, int64_t c, const Strides2& scale_stride,
                                          const Strides2& shift_stride, double eps, uintptr_t stream, int device,
                                          uintptr_t y, uintptr_t gate, const Strides2& gate_stride, uintptr_t h,
                                          uintptr_t q, uintptr_t q_scale, int format, double bound) {
  rsd::AdaLayerNormArgs a{as_ptr(x), out ? as_mut_ptr(out) : nullptr, as_ptr(scale), as_ptr(shift), static_cast<rsd::DType>(dtype),
                          batch, tokens, c, {scale_stride[0], scale_stride[1]}, {shift_stride[0], shift_stride[1]},
                          static_cast<float>(eps), as_mut_ptr(stream), device};
  a.y = as_ptr_or_null(y);
  a.gate = as_ptr_or_null(gate);
  a.gate_stride[0] = gate_stride[0];
  a.gate_stride[1] = gate_stride[1];
  a.h = h ? as_mut_ptr(h) : nullptr;
  a.q = q ? as_mut_ptr(q) : nullptr;
  a.q_scale = static_cast<float*>(q_scale ? as_mut_ptr(q_scale) : nullptr);
  a.format = static_cast<rsd::QuantFormat>(format);
  a.bound = static_cast<float>(bound);
  return a;
}

// sizes: (batch, len, lead_len, heads, d); strides: (batch, sequence, head) of x and of lead.
rsd::RmsNormArgs rms_norm_args(uintptr_t x, uintptr_t weight, uintptr_t lead, uintptr_t lead_weight, uintptr_t cos,
                               uintptr_t sin, uintptr_t y, int dtype, int param_dtype,
                               const std::vector<int64_t>& sizes, const std::vector<int64_t>& x_stride,
                               const std::vector<int64_t>& lead_stride, double eps, uintptr_t stream, int device) {
  if (sizes.size() != 5 || x_stride.size() != 3 || lead_stride.size() != 3)
    throw std::invalid_argument("rms_norm: 5 sizes and 2 stride triples");
  rsd::RmsNormArgs a;
  a.x = as_ptr_or_null(x);
  a.weight = as_ptr_or_null(weight);
  a.lead = as_ptr_or_null(lead);
  a.lead_weight = as_ptr_or_null(lead_weight);
  a.cos = static_cast<const float*>(as_ptr_or_null(cos));
  a.sin = static_cast<const float*>(as_ptr_or_null(sin));
  a.y = as_mut_ptr(y);
  a.dtype = static_cast<rsd::DType>(dtype);
  a.param_dtype = static_cast<rsd::DType>(param_dtype);
  a.batch = sizes[0];
  a.len = sizes[1];
  a.lead_len = sizes[2];
  a.heads = sizes[3];
  a.d = sizes[4];
  for (int i = 0; i < 3; ++i) {
    a.x_stride[i] = x_stride[i];
    a.lead_stride[i] = lead_stride[i];
  }
  a.eps = static_cast<float>(eps);
  a.stream = as_mut_ptr(stream);
  a.device = device;
  return a;
}

// sizes: (batch, heads, q_len, kv_len, head_dim); strides: 4 x (batch, sequence, head) for q, k, v, out.
rsd::AttentionArgs attention_args(uintptr_t q, uintptr_t k, uintptr_t v, uintptr_t out, int dtype,
                                  const std::vector<int64_t>& sizes, const std::vector<std::vector<int64_t>>& strides,
                                  double scale, uintptr_t stream, int device, const std::string& instance) {
  if (sizes.size() != 5 || strides.size() != 4) throw std::invalid_argument("attention: 5 sizes and 4 stride triples");
  rsd::AttentionArgs a;
  a.q = as_ptr(q);
  a.k = as_ptr(k);
  a.v = as_ptr(v);
  a.out = as_mut_ptr(out);
  a.dtype = static_cast<rsd::DType>(dtype);
  a.batch = sizes[0];
  a.heads = sizes[1];
  a.q_len = sizes[2];
  a.kv_len = sizes[3];
  a.head_dim = sizes[4];
  int64_t* targets[4] = {a.q_stride, a.k_stride, a.v_stride, a.out_stride};
  for (int t = 0; t < 4; ++t) {
    if (strides[t].size() != 3) throw std::invalid_argument("attention: stride triples are (batch, sequence, head)");
    for (int i = 0; i < 3; ++i) targets[t][i] = strides[t][i];
  }
  a.scale = static_cast<float>(scale);
  a.stream = as_mut_ptr(stream);
  a.device = device;
  a.instance = instance;
  return a;
}

// attention_check / attention_describe: attention_forward's arguments without the stream; nothing launches.
void def_attention_query(py::module_& m, const char* name, std::string (*query)(const rsd::AttentionArgs&),
                         const char* doc) {
  m.def(
      name,
      [query](uintptr_t q, uintptr_t k, uintptr_t v, uintptr_t out, int dtype, const std::vector<int64_t>& sizes,
              const std::vector<std::vector<int64_t>>& strides, double scale, int device, const std::string& instance) {
        return query(attention_args(q, k, v, out, dtype, sizes, strides, scale, 0, device, instance));
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"), py::arg("dtype"), py::arg("sizes"), py::arg("strides"),
      py::arg("scale"), py::arg("device"), py::arg("instance") = "", doc);
}

// attention_fp8: attention's q, k, v, out, sizes and strides, then the FP8 format and the workspace.
rsd::AttentionFp8Args attention_fp8_args(uintptr_t q, uintptr_t k, uintptr_t v, uintptr_t out, int dtype,
                                         const std::vector<int64_t>& sizes,
                                         const std::vector<std::vector<int64_t>>& strides, double scale, int format,
                                         uintptr_t workspace, uintptr_t stream, int device) {
  return {attention_args(q, k, v, out, dtype, sizes, strides, scale, stream, device, ""),
          static_cast<rsd::QuantFormat>(format), as_mut_ptr(workspace)};
}

// attention_fp8_check / _describe / _workspace_bytes: the forward's arguments without the stream.
template <class Result>
void def_attention_fp8_query(py::module_& m, const char* name, Result (*query)(const rsd::AttentionFp8Args&),
                             const char* doc) {
  m.def(
      name,
      [query](uintptr_t q, uintptr_t k, uintptr_t v, uintptr_t out, int dtype, const std::vector<int64_t>& sizes,
              const std::vector<std::vector<int64_t>>& strides, double scale, int format, uintptr_t workspace,
              int device) {
        return query(attention_fp8_args(q, k, v, out, dtype, sizes, strides, scale, format, workspace, 0, device));
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"), py::arg("dtype"), py::arg("sizes"), py::arg("strides"),
      py::arg("scale"), py::arg("format"), py::arg("workspace"), py::arg("device"), doc);
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "rocm_sd kernels (HIP sources; built for AMD with hipcc or for NVIDIA with nvcc)";

  // ---- runtime (rocm_sd/runtime.h) ----
  m.def("build_info", [] {
    const rsd::BuildInfo b = rsd::build_info();
    py::dict d;
    d["platform"] = b.platform;
    d["targets"] = b.targets;
    d["runtime_version"] = b.runtime_version;
    d["source_hash"] = b.source_hash;
    return d;
  });

  m.def(
      "device_info",
      [](int device) {
        rsd::DeviceInfo info;
        raise_if(rsd::device_info(device, &info));
        py::dict d;
        d["name"] = info.name;
        d["arch"] = info.arch;
        d["multiprocessors"] = info.multiprocessors;
        d["wave_size"] = info.wave_size;
        d["l2_bytes"] = info.l2_bytes;
        d["driver_version"] = info.driver_version;
        return d;
      },
      py::arg("device"));

  m.def("check_kernel_image", &rsd::check_kernel_image, py::arg("device"),
        "Empty string if this build has machine code for the device, else the runtime's reason.");

  // ---- group_norm (rocm_sd/group_norm/api.h) ----
  m.def(
      "group_norm_check",
      [](uintptr_t x, uintptr_t y, uintptr_t gamma, uintptr_t beta, int dtype, int param_dtype, int layout, int64_t n,
         int64_t c, int64_t hw, int groups, double eps, bool silu, int device) {
        return rsd::group_norm_check(
            group_norm_args(x, y, gamma, beta, dtype, param_dtype, layout, n, c, hw, groups, eps, silu, 0, 0, device));
      },
      py::arg("x"), py::arg("y"), py::arg("gamma"), py::arg("beta"), py::arg("dtype"), py::arg("param_dtype"),
      py::arg("layout"), py::arg("n"), py::arg("c"), py::arg("hw"), py::arg("groups"), py::arg("eps"), py::arg("silu"),
      py::arg("device"), "Empty string if the kernel takes these arguments, else why not.");

  // path: 0 automatic, 1 resident (single pass), 2 split (three launches); see rsd::GroupNormPath.
  m.def(
      "group_norm_workspace_bytes",
      [](uintptr_t x, uintptr_t y, int dtype, int layout, int64_t n, int64_t c, int64_t hw, int groups, int device,
         int path) {
        return rsd::group_norm_workspace_bytes(group_norm_args(x, y, 0, 0, dtype, dtype, layout, n, c, hw, groups,
                                                               1e-5, false, 0, 0, device, path));
      },
      py::arg("x"), py::arg("y"), py::arg("dtype"), py::arg("layout"), py::arg("n"), py::arg("c"), py::arg("hw"),
      py::arg("groups"), py::arg("device"), py::arg("path") = 0);

  m.def(
      "group_norm_describe",
      [](uintptr_t x, uintptr_t y, int dtype, int layout, int64_t n, int64_t c, int64_t hw, int groups, int device,
         int path) {
        return rsd::group_norm_describe(group_norm_args(x, y, 0, 0, dtype, dtype, layout, n, c, hw, groups, 1e-5,
                                                        false, 0, 0, device, path));
      },
      py::arg("x"), py::arg("y"), py::arg("dtype"), py::arg("layout"), py::arg("n"), py::arg("c"), py::arg("hw"),
      py::arg("groups"), py::arg("device"), py::arg("path") = 0,
      "The kernels these arguments get, e.g. 'resident vec=8 blocks_per_group=128'.");

  m.def(
      "group_norm_forward",
      [](uintptr_t x, uintptr_t y, uintptr_t gamma, uintptr_t beta, int dtype, int param_dtype, int layout, int64_t n,
         int64_t c, int64_t hw, int groups, double eps, bool silu, uintptr_t workspace, uintptr_t stream, int device,
         int path, uintptr_t input_bias) {
        rsd::GroupNormArgs a = group_norm_args(x, y, gamma, beta, dtype, param_dtype, layout, n, c, hw, groups, eps,
                                               silu, workspace, stream, device, path);
        a.input_bias = as_ptr_or_null(input_bias);
        raise_if(rsd::group_norm_forward(a));
      },
      py::arg("x"), py::arg("y"), py::arg("gamma"), py::arg("beta"), py::arg("dtype"), py::arg("param_dtype"),
      py::arg("layout"), py::arg("n"), py::arg("c"), py::arg("hw"), py::arg("groups"), py::arg("eps"), py::arg("silu"),
      py::arg("workspace"), py::arg("stream"), py::arg("device"), py::arg("path") = 0, py::arg("input_bias") = 0);

  // ---- gelu_tanh (rocm_sd/gelu_tanh/api.h) ----
  m.def(
      "gelu_tanh_check",
      [](uintptr_t x, uintptr_t bias, uintptr_t y, int dtype, int64_t rows, int64_t d, int device, uintptr_t q,
         uintptr_t scale, int format, double bound) {
        return rsd::gelu_tanh_check(gelu_tanh_args(x, bias, y, dtype, rows, d, 0, device, q, scale, format, bound));
      },
      py::arg("x"), py::arg("bias"), py::arg("y"), py::arg("dtype"), py::arg("rows"), py::arg("d"), py::arg("device"),
      py::arg("q") = 0, py::arg("scale") = 0, py::arg("format") = 0, py::arg("bound") = 0.0,
      "Empty string if the kernel takes these arguments, else why not.");

  m.def(
      "gelu_tanh_forward",
      [](uintptr_t x, uintptr_t bias, uintptr_t y, int dtype, int64_t rows, int64_t d, uintptr_t stream, int device,
         uintptr_t q, uintptr_t scale, int format, double bound) {
        raise_if(rsd::gelu_tanh_forward(gelu_tanh_args(x, bias, y, dtype, rows, d, stream, device, q, scale, format,
                                                       bound)));
      },
      py::arg("x"), py::arg("bias"), py::arg("y"), py::arg("dtype"), py::arg("rows"), py::arg("d"), py::arg("stream"),
      py::arg("device"), py::arg("q") = 0, py::arg("scale") = 0, py::arg("format") = 0, py::arg("bound") = 0.0,
      "y = gelu(x + bias, approximate='tanh') over (rows, d); with q and scale instead of y, y quantized per row into "
      "them.");

  // ---- geglu (rocm_sd/geglu/api.h) ----
  m.def(
      "geglu_check",
      [](uintptr_t x, uintptr_t y, int dtype, int64_t rows, int64_t d, int device, uintptr_t q, uintptr_t scale,
         int format, double bound) {
        return rsd::geglu_check(geglu_args(x, y, dtype, rows, d, 0, device, q, scale, format, bound));
      },
      py::arg("x"), py::arg("y"), py::arg("dtype"), py::arg("rows"), py::arg("d"), py::arg("device"), py::arg("q") = 0,
      py::arg("scale") = 0, py::arg("format") = 0, py::arg("bound") = 0.0, "Empty string if the kernel takes these arguments, else why not.");

  m.def(
      "geglu_forward",
      [](uintptr_t x, uintptr_t y, int dtype, int64_t rows, int64_t d, uintptr_t stream, int device, uintptr_t q,
         uintptr_t scale, int format, double bound) {
        raise_if(rsd::geglu_forward(geglu_args(x, y, dtype, rows, d, stream, device, q, scale, format, bound)));
      },
      py::arg("x"), py::arg("y"), py::arg("dtype"), py::arg("rows"), py::arg("d"), py::arg("stream"),
      py::arg("device"), py::arg("q") = 0, py::arg("scale") = 0, py::arg("format") = 0, py::arg("bound") = 0.0,
      "y = x[:, :d] * gelu(x[:, d:]) (and y quantized per row into q, scale when they are given; with a bound, one "
      "scale for every row).");

  // ---- quantize_rows (rocm_sd/quantize/api.h) ----
  m.def(
      "quantize_rows_check",
      [](uintptr_t x, uintptr_t q, uintptr_t scale, int dtype, int format, int64_t rows, int64_t k, int device,
         int64_t rows_per_batch, int64_t batch_stride) {
        return rsd::quantize_rows_check(quantize_rows_args(x, q, scale, dtype, format, rows, k, 0, device,
                                                           rows_per_batch, batch_stride));
      },
      py::arg("x"), py::arg("q"), py::arg("scale"), py::arg("dtype"), py::arg("format"), py::arg("rows"), py::arg("k"),
      py::arg("device"), py::arg("rows_per_batch") = 0, py::arg("batch_stride") = 0,
      "Empty string if the kernel takes these arguments, else why not.");

  m.def(
      "quantize_rows_forward",
      [](uintptr_t x, uintptr_t q, uintptr_t scale, int dtype, int format, int64_t rows, int64_t k, uintptr_t stream,
         int device, int64_t rows_per_batch, int64_t batch_stride) {
        raise_if(rsd::quantize_rows_forward(quantize_rows_args(x, q, scale, dtype, format, rows, k, stream, device,
                                                               rows_per_batch, batch_stride)));
      },
      py::arg("x"), py::arg("q"), py::arg("scale"), py::arg("dtype"), py::arg("format"), py::arg("rows"), py::arg("k"),
      py::arg("stream"), py::arg("device"), py::arg("rows_per_batch") = 0, py::arg("batch_stride") = 0,
      "q, scale = per-row 8-bit quantization of x (rows, k); with rows_per_batch, x's rows in batches of that many "
      "contiguous rows, batch_stride elements apart.");

  // ---- im2col_quantize (rocm_sd/im2col_quantize/api.h) ----
  m.def(
      "im2col_quantize_check",
      [](uintptr_t x, uintptr_t q, uintptr_t scale, int dtype, int format, int64_t n, int64_t h, int64_t w, int64_t c,
         int kh, int kw, int stride_h, int stride_w, int pad_h, int pad_w, double bound, int device) {
        return rsd::im2col_quantize_check(im2col_quantize_args(x, q, scale, dtype, format, n, h, w, c, kh, kw, stride_h,
                                                               stride_w, pad_h, pad_w, bound, 0, device));
      },
      py::arg("x"), py::arg("q"), py::arg("scale"), py::arg("dtype"), py::arg("format"), py::arg("n"), py::arg("h"),
      py::arg("w"), py::arg("c"), py::arg("kh"), py::arg("kw"), py::arg("stride_h"), py::arg("stride_w"),
      py::arg("pad_h"), py::arg("pad_w"), py::arg("bound"), py::arg("device"),
      "Empty string if the kernel takes these arguments, else why not.");

  m.def(
      "im2col_quantize_forward",
      [](uintptr_t x, uintptr_t q, uintptr_t scale, int dtype, int format, int64_t n, int64_t h, int64_t w, int64_t c,
         int kh, int kw, int stride_h, int stride_w, int pad_h, int pad_w, double bound, uintptr_t stream, int device) {
        raise_if(rsd::im2col_quantize_forward(im2col_quantize_args(x, q, scale, dtype, format, n, h, w, c, kh, kw,
                                                                   stride_h, stride_w, pad_h, pad_w, bound, stream,
                                                                   device)));
      },
      py::arg("x"), py::arg("q"), py::arg("scale"), py::arg("dtype"), py::arg("format"), py::arg("n"), py::arg("h"),
      py::arg("w"), py::arg("c"), py::arg("kh"), py::arg("kw"), py::arg("stride_h"), py::arg("stride_w"),
      py::arg("pad_h"), py::arg("pad_w"), py::arg("bound"), py::arg("stream"), py::arg("device"),
      "q, scale = the patches of x (n, h, w, c) quantized with one scale, bound / fmax.");

  // ---- bias_residual (rocm_sd/bias_residual/api.h) ----
  m.def(
      "bias_residual_check",
      [](uintptr_t x, uintptr_t residual, uintptr_t bias, uintptr_t y, int dtype, int layout, int64_t n, int64_t c,
         int64_t hw, double scale, int device) {
        return rsd::bias_residual_check(bias_residual_args(x, residual, bias, y, dtype, layout, n, c, hw, scale, 0,
                                                           device));
      },
      py::arg("x"), py::arg("residual"), py::arg("bias"), py::arg("y"), py::arg("dtype"), py::arg("layout"),
      py::arg("n"), py::arg("c"), py::arg("hw"), py::arg("scale"), py::arg("device"),
      "Empty string if the kernel takes these arguments, else why not.");

  m.def(
      "bias_residual_forward",
      [](uintptr_t x, uintptr_t residual, uintptr_t bias, uintptr_t y, int dtype, int layout, int64_t n, int64_t c,
         int64_t hw, double scale, uintptr_t stream, int device) {
        raise_if(rsd::bias_residual_forward(bias_residual_args(x, residual, bias, y, dtype, layout, n, c, hw, scale,
                                                               stream, device)));
      },
      py::arg("x"), py::arg("residual"), py::arg("bias"), py::arg("y"), py::arg("dtype"), py::arg("layout"),
      py::arg("n"), py::arg("c"), py::arg("hw"), py::arg("scale"), py::arg("stream"), py::arg("device"),
      "y = (x + residual + bias[c]) * scale.");

  // ---- parity_shuffle (rocm_sd/parity_shuffle/api.h) ----
  m.def(
      "parity_shuffle_check",
      [](uintptr_t parities, uintptr_t bias, uintptr_t out, int dtype, int64_t n, int64_t h, int64_t w, int64_t c,
         int device) {
        return rsd::parity_shuffle_check(parity_shuffle_args(parities, bias, out, dtype, n, h, w, c, 0, device));
      },
      py::arg("parities"), py::arg("bias"), py::arg("out"), py::arg("dtype"), py::arg("n"), py::arg("h"),
      py::arg("w"), py::arg("c"), py::arg("device"), "Empty string if the kernel takes these arguments, else why not.");

  m.def(
      "parity_shuffle_forward",
      [](uintptr_t parities, uintptr_t bias, uintptr_t out, int dtype, int64_t n, int64_t h, int64_t w, int64_t c,
         uintptr_t stream, int device) {
        raise_if(rsd::parity_shuffle_forward(parity_shuffle_args(parities, bias, out, dtype, n, h, w, c, stream,
                                                                 device)));
      },
      py::arg("parities"), py::arg("bias"), py::arg("out"), py::arg("dtype"), py::arg("n"), py::arg("h"),
      py::arg("w"), py::arg("c"), py::arg("stream"), py::arg("device"),
      "The folded upsampling's pixel shuffle with bias (NHWC).");

  // ---- layer_norm (rocm_sd/layer_norm/api.h) ----
  m.def(
      "layer_norm_check",
      [](uintptr_t x, uintptr_t y, uintptr_t gamma, uintptr_t beta, int dtype, int param_dtype, int64_t rows, int64_t c,
         double eps, int device, uintptr_t residual, uintptr_t sum, uintptr_t q, uintptr_t scale, int format,
         double bound) {
        return rsd::layer_norm_check(layer_norm_args(x, y, gamma, beta, dtype, param_dtype, rows, c, eps, 0, device,
                                                     residual, sum, q, scale, format, bound));
      },
      py::arg("x"), py::arg("y"), py::arg("gamma"), py::arg("beta"), py::arg("dtype"), py::arg("param_dtype"),
      py::arg("rows"), py::arg("c"), py::arg("eps"), py::arg("device"), py::arg("residual") = 0, py::arg("sum") = 0,
      py::arg("q") = 0, py::arg("scale") = 0, py::arg("format") = 0, py::arg("bound") = 0.0,
      "Empty string if the kernel takes these arguments, else why not.");

  m.def(
      "layer_norm_forward",
      [](uintptr_t x, uintptr_t y, uintptr_t gamma, uintptr_t beta, int dtype, int param_dtype, int64_t rows, int64_t c,
         double eps, uintptr_t stream, int device, uintptr_t residual, uintptr_t sum, uintptr_t q, uintptr_t scale,
         int format, double bound) {
        raise_if(rsd::layer_norm_forward(layer_norm_args(x, y, gamma, beta, dtype, param_dtype, rows, c, eps, stream,
                                                         device, residual, sum, q, scale, format, bound)));
      },
      py::arg("x"), py::arg("y"), py::arg("gamma"), py::arg("beta"), py::arg("dtype"), py::arg("param_dtype"),
      py::arg("rows"), py::arg("c"), py::arg("eps"), py::arg("stream"), py::arg("device"), py::arg("residual") = 0,
      py::arg("sum") = 0, py::arg("q") = 0, py::arg("scale") = 0, py::arg("format") = 0, py::arg("bound") = 0.0,
      "LayerNorm over the last dimension (of x + residual, written to sum, when residual is given; y quantized per "
      "row into q, scale when they are given; with a bound, one scale for every row).");

  // ---- ada_layer_norm and add_ada_layer_norm (rocm_sd/ada_layer_norm/api.h) ----
  m.def(
      "ada_layer_norm_check",
      [](uintptr_t x, uintptr_t out, uintptr_t scale, uintptr_t shift, int dtype, int64_t batch, int64_t tokens,
         int64_t c, const Strides2& scale_stride, const Strides2& shift_stride, double eps, int device, uintptr_t y,
         uintptr_t gate, const Strides2& gate_stride, uintptr_t h, uintptr_t q, uintptr_t q_scale, int format,
         double bound) {
        return rsd::ada_layer_norm_check(ada_layer_norm_args(x, out, scale, shift, dtype, batch, tokens, c,
                                                             scale_stride, shift_stride, eps, 0, device, y, gate,
                                                             gate_stride, h, q, q_scale, format, bound));
      },
      py::arg("x"), py::arg("out"), py::arg("scale"), py::arg("shift"), py::arg("dtype"), py::arg("batch"),
      py::arg("tokens"), py::arg("c"), py::arg("scale_stride"), py::arg("shift_stride"), py::arg("eps"),
      py::arg("device"), py::arg("y") = 0, py::arg("gate") = 0, py::arg("gate_stride") = Strides2{0, 0},
      py::arg("h") = 0, py::arg("q") = 0, py::arg("q_scale") = 0, py::arg("format") = 0, py::arg("bound") = 0.0,
      "Empty string if the kernel takes these arguments, else why not.");

  m.def(
      "ada_layer_norm_forward",
      [](uintptr_t x, uintptr_t out, uintptr_t scale, uintptr_t shift, int dtype, int64_t batch, int64_t tokens,
         int64_t c, const Strides2& scale_stride, const Strides2& shift_stride, double eps, uintptr_t stream,
         int device, uintptr_t y, uintptr_t gate, const Strides2& gate_stride, uintptr_t h, uintptr_t q,
         uintptr_t q_scale, int format, double bound) {
        raise_if(rsd::ada_layer_norm_forward(ada_layer_norm_args(x, out, scale, shift, dtype, batch, tokens, c,
                                                                 scale_stride, shift_stride, eps, stream, device, y,
                                                                 gate, gate_stride, h, q, q_scale, format, bound)));
      },
      py::arg("x"), py::arg("out"), py::arg("scale"), py::arg("shift"), py::arg("dtype"), py::arg("batch"),
      py::arg("tokens"), py::arg("c"), py::arg("scale_stride"), py::arg("shift_stride"), py::arg("eps"),
      py::arg("stream"), py::arg("device"), py::arg("y") = 0, py::arg("gate") = 0,
      py::arg("gate_stride") = Strides2{0, 0}, py::arg("h") = 0, py::arg("q") = 0, py::arg("q_scale") = 0,
      py::arg("format") = 0, py::arg("bound") = 0.0,
      "out = LayerNorm(x) * (1 + scale[b]) + shift[b] over (batch, tokens, c); with y and gate, of h = x + gate[b] * y, "
      "which is written too; with q and q_scale instead of out, out quantized per row into them.");
  // ---- rms_norm (rocm_sd/rms_norm/api.h) ----
  m.def(
      "rms_norm_check",
      [](uintptr_t x, uintptr_t weight, uintptr_t lead, uintptr_t lead_weight, uintptr_t cos, uintptr_t sin, uintptr_t y,
         int dtype, int param_dtype, const std::vector<int64_t>& sizes, const std::vector<int64_t>& x_stride,
         const std::vector<int64_t>& lead_stride, double eps, int device) {
        return rsd::rms_norm_check(rms_norm_args(x, weight, lead, lead_weight, cos, sin, y, dtype, param_dtype, sizes,
                                                 x_stride, lead_stride, eps, 0, device));
      },
      py::arg("x"), py::arg("weight"), py::arg("lead"), py::arg("lead_weight"), py::arg("cos"), py::arg("sin"),
      py::arg("y"), py::arg("dtype"), py::arg("param_dtype"), py::arg("sizes"), py::arg("x_stride"),
      py::arg("lead_stride"), py::arg("eps"), py::arg("device"),
      "Empty string if the kernel takes these arguments, else why not.");

  m.def(
      "rms_norm_forward",
      [](uintptr_t x, uintptr_t weight, uintptr_t lead, uintptr_t lead_weight, uintptr_t cos, uintptr_t sin, uintptr_t y,
         int dtype, int param_dtype, const std::vector<int64_t>& sizes, const std::vector<int64_t>& x_stride,
         const std::vector<int64_t>& lead_stride, double eps, uintptr_t stream, int device) {
        raise_if(rsd::rms_norm_forward(rms_norm_args(x, weight, lead, lead_weight, cos, sin, y, dtype, param_dtype,
                                                     sizes, x_stride, lead_stride, eps, stream, device)));
      },
      py::arg("x"), py::arg("weight"), py::arg("lead"), py::arg("lead_weight"), py::arg("cos"), py::arg("sin"),
      py::arg("y"), py::arg("dtype"), py::arg("param_dtype"), py::arg("sizes"), py::arg("x_stride"),
      py::arg("lead_stride"), py::arg("eps"), py::arg("stream"), py::arg("device"),
      "RMSNorm of (batch, len, heads, d) rows, lead's rows first, then the rotary embedding when cos, sin are given.");

  // ---- attention (rocm_sd/attention/api.h) ----
  m.def("attention_instances", &rsd::attention_instances,
        "Names of the compiled attention instances: dtype, padded head dim, waves, 16-query tiles a wave, keys a tile.");
  m.def("attention_refused_instances", &rsd::attention_refused_instances, py::arg("arch"),
        "The instances the kernel refuses on a GPU of this architecture (they spill registers there).");

  def_attention_query(m, "attention_check", &rsd::attention_check,
                      "Empty string if the kernel (or the named instance) takes these arguments, else why not.");
  def_attention_query(m, "attention_describe", &rsd::attention_describe,
                      "The instance and grid these arguments get, or 'error: <why>'.");

  m.def(
      "attention_forward",
      [](uintptr_t q, uintptr_t k, uintptr_t v, uintptr_t out, int dtype, const std::vector<int64_t>& sizes,
         const std::vector<std::vector<int64_t>>& strides, double scale, uintptr_t stream, int device,
         const std::string& instance) {
        raise_if(rsd::attention_forward(
            attention_args(q, k, v, out, dtype, sizes, strides, scale, stream, device, instance)));
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"), py::arg("dtype"), py::arg("sizes"), py::arg("strides"),
      py::arg("scale"), py::arg("stream"), py::arg("device"), py::arg("instance") = "",
      "out = softmax(q k^T * scale) v over [batch, seq, heads, head_dim] views.");

  // ---- attention_fp8 (rocm_sd/attention_fp8/api.h) ----
  def_attention_fp8_query(m, "attention_fp8_check", &rsd::attention_fp8_check,
                          "Empty string if the FP8 kernels take these arguments, else why not.");
  def_attention_fp8_query(m, "attention_fp8_describe", &rsd::attention_fp8_describe,
                          "The instance, format and grid these arguments get, or 'error: <why>'.");
  def_attention_fp8_query(m, "attention_fp8_workspace_bytes", &rsd::attention_fp8_workspace_bytes,
                          "Bytes of workspace attention_fp8_forward needs (Q, K, V quantized, and their scales).");
  m.def(
      "attention_fp8_forward",
      [](uintptr_t q, uintptr_t k, uintptr_t v, uintptr_t out, int dtype, const std::vector<int64_t>& sizes,
         const std::vector<std::vector<int64_t>>& strides, double scale, int format, uintptr_t workspace,
         uintptr_t stream, int device) {
        raise_if(rsd::attention_fp8_forward(
            attention_fp8_args(q, k, v, out, dtype, sizes, strides, scale, format, workspace, stream, device)));
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"), py::arg("dtype"), py::arg("sizes"), py::arg("strides"),
      py::arg("scale"), py::arg("format"), py::arg("workspace"), py::arg("stream"), py::arg("device"),
      "out = softmax(q k^T * scale) v with Q, K, V and the probabilities in FP8 (fp32 softmax and accumulation).");

  // ---- Composable Kernel instances (rocm_sd/ck/api.h) ----
  m.def(
      "ck_group_norm_instances",
      [](const std::string& arch) {
        py::list out;
        for (const auto& inst : rsd::ck_group_norm_instances(arch)) out.append(py::make_tuple(inst.name, inst.silu));
        return out;
      },
      py::arg("arch") = "",
      "(name, silu) of the Composable Kernel GroupNorm instances with code for `arch` (all in the build for \"\").");

  m.def(
      "ck_group_norm_forward",
      [](const std::string& name, uintptr_t x, uintptr_t gamma, uintptr_t beta, uintptr_t y, int n, int h, int w, int c,
         int groups, float eps, uintptr_t stream, int device) {
        raise_if(rsd::ck_group_norm_forward(name, {as_ptr(x), as_ptr(gamma), as_ptr(beta), as_mut_ptr(y), n, h, w, c,
                                                   groups, eps, as_mut_ptr(stream), device}));
      },
      py::arg("name"), py::arg("x"), py::arg("gamma"), py::arg("beta"), py::arg("y"), py::arg("n"), py::arg("h"),
      py::arg("w"), py::arg("c"), py::arg("groups"), py::arg("eps"), py::arg("stream"), py::arg("device"),
      "GroupNorm(+SiLU) by one CK instance (channels_last fp16); raises why it cannot run.");

  m.def("ck_attention_instances", &rsd::ck_attention_instances, py::arg("arch") = "",
        "Names of the Composable Kernel attention instances with code for `arch` (a GPU arch, e.g. gfx942; all "
        "in the build for \"\"). ROCm builds with CK headers only; else none.");

  m.def(
      "ck_attention_forward",
      [](const std::string& name, uintptr_t q, uintptr_t k, uintptr_t v, uintptr_t out, int dtype,
         const std::vector<int64_t>& sizes, const std::vector<std::vector<int64_t>>& strides, double scale,
         uintptr_t stream, int device) {
        raise_if(rsd::ck_attention_forward(
            name, attention_args(q, k, v, out, dtype, sizes, strides, scale, stream, device, std::string())));
      },
      py::arg("name"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"), py::arg("dtype"), py::arg("sizes"),
      py::arg("strides"), py::arg("scale"), py::arg("stream"), py::arg("device"),
      "One Composable Kernel attention instance by name, on attention_forward()'s arguments; raises why it cannot "
      "run.");

  m.def("ck_linear_geglu_instances", &rsd::ck_linear_geglu_instances, py::arg("arch") = "",
        "Names of the Composable Kernel GEGLU-projection instances with code for `arch` (a GPU arch, e.g. "
        "gfx942; all in the build for \"\"). ROCm builds with CK headers only; else none.");

  m.def(
      "ck_linear_geglu_forward",
      [](const std::string& name, uintptr_t x, uintptr_t weight, uintptr_t bias, uintptr_t gate, uintptr_t out,
         int64_t m, int64_t n, int64_t k, int64_t x_stride, uintptr_t stream, int device) {
        raise_if(rsd::ck_linear_geglu_forward(name, {as_ptr(x), as_ptr(weight), as_ptr(bias), as_mut_ptr(gate),
                                                     as_mut_ptr(out), m, n, k, x_stride, as_mut_ptr(stream), device}));
      },
      py::arg("name"), py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("gate"), py::arg("out"), py::arg("m"),
      py::arg("n"), py::arg("k"), py::arg("x_stride"), py::arg("stream"), py::arg("device"),
      "out = (x W[:n]^T + b[:n]) * gelu(x W[n:]^T + b[n:]) by one CK instance; raises why it cannot run.");

  m.def("ck_conv_bias_residual_instances", &rsd::ck_conv_bias_residual_instances, py::arg("arch") = "",
        "Names of the Composable Kernel convolution + bias + residual instances with code for `arch` (a GPU "
        "arch, e.g. gfx942; all in the build for \"\"). ROCm builds with CK headers only; else none.");

  m.def(
      "ck_conv_bias_residual_forward",
      [](const std::string& name, uintptr_t x, uintptr_t weight, uintptr_t bias, uintptr_t residual, uintptr_t out,
         const std::vector<int64_t>& sizes, double scale, uintptr_t stream, int device) {
        if (sizes.size() != 9) throw std::invalid_argument("sizes are n, c, h, w, k, r, s, pad_h, pad_w");
        raise_if(rsd::ck_conv_bias_residual_forward(
            name, {as_ptr(x), as_ptr(weight), as_ptr(bias), as_ptr(residual), as_mut_ptr(out), sizes[0], sizes[1],
                   sizes[2], sizes[3], sizes[4], sizes[5], sizes[6], sizes[7], sizes[8], static_cast<float>(scale),
                   as_mut_ptr(stream), device}));
      },
      py::arg("name"), py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("residual"), py::arg("out"),
      py::arg("sizes"), py::arg("scale"), py::arg("stream"), py::arg("device"),
      "out = (residual + conv(x, w) + bias) * scale by one CK instance (channels_last fp16, stride 1); raises why "
      "it cannot run.");
}
