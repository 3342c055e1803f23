// C entry point of the emulated parity_shuffle (see rsd_emu/entry_point.h).
#include "rocm_sd/parity_shuffle/api.h"
#include "rsd_emu/entry_point.h"

extern "C" {

// parities: (n, h + 1, w + 1, 4 c) dense, bias: (c,) or null, out: (n, 2 h, 2 w, c) dense.
const char* rsd_emu_parity_shuffle(const void* parities, const void* bias, void* out, int dtype, int64_t n, int64_t h,
                                   int64_t w, int64_t c) {
  // Positional, in api.h's field order: parities, bias, out, dtype, n, h, w, c, stream, device.
  const rsd::ParityShuffleArgs a{parities, bias, out, rsd::DType(dtype), n, h, w, c, nullptr, 0};
  return rsd_emu::answer(rsd::parity_shuffle_forward(a));
}

}  // extern "C"
