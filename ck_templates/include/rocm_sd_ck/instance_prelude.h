// What every generated CK instance source starts with: the HIP shim before any HIP header, CK's core and
// element-wise headers, and the short names CK's instance tables are written in.
#pragma once
#include "rocm_sd_ck/old_hip_compat.h"

#include "ck/ck.hpp"
#include "ck/tensor_operation/gpu/element/element_wise_operation.hpp"

namespace rsd::ck {

template <::ck::index_t... Is>
using S = ::ck::Sequence<Is...>;
using F16 = ::ck::half_t;
using PassThrough = ::ck::tensor_operation::element_wise::PassThrough;

}  // namespace rsd::ck
