// C entry point of the emulated ada_layer_norm (hip/ada_layer_norm/ada_layer_norm.hip; see rsd_emu/entry_point.h).
#include "rocm_sd/ada_layer_norm/api.h"
#include "rsd_emu/entry_point.h"

extern "C" {

// x, out (and y, h): (batch * tokens, c) contiguous; scale, shift (and gate): (batch, c) at strides (batch,
// channel) in elements. y, gate and h null: ada_layer_norm; all three given: add_ada_layer_norm.
const char* rsd_emu_ada_layer_norm(const void* x, const void* y, const void* gate, const void* scale,
                                   const void* shift, void* h, void* out, int dtype, int64_t batch, int64_t tokens,
                                   int64_t c, const int64_t* gate_stride, const int64_t* scale_stride,
                                   const int64_t* shift_stride, float eps) {
  // Positional, in api.h's field order: x, out, scale, shift, dtype, batch, tokens, c, scale_stride, shift_stride,
  // eps, stream, device.
  rsd::AdaLayerNormArgs a{x,   out,     scale, shift, rsd::DType(dtype), batch, tokens, c,
                          {scale_stride[0], scale_stride[1]}, {shift_stride[0], shift_stride[1]}, eps, nullptr, 0};
  a.y = y;
  a.gate = gate;
  a.gate_stride[0] = gate_stride[0];
  a.gate_stride[1] = gate_stride[1];
  a.h = h;
  return rsd_emu::answer(rsd::ada_layer_norm_forward(a));
}

// The same without out: out quantized per row into q (batch * tokens, c) bytes and q_scale (batch * tokens,) float32,
// with the bound (0: a scale per row).
const char* rsd_emu_ada_layer_norm_quantized(const void* x, const void* y, const void* gate, const void* scale,
                                             const void* shift, void* h, int dtype, int64_t batch, int64_t tokens,
                                             int64_t c, const int64_t* gate_stride, const int64_t* scale_stride,
                                             const int64_t* shift_stride, float eps, void* q, void* q_scale,
                                             int format, float bound) {
  rsd::AdaLayerNormArgs a{x,   nullptr, scale, shift, rsd::DType(dtype), batch, tokens, c,
                          {scale_stride[0], scale_stride[1]}, {shift_stride[0], shift_stride[1]}, eps, nullptr, 0};
  a.y = y;
  a.gate = gate;
  a.gate_stride[0] = gate_stride[0];
  a.gate_stride[1] = gate_stride[1];
  a.h = h;
  a.q = q;
  a.q_scale = static_cast<float*>(q_scale);
  a.format = rsd::QuantFormat(format);
  a.bound = bound;
  return rsd_emu::answer(rsd::ada_layer_norm_forward(a));
}

}  // extern "C"
