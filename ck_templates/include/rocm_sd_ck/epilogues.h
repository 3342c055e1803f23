// The element-wise epilogues rocm_sd's CK GEMM and convolution instances apply to each output before it
// is stored (CK's CDE element operations: e = op(c, d0, d1, ...), c the fp32 accumulator). CK ships similar
// ones, but its AddFastGelu is the tanh approximation (diffusers' GEGLU uses the exact, erf GELU) and its
// fp16 AddMultiply rounds the accumulator to fp16 before the bias add; these compute in fp32 and round once.
#pragma once
#include "ck/ck.hpp"
#include "ck/utility/data_type.hpp"
#include "ck/utility/type_convert.hpp"

namespace rsd::ck {

// e = gelu(c + bias), exact GELU: the GEGLU gate.
struct AddGelu {
  template <typename E, typename C, typename D>
  __host__ __device__ void operator()(E& e, const C& c, const D& bias) const {
    const float x = ::ck::type_convert<float>(c) + ::ck::type_convert<float>(bias);
    e = ::ck::type_convert<E>(0.5f * x * (1.f + erff(0.70710678118654752f * x)));
  }
};

// e = (c + bias) * gate: the GEGLU output from the hidden half's accumulator and the gate.
struct AddMultiply {
  template <typename E, typename C, typename D0, typename D1>
  __host__ __device__ void operator()(E& e, const C& c, const D0& bias, const D1& gate) const {
    e = ::ck::type_convert<E>((::ck::type_convert<float>(c) + ::ck::type_convert<float>(bias)) *
                              ::ck::type_convert<float>(gate));
  }
};

// e = (residual + (c + bias)) * scale: ResnetBlock2D's tail, in rocm_sd::bias_residual's order.
struct BiasResidualScale {
  float scale;
  template <typename E, typename C, typename D0, typename D1>
  __host__ __device__ void operator()(E& e, const C& c, const D0& bias, const D1& residual) const {
    const float conv = ::ck::type_convert<float>(c) + ::ck::type_convert<float>(bias);
    e = ::ck::type_convert<E>((::ck::type_convert<float>(residual) + conv) * scale);
  }
};

}  // namespace rsd::ck
