// RMSNorm of attention heads, optionally joined with the text stream's rows and followed by the rotary embedding:
//
//   y[b, l, h, :] = rms(lead[b, l, h, :], lead_weight)          l <  lead_len   (joint attention: text rows first)
//                 = rms(x[b, l - lead_len, h, :], weight)        l >= lead_len
//   rms(t, w) = t * rsqrt(mean(t^2) + eps) * w
//   with cos, sin (lead_len + len, d):  y[2i]   = y[2i] cos[l, 2i]     - y[2i+1] sin[l, 2i]
//                                       y[2i+1] = y[2i+1] cos[l, 2i+1] + y[2i] sin[l, 2i+1]
//
// SD3's and Flux's attention normalises Q and K per head (norm_q / norm_k, and norm_added_q / norm_added_k of the
// text stream), concatenates [text, image] along the sequence and, in Flux, rotates them: up to five passes and two
// concatenation copies of Q and K per block in PyTorch, one read and one write here. T5's RMSNorm is the same op on
// (batch, len, 1, 4096).
//
// Heads are short rows (64 or 128 elements: 128-256 bytes), so a row takes a group of lanes, as many as it has vectors
// up to a wave, and a block many rows; the sum of squares is reduced within the group by shuffles. The rotary pairs
// (2i, 2i+1) lie in one vector (VEC is even), so the rotation needs no exchange between lanes. Rows of up to
// kMaxVecsPerLane vectors a lane stay in registers; longer ones (T5's 4096 on wave32) are read twice, the second time
// from the cache. x and lead are read through their strides (views of a projection's output, or of one third of a
// fused QKV projection); y is written contiguously at the joint row index, the layout the attention reads.
// Math in fp32, one rounding at the end.
#include "rocm_sd/common.h"
#include "rocm_sd/compat.h"
#if !RSD_RTC  // host side; runtime compilation (rocm_sd/jit/) takes the kernels only (rocm_sd/rtc.h)
#include <algorithm>
#include <cstdint>
#include <string>

#include "rocm_sd/launch.h"
#include "rocm_sd/rms_norm/api.h"
#endif

namespace rsd {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxVecsPerLane = 8;
constexpr int64_t kMaxD = 65536;  // a wave loops over a row; rows this long are no head and no T5 hidden state

// VEC values of P as floats, in accesses of at most 16 bytes (the host aligns p for them: pick_vec).
template <class P, int VEC>
__device__ __forceinline__ void load_floats(const P* p, float (&out)[VEC]) {
  constexpr int kChunk = VEC * int(sizeof(P)) > 16 ? 16 / int(sizeof(P)) : VEC;
#pragma unroll
  for (int c = 0; c < VEC; c += kChunk) {
    const Vec<P, kChunk> v = load_vec<P, kChunk>(p + c);
#pragma unroll
    for (int e = 0; e < kChunk; ++e) out[c + e] = to_float(v.v[e]);
  }
}

// Sum over the group of `lanes` lanes (a power of two, at most a wave, aligned within it); every lane of the wave
// must call it.
__device__ __forceinline__ float group_sum(float v, int lanes) {
  for (int offset = lanes >> 1; offset > 0; offset >>= 1) v += shfl_xor(v, offset);
  return v;
}

// Normalises, scales and rotates one vector (channels ch..ch+VEC) and stores it.
template <class T, class P, int VEC, bool kRope>
__device__ __forceinline__ void write_vec(const Vec<T, VEC>& v, float inv, const P* w, const float* cs,
                                          const float* sn, T* out, int ch) {
  float f[VEC];
#pragma unroll
  for (int e = 0; e < VEC; ++e) f[e] = to_float(v.v[e]) * inv;
  if (w != nullptr) {
    float g[VEC];
    load_floats<P, VEC>(w + ch, g);
#pragma unroll
    for (int e = 0; e < VEC; ++e) f[e] *= g[e];
  }
  if constexpr (kRope) {
    float c[VEC], s[VEC];
    load_floats<float, VEC>(cs + ch, c);
    load_floats<float, VEC>(sn + ch, s);
#pragma unroll
    for (int e = 0; e < VEC; e += 2) {
      const float re = f[e], im = f[e + 1];
      f[e] = re * c[e] - im * s[e];
      f[e + 1] = im * c[e + 1] + re * s[e + 1];
    }
  }
  Vec<T, VEC> o;
#pragma unroll
  for (int e = 0; e < VEC; ++e) o.v[e] = from_float<T>(f[e]);
  store_vec(out + ch, o, false);
}

// One row per group of 2^lanes_log2 lanes. VECS: vectors a lane holds in registers; 0: the row is read twice.
template <class T, class P, int VEC, int VECS, bool kRope>
__global__ void __launch_bounds__(kThreads)
    rms_norm_rows(const T* __restrict__ x, const P* __restrict__ weight, const T* __restrict__ lead,
                  const P* __restrict__ lead_weight, const float* __restrict__ cosines,
                  const float* __restrict__ sines, T* __restrict__ y, int64_t rows, int d, int lanes_log2, FastDiv heads, FastDiv joint_len,
                  int lead_len, int64_t xs0, int64_t xs1, int64_t xs2, int64_t ls0, int64_t ls1, int64_t ls2,
                  float eps) {
  const int lanes = 1 << lanes_log2;
  const int sub = int(threadIdx.x) & (lanes - 1);
  const int64_t row = int64_t(blockIdx.x) * (kThreads >> lanes_log2) + (int(threadIdx.x) >> lanes_log2);
  const bool active = row < rows;  // no early return: the group's shuffles need every lane of the wave
  const uint32_t r = active ? uint32_t(row) : 0u;  // rows < 2^31 (rms_norm_check)
  const uint32_t t = heads.div(r);
  const uint32_t h = r - t * heads.divisor;
  const uint32_t b = joint_len.div(t);
  const int l = int(t - b * joint_len.divisor);
  const bool in_lead = l < lead_len;
  const T* src = in_lead ? lead + (int64_t(b) * ls0 + int64_t(l) * ls1 + int64_t(h) * ls2)
                         : x + (int64_t(b) * xs0 + int64_t(l - lead_len) * xs1 + int64_t(h) * xs2);
  const P* w = in_lead ? lead_weight : weight;
  const float* cs = kRope ? cosines + int64_t(l) * d : nullptr;
  const float* sn = kRope ? sines + int64_t(l) * d : nullptr;
  T* out = y + int64_t(r) * d;
  const int vectors = d / VEC;
  float ss = 0.f;
  if constexpr (VECS > 0) {
    Vec<T, VEC> v[VECS];
#pragma unroll
    for (int k = 0; k < VECS; ++k) {
      const int j = sub + k * lanes;
      if (active && j < vectors) {
        v[k] = load_vec<T, VEC>(src + j * VEC);
#pragma unroll
        for (int e = 0; e < VEC; ++e) ss = fmaf(to_float(v[k].v[e]), to_float(v[k].v[e]), ss);
      }
    }
    const float inv = rsqrtf(group_sum(ss, lanes) / float(d) + eps);
#pragma unroll
    for (int k = 0; k < VECS; ++k) {
      const int j = sub + k * lanes;
      if (active && j < vectors) write_vec<T, P, VEC, kRope>(v[k], inv, w, cs, sn, out, j * VEC);
    }
  } else {
    for (int j = sub; active && j < vectors; j += lanes) {
      const Vec<T, VEC> v = load_vec<T, VEC>(src + j * VEC);
#pragma unroll
      for (int e = 0; e < VEC; ++e) ss = fmaf(to_float(v.v[e]), to_float(v.v[e]), ss);
    }
    const float inv = rsqrtf(group_sum(ss, lanes) / float(d) + eps);
    for (int j = sub; active && j < vectors; j += lanes)
      write_vec<T, P, VEC, kRope>(load_vec<T, VEC>(src + j * VEC), inv, w, cs, sn, out, j * VEC);
  }
}

#if !RSD_RTC
// Widest vector (at most 16 bytes of x) every row start allows: d, the strides and the pointers of x, lead and y in
// vectors of T, the weights' in accesses of P and cos / sin's of float (load_floats).
int pick_vec(const RmsNormArgs& a) {
  const int eb = elem_bytes(a.dtype), pb = elem_bytes(a.param_dtype);
  for (int vec = 16 / eb; vec > 1; vec /= 2) {
    bool ok = a.d % vec == 0 && aligned(a.x, vec * eb) && aligned(a.lead, vec * eb) && aligned(a.y, vec * eb) &&
              aligned(a.weight, std::min(vec * pb, 16)) && aligned(a.lead_weight, std::min(vec * pb, 16)) &&
              aligned(a.cos, std::min(vec * 4, 16)) && aligned(a.sin, std::min(vec * 4, 16));
    for (int i = 0; i < 3; ++i) ok = ok && a.x_stride[i] % vec == 0 && a.lead_stride[i] % vec == 0;
    if (ok) return vec;
  }
  return 1;
}

struct Shape {
  int vec, vecs, lanes_log2;  // vecs 0: the row is read twice
};

Shape plan(const RmsNormArgs& a) {
  const int wave = device_attribute(a.device, Attr::wave_size, 32);  // 32 is safe on wave64: smaller groups
  Shape s{pick_vec(a), 1, 0};
  const int64_t vectors = a.d / s.vec;
  while ((int64_t(1) << s.lanes_log2) < vectors && (2 << s.lanes_log2) <= wave) ++s.lanes_log2;
  const int64_t need = ceil_div(vectors, int64_t(1) << s.lanes_log2);
  while (s.vecs < need) s.vecs *= 2;
  if (s.vecs > kMaxVecsPerLane) s.vecs = 0;
  return s;
}

int64_t joint_rows(const RmsNormArgs& a) { return a.batch * (a.lead_len + a.len) * a.heads; }

template <class T, class P, int VEC, int VECS, bool kRope>
void launch_kernel(const RmsNormArgs& a, const Shape& s, hipStream_t stream) {
  const int64_t rows = joint_rows(a);
  const unsigned blocks = unsigned(ceil_div(rows, kThreads >> s.lanes_log2));
  rms_norm_rows<T, P, VEC, VECS, kRope><<<blocks, kThreads, 0, stream>>>(
      static_cast<const T*>(a.x), static_cast<const P*>(a.weight), static_cast<const T*>(a.lead),
      static_cast<const P*>(a.lead_weight), a.cos, a.sin, static_cast<T*>(a.y), rows, int(a.d), s.lanes_log2,
      FastDiv(uint32_t(a.heads)), FastDiv(uint32_t(a.lead_len + a.len)), int(a.lead_len), a.x_stride[0],
      a.x_stride[1], a.x_stride[2], a.lead_stride[0], a.lead_stride[1], a.lead_stride[2], a.eps);
}

template <class T, class P, int VEC, bool kRope>
void launch_vecs(const RmsNormArgs& a, const Shape& s, hipStream_t stream) {
  switch (s.vecs) {
    case 1: launch_kernel<T, P, VEC, 1, kRope>(a, s, stream); break;
    case 2: launch_kernel<T, P, VEC, 2, kRope>(a, s, stream); break;
    case 4: launch_kernel<T, P, VEC, 4, kRope>(a, s, stream); break;
    case 8: launch_kernel<T, P, VEC, 8, kRope>(a, s, stream); break;
    default: launch_kernel<T, P, VEC, 0, kRope>(a, s, stream); break;
  }
}

template <class T, class P, int VEC>
void launch_rope(const RmsNormArgs& a, const Shape& s, hipStream_t stream) {
  if (a.cos == nullptr)
    launch_vecs<T, P, VEC, false>(a, s, stream);
  else if constexpr (VEC >= 2)  // the rotary pairs lie in one vector; rms_norm_check refuses rope with VEC 1
    launch_vecs<T, P, VEC, true>(a, s, stream);
}

template <class T, class P>
void launch(const RmsNormArgs& a, hipStream_t stream) {
  const Shape s = plan(a);
  switch (s.vec) {
    case 8: if constexpr (sizeof(T) == 2) launch_rope<T, P, 8>(a, s, stream); break;
    case 4: launch_rope<T, P, 4>(a, s, stream); break;
    case 2: launch_rope<T, P, 2>(a, s, stream); break;
    default: launch_rope<T, P, 1>(a, s, stream); break;
  }
}

template <class T>
void launch_params(const RmsNormArgs& a, hipStream_t stream) {
  if (a.param_dtype == DType::f32)
    launch<T, float>(a, stream);
  else
    launch<T, T>(a, stream);
}

#endif  // !RSD_RTC
}  // namespace

#if !RSD_RTC
std::string rms_norm_check(const RmsNormArgs& a) {
  if (a.batch <= 0 || a.heads <= 0 || a.d <= 0 || a.len < 0 || a.lead_len < 0 || a.lead_len + a.len <= 0)
    return "empty tensor";
  if (a.param_dtype != a.dtype && a.param_dtype != DType::f32) return "weight dtype must be the input's or float32";
  if ((a.cos == nullptr) != (a.sin == nullptr)) return "cos and sin come together";
  if (a.lead_len > 0 && a.lead == nullptr) return "lead rows without lead";
  if (a.d > kMaxD) return "head dim " + std::to_string(a.d) + " is beyond the kernel's limit of 65536";
  if (a.cos != nullptr && a.d % 2 != 0) return "the rotary embedding needs an even head dim";
  if (joint_rows(a) >= (int64_t(1) << 31)) return "2^31 or more rows";
  const int eb = elem_bytes(a.dtype), pb = elem_bytes(a.param_dtype);
  if (!aligned(a.x, eb) || !aligned(a.lead, eb) || !aligned(a.y, eb) || !aligned(a.weight, pb) ||
      !aligned(a.lead_weight, pb) || !aligned(a.cos, 4) || !aligned(a.sin, 4))
    return "misaligned data pointer";
  if (a.cos != nullptr && pick_vec(a) < 2)
    return "the rotary embedding needs rows aligned to 2 elements (pointers and strides)";
  return std::string();
}

std::string rms_norm_forward(const RmsNormArgs& a) {
  std::string why = rms_norm_check(a);
  if (!why.empty()) return why;
  DeviceGuard guard(a.device);
  if (!guard.error().empty()) return guard.error();
  hipStream_t stream = static_cast<hipStream_t>(a.stream);
  switch (a.dtype) {
    case DType::f32: launch_params<float>(a, stream); break;
    case DType::f16: launch_params<__half>(a, stream); break;
    case DType::bf16: launch_params<bf16>(a, stream); break;
  }
  const hipError_t err = hipGetLastError();
  if (err != hipSuccess) return std::string("rms_norm launch failed: ") + hipGetErrorString(err);
  return std::string();
}

#endif  // !RSD_RTC

}  // namespace rsd
