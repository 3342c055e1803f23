// C entry points of the emulated layout_copy (see rsd_emu/entry_point.h).
#include "rocm_sd/api.h"
#include "rsd_emu/entry_point.h"

namespace {
rsd::LayoutCopyArgs args_of(const void* in, void* out, int dtype, int64_t n, int64_t c, int64_t hw,
                            int to_channels_last) {
  // Positional, in api.h's field order: in, out, dtype, n, c, hw, to_channels_last, stream, device.
  return rsd::LayoutCopyArgs{in, out, rsd::DType(dtype), n, c, hw, to_channels_last != 0, nullptr, 0};
}
}  // namespace

extern "C" {

// in: dense (n, c, hw) in one layout, out: dense in the other (to_channels_last: NCHW -> NHWC).
const char* rsd_emu_layout_copy(const void* in, void* out, int dtype, int64_t n, int64_t c, int64_t hw,
                                int to_channels_last) {
  return rsd_emu::answer(rsd::layout_copy_forward(args_of(in, out, dtype, n, c, hw, to_channels_last)));
}

// The kernel and grid the same arguments get ("vec=8 tile=64x64 blocks=4"), as rocm_sd.ops.layout_copy.describe.
const char* rsd_emu_layout_copy_describe(const void* in, void* out, int dtype, int64_t n, int64_t c, int64_t hw,
                                         int to_channels_last) {
  return rsd_emu::answer(rsd::layout_copy_describe(args_of(in, out, dtype, n, c, hw, to_channels_last)));
}

}  // extern "C"
