// What the host interfaces of rocm_sd._C's ops share: element types, layouts, and the convention of their entry
// points. Each op declares its own in rocm_sd/<op>/api.h (the runtime's in rocm_sd/runtime.h, the Composable Kernel
// instances' in rocm_sd/ck/api.h): plain pointers, sizes and a stream handle. No GPU runtime and no torch headers,
// so bindings.cpp compiles with the host compiler alone and one build of _C serves every torch version (DESIGN.md,
// "Why _C has no torch headers").
//
// The entry points of op <op>, taking its argument struct, and bound under the same names by bindings.cpp:
//   std::string <op>_check(args)        empty if the kernels take these arguments, else the first reason they do not
//   std::string <op>_forward(args)      enqueues the kernels on args.stream; empty on success, else the error
// and where the op has them <op>_describe(args) (the launch these arguments get) and <op>_workspace_bytes(args).
#pragma once

namespace rsd {

enum class DType : int { f32 = 0, f16 = 1, bf16 = 2 };
enum class Layout : int { nchw = 0, nhwc = 1 };

}  // namespace rsd
