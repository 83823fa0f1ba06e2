#include "engine/core/quant.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cfloat>
#include <cmath>
#include <limits>

#include "engine/core/half.hpp"

namespace troupe {
namespace {

constexpr int qk = 32;      // elements in a q4_0 .. q8_1 block
constexpr int qk_k = 256;   // elements in a k-quant super-block
constexpr float group_max_eps = 1e-15f;  // ggml's GROUP_MAX_EPS: below this a group is all zero
constexpr float inf = std::numeric_limits<float>::infinity();

// ---------------------------------------------------------------------------------------------
// Bytes. Blocks are read and written field by field, little-endian, so nothing depends on the
// host's byte order, struct padding or alignment; the order of the calls in each codec is the
// block layout.

class block_reader {
 public:
  explicit block_reader(const std::byte* p) : p_(p) {}
  std::uint8_t u8() { return std::to_integer<std::uint8_t>(*p_++); }
  std::uint16_t u16() {
    const std::uint16_t lo = u8();
    const std::uint16_t hi = u8();
    return static_cast<std::uint16_t>(lo | (hi << 8));
  }
  std::uint32_t u32() {
    const std::uint32_t lo = u16();
    const std::uint32_t hi = u16();
    return lo | (hi << 16);
  }
  float f16() { return f16_to_f32(u16()); }
  float f32() { return std::bit_cast<float>(u32()); }
  template <std::size_t N>
  std::array<std::uint8_t, N> u8s() {
    std::array<std::uint8_t, N> a;
    for (auto& v : a) v = u8();
    return a;
  }
  template <std::size_t N>
  std::array<std::int8_t, N> i8s() {
    std::array<std::int8_t, N> a;
    for (auto& v : a) v = static_cast<std::int8_t>(u8());
    return a;
  }

 private:
  const std::byte* p_;
};

class block_writer {
 public:
  explicit block_writer(std::byte* p) : p_(p) {}
  void u8(std::uint8_t v) { *p_++ = std::byte{v}; }
  void u16(std::uint16_t v) {
    u8(static_cast<std::uint8_t>(v & 0xffu));
    u8(static_cast<std::uint8_t>(v >> 8));
  }
  void u32(std::uint32_t v) {
    u16(static_cast<std::uint16_t>(v & 0xffffu));
    u16(static_cast<std::uint16_t>(v >> 16));
  }
  void f32(float v) { u32(std::bit_cast<std::uint32_t>(v)); }
  template <std::size_t N>
  void u8s(const std::array<std::uint8_t, N>& a) {
    for (auto v : a) u8(v);
  }
  template <std::size_t N>
  void i8s(const std::array<std::int8_t, N>& a) {
    for (auto v : a) u8(static_cast<std::uint8_t>(v));
  }

 private:
  std::byte* p_;
};

// ---------------------------------------------------------------------------------------------
// Float to integer. ggml converts with C casts and a bit trick, which are undefined (or garbage)
// outside their range; those ranges are left only when the input is non-finite or so small that
// an inverse scale overflows. The helpers below agree with ggml inside the range and saturate
// outside it, with NaN (typically 0 * inf) taking the code that decodes to zero.

// ggml's nearest_int: round half to even, as adding 1.5 * 2^23 does; ggml asserts |v| < 2^22.
int nearest_int(float v) {
  constexpr float limit = 4194303.0f;
  if (std::isnan(v)) return 0;
  return static_cast<int>(std::nearbyint(std::clamp(v, -limit, limit)));
}

// A C cast to a small integer (truncation toward zero) followed by ggml's MIN(hi, .).
int truncate_code(float v, int hi, int nan_code) {
  if (std::isnan(v)) return nan_code;
  if (v <= 0.0f) return 0;
  if (v >= static_cast<float>(hi)) return hi;
  return static_cast<int>(v);
}

// roundf (half away from zero) into an int8.
int round_i8(float v) {
  if (std::isnan(v)) return 0;
  return static_cast<int>(std::round(std::clamp(v, -128.0f, 127.0f)));
}

// IEEE division where the divisor can be zero (only for non-finite inputs): C++ leaves x / 0
// undefined even for floats.
float ieee_div(float a, float b) {
  if (b != 0.0f) return a / b;
  if (a == 0.0f || std::isnan(a)) return std::numeric_limits<float>::quiet_NaN();
  return std::signbit(a) != std::signbit(b) ? -inf : inf;
}

// A double past float's range converts with undefined behaviour; this spells out IEEE rounding
// (to infinity from FLT_MAX plus half an ulp on, else to FLT_MAX).
float narrow_to_float(double v) {
  constexpr double overflow = static_cast<double>(FLT_MAX) + 0x1p103;
  if (v >= overflow) return inf;
  if (v <= -overflow) return -inf;
  if (v > FLT_MAX) return FLT_MAX;
  if (v < -FLT_MAX) return -FLT_MAX;
  return static_cast<float>(v);
}

// ---------------------------------------------------------------------------------------------
// 32-element blocks. q4_0 and q5_0 are symmetric: the scale takes the sign of the value of largest
// magnitude, which lands exactly on the lowest code, so the other side reaches one step less.
// q4_1 and q5_1 store the block minimum. q8_1 adds the f16 sum of the values (for dot products);
// decoding ignores it.

// ggml's block maximum for the symmetric formats: the signed value of largest magnitude (the
// first one on ties). NaN never wins the comparison.
float signed_absmax(const float* x, int n) {
  float amax = 0.0f;
  float max = 0.0f;
  for (int j = 0; j < n; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

struct min_max {
  float min;
  float max;
};

min_max block_min_max(const float* x, int n) {
  min_max r{FLT_MAX, -FLT_MAX};
  for (int j = 0; j < n; ++j) {
    if (x[j] < r.min) r.min = x[j];
    if (x[j] > r.max) r.max = x[j];
  }
  return r;
}

void dequantize_q4_0(const std::byte* src, float* y) {
  block_reader r(src);
  const float d = r.f16();
  const auto qs = r.u8s<qk / 2>();
  for (int j = 0; j < qk / 2; ++j) {
    y[j] = static_cast<float>((qs[j] & 0x0f) - 8) * d;
    y[j + qk / 2] = static_cast<float>((qs[j] >> 4) - 8) * d;
  }
}

void quantize_q4_0(const float* x, std::byte* dst) {
  const float d = signed_absmax(x, qk) / -8.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  std::array<std::uint8_t, qk / 2> qs;
  for (int j = 0; j < qk / 2; ++j) {
    const int lo = truncate_code(x[j] * id + 8.5f, 15, 8);
    const int hi = truncate_code(x[j + qk / 2] * id + 8.5f, 15, 8);
    qs[j] = static_cast<std::uint8_t>(lo | (hi << 4));
  }
  block_writer w(dst);
  w.u16(f32_to_f16(d));
  w.u8s(qs);
}

// MXFP4 (OCP microscaling, as ggml stores it): one E8M0 exponent byte e, then 16 bytes whose low
// nibbles are elements 0..15 and high nibbles 16..31, each an E2M1 code. The value is
// e2m1(code) x 2^(e - 127); ggml keeps the E2M1 values doubled and the scale halved, the same product.
constexpr std::array<std::int8_t, 16> e2m1_doubled = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

float e8m0_half(std::uint8_t e) {  // 2^(e - 128), exactly (e = 0 and 1 are subnormal in f32)
  return e < 2 ? static_cast<float>(std::ldexp(1.0, static_cast<int>(e) - 128)) : std::bit_cast<float>(static_cast<std::uint32_t>(e - 1) << 23);
}

void dequantize_mxfp4(const std::byte* src, float* y) {
  const auto e = static_cast<std::uint8_t>(src[0]);
  const float d = e8m0_half(e);
  for (int j = 0; j < qk / 2; ++j) {
    const auto b = static_cast<std::uint8_t>(src[1 + j]);
    y[j] = static_cast<float>(e2m1_doubled[b & 0x0f]) * d;
    y[j + qk / 2] = static_cast<float>(e2m1_doubled[b >> 4]) * d;
  }
}

}  // namespace

bool mxfp4_as_q8_0(const std::byte* src, std::byte* dst, std::int64_t blocks) {
  for (std::int64_t b = 0; b < blocks; ++b, src += 17, dst += 34) {
    const int p = static_cast<int>(static_cast<std::uint8_t>(src[0])) - 128;  // d = 2^p
    if (p < -24 || p > 15) return false;
    const std::uint16_t h = p >= -14 ? static_cast<std::uint16_t>((p + 15) << 10) : static_cast<std::uint16_t>(1u << (p + 24));
    dst[0] = static_cast<std::byte>(h & 0xff);
    dst[1] = static_cast<std::byte>(h >> 8);
    for (int j = 0; j < qk / 2; ++j) {
      const auto c = static_cast<std::uint8_t>(src[1 + j]);
      dst[2 + j] = static_cast<std::byte>(static_cast<std::uint8_t>(e2m1_doubled[c & 0x0f]));
      dst[2 + j + qk / 2] = static_cast<std::byte>(static_cast<std::uint8_t>(e2m1_doubled[c >> 4]));
    }
  }
  return true;
}

namespace {

// The shared exponent puts the block's largest magnitude in E2M1's top binade (as ggml's reference
// quantizer: floor(log2(amax)) - 2 + 127); each value takes the nearest code (the lower on a tie).
void quantize_mxfp4(const float* x, std::byte* dst) {
  float amax = 0.0f;
  for (int j = 0; j < qk; ++j) amax = std::max(amax, std::fabs(x[j]));
  const int ex = amax > 0.0f && std::isfinite(amax) ? std::clamp(static_cast<int>(std::floor(std::log2(amax))) - 2 + 127, 0, 254) : 0;
  const float d = e8m0_half(static_cast<std::uint8_t>(ex));
  auto code = [&](float v) {
    int best = 0;
    float err = INFINITY;
    for (int c = 0; c < 16; ++c) {
      const float e2 = std::fabs(v - static_cast<float>(e2m1_doubled[c]) * d);
      if (e2 < err) err = e2, best = c;
    }
    return best;
  };
  dst[0] = static_cast<std::byte>(ex);
  for (int j = 0; j < qk / 2; ++j) dst[1 + j] = static_cast<std::byte>(code(x[j]) | (code(x[j + qk / 2]) << 4));
}

// IQ4_NL (ggml): one f16 d and 16 bytes of nibbles in q4_0's order, each an index into a fixed table of
// 16 non-uniform int8 levels; the value is d x level. IQ4_XS: the same table in 256-superblocks of
// eight 32-element sub-blocks, each scaled by d x (ls - 32) with a 6-bit ls (low 4 bits in scales_l,
// high 2 in scales_h). ggml's encoders search several scales and weight by an importance; troupe's
// (for fixtures and tests) takes the first candidate of that search, the block's signed maximum on
// the table's lowest level, and the nearest level for every value.
constexpr std::array<std::int8_t, 16> iq4nl_levels = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                      1,    13,   25,  38,  53,  69,  89,  113};

void dequantize_iq4_nl(const std::byte* src, float* y) {
  block_reader r(src);
  const float d = r.f16();
  const auto qs = r.u8s<qk / 2>();
  for (int j = 0; j < qk / 2; ++j) {
    y[j] = d * static_cast<float>(iq4nl_levels[qs[j] & 0x0f]);
    y[j + qk / 2] = d * static_cast<float>(iq4nl_levels[qs[j] >> 4]);
  }
}

// The level nearest to v (the lower on a tie); NaN takes the level nearest zero.
int iq4nl_index(float v) {
  if (std::isnan(v)) return 8;
  if (v <= iq4nl_levels[0]) return 0;
  if (v >= iq4nl_levels[15]) return 15;
  int i = 0;
  while (i < 15 && static_cast<float>(iq4nl_levels[i + 1]) < v) ++i;
  return v - static_cast<float>(iq4nl_levels[i]) <= static_cast<float>(iq4nl_levels[i + 1]) - v ? i : i + 1;
}

// Codes of 32 values against scale d (0: all the level nearest zero).
std::array<std::uint8_t, qk / 2> iq4nl_codes(const float* x, float d) {
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  std::array<std::uint8_t, qk / 2> qs;
  for (int j = 0; j < qk / 2; ++j)
    qs[j] = static_cast<std::uint8_t>(iq4nl_index(x[j] * id) | (iq4nl_index(x[j + qk / 2] * id) << 4));
  return qs;
}

void quantize_iq4_nl(const float* x, std::byte* dst) {
  const float d = f16_to_f32(f32_to_f16(signed_absmax(x, qk) / static_cast<float>(iq4nl_levels[0])));
  block_writer w(dst);
  w.u16(f32_to_f16(d));
  w.u8s(iq4nl_codes(x, d));
}

void dequantize_iq4_xs(const std::byte* src, float* y) {
  block_reader r(src);
  const float d = r.f16();
  const std::uint16_t scales_h = r.u16();
  const auto scales_l = r.u8s<4>();
  const auto qs = r.u8s<qk_k / 2>();
  for (int ib = 0; ib < qk_k / 32; ++ib) {
    const int ls = ((scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0f) | (((scales_h >> (2 * ib)) & 3) << 4);
    const float dl = d * static_cast<float>(ls - 32);
    for (int j = 0; j < 16; ++j) {
      y[32 * ib + j] = dl * static_cast<float>(iq4nl_levels[qs[16 * ib + j] & 0x0f]);
      y[32 * ib + j + 16] = dl * static_cast<float>(iq4nl_levels[qs[16 * ib + j] >> 4]);
    }
  }
}

void quantize_iq4_xs(const float* x, std::byte* dst) {
  std::array<float, qk_k / 32> scale{};
  float max_scale = 0.0f, amax_scale = 0.0f;
  for (int ib = 0; ib < qk_k / 32; ++ib) {
    scale[ib] = signed_absmax(x + 32 * ib, 32) / static_cast<float>(iq4nl_levels[0]);
    if (std::fabs(scale[ib]) > amax_scale) amax_scale = std::fabs(scale[ib]), max_scale = scale[ib];
  }
  const float d = f16_to_f32(f32_to_f16(-max_scale / 32.0f));
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  std::uint16_t scales_h = 0;
  std::array<std::uint8_t, 4> scales_l{};
  std::array<std::uint8_t, qk_k / 2> qs{};
  for (int ib = 0; ib < qk_k / 32; ++ib) {
    const int l = std::clamp(nearest_int(id * scale[ib]), -32, 31);
    const int ls = l + 32;
    scales_l[ib / 2] = static_cast<std::uint8_t>(scales_l[ib / 2] | ((ls & 0x0f) << (4 * (ib % 2))));
    scales_h = static_cast<std::uint16_t>(scales_h | ((ls >> 4) << (2 * ib)));
    const auto codes = iq4nl_codes(x + 32 * ib, d * static_cast<float>(l));
    std::copy(codes.begin(), codes.end(), qs.begin() + 16 * ib);
  }
  block_writer w(dst);
  w.u16(f32_to_f16(d));
  w.u16(scales_h);
  w.u8s(scales_l);
  w.u8s(qs);
}

// troupe's affine row forms of the Hugging Face integer formats (GPTQ, AWQ, compressed-tensors): per
// 32 elements a scale d (4-bit: f16, then a u8 zero z and a zero byte; 8-bit: f32, then z and three zero
// bytes) and the codes q (4-bit: q4_0's nibble order; 8-bit: one byte each); the value is d x (q - z),
// exact in f32. Their encoders (tests and fixtures; the loader copies the stored codes) fit the block's
// range: d = (max - min) / (levels - 1) (rounded to f16 for 4 bits), z = round(-min / d), each code the
// nearest level.
template <int Levels>
void dequantize_affine(const std::byte* src, float* y) {
  block_reader r(src);
  const float d = Levels == 16 ? r.f16() : r.f32();
  const int z = r.u8();
  for (int pad = 0; pad < (Levels == 16 ? 1 : 3); ++pad) (void)r.u8();
  if constexpr (Levels == 16) {
    const auto qs = r.u8s<qk / 2>();
    for (int j = 0; j < qk / 2; ++j) {
      y[j] = d * static_cast<float>((qs[j] & 0x0f) - z);
      y[j + qk / 2] = d * static_cast<float>((qs[j] >> 4) - z);
    }
  } else {
    const auto qs = r.u8s<qk>();
    for (int j = 0; j < qk; ++j) y[j] = d * static_cast<float>(qs[j] - z);
  }
}

template <int Levels>
void quantize_affine(const float* x, std::byte* dst) {
  const auto mm = block_min_max(x, qk);
  const float lo = std::min(mm.min, 0.0f), hi = std::max(mm.max, 0.0f);
  const float span = std::isfinite(hi - lo) ? hi - lo : FLT_MAX;
  const float raw = span / static_cast<float>(Levels - 1);
  float d = Levels == 16 ? f16_to_f32(f32_to_f16(raw)) : raw;
  float id = d != 0.0f && std::isfinite(d) ? 1.0f / d : 0.0f;
  if (!std::isfinite(id)) d = 0.0f, id = 0.0f;  // a subnormal d: every value codes as the zero
  const int z = std::clamp(nearest_int(-lo * id), 0, Levels - 1);
  auto code = [&](float v) { return std::clamp(nearest_int(v * id) + z, 0, Levels - 1); };
  block_writer w(dst);
  if constexpr (Levels == 16) w.u16(f32_to_f16(d));
  else w.f32(d);
  w.u8(static_cast<std::uint8_t>(z));
  for (int pad = 0; pad < (Levels == 16 ? 1 : 3); ++pad) w.u8(0);
  if constexpr (Levels == 16) {
    for (int j = 0; j < qk / 2; ++j) w.u8(static_cast<std::uint8_t>(code(x[j]) | (code(x[j + qk / 2]) << 4)));
  } else {
    for (int j = 0; j < qk; ++j) w.u8(static_cast<std::uint8_t>(code(x[j])));
  }
}

// FP8 with a scale (troupe's row form of FP8 checkpoints): per 32 elements an f32 s and 32 E4M3 codes;
// the value is s x e4m3(q). The encoder puts the block's largest magnitude on E4M3's largest, 448.
void dequantize_fp8_s32(const std::byte* src, float* y) {
  block_reader r(src);
  const float s = r.f32();
  for (int j = 0; j < qk; ++j) y[j] = s * fp8_e4m3_to_f32(r.u8());
}

void quantize_fp8_s32(const float* x, std::byte* dst) {
  float amax = 0.0f;
  for (int j = 0; j < qk; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float s = std::isfinite(amax) ? amax / 448.0f : 0.0f;
  block_writer w(dst);
  w.f32(s);
  // Divided rather than times 1 / s, which overflows for a subnormal s.
  for (int j = 0; j < qk; ++j) w.u8(std::isnan(x[j]) || s == 0.0f ? 0 : f32_to_fp8_e4m3(x[j] / s));
}

void dequantize_q4_1(const std::byte* src, float* y) {
  block_reader r(src);
  const float d = r.f16();
  const float m = r.f16();
  const auto qs = r.u8s<qk / 2>();
  for (int j = 0; j < qk / 2; ++j) {
    y[j] = static_cast<float>(qs[j] & 0x0f) * d + m;
    y[j + qk / 2] = static_cast<float>(qs[j] >> 4) * d + m;
  }
}

void quantize_q4_1(const float* x, std::byte* dst) {
  const auto [min, max] = block_min_max(x, qk);
  const float d = (max - min) / 15.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  std::array<std::uint8_t, qk / 2> qs;
  for (int j = 0; j < qk / 2; ++j) {
    const int lo = truncate_code((x[j] - min) * id + 0.5f, 15, 0);
    const int hi = truncate_code((x[j + qk / 2] - min) * id + 0.5f, 15, 0);
    qs[j] = static_cast<std::uint8_t>(lo | (hi << 4));
  }
  block_writer w(dst);
  w.u16(f32_to_f16(d));
  w.u16(f32_to_f16(min));
  w.u8s(qs);
}

// q5 blocks keep the fifth bit of element j in bit j of a 32-bit word (elements 16..31 in the
// upper half).
int fifth_bit(std::uint32_t qh, int j) { return static_cast<int>((qh >> j) & 1u) << 4; }

void dequantize_q5_0(const std::byte* src, float* y) {
  block_reader r(src);
  const float d = r.f16();
  const std::uint32_t qh = r.u32();
  const auto qs = r.u8s<qk / 2>();
  for (int j = 0; j < qk / 2; ++j) {
    y[j] = static_cast<float>(((qs[j] & 0x0f) | fifth_bit(qh, j)) - 16) * d;
    y[j + qk / 2] = static_cast<float>(((qs[j] >> 4) | fifth_bit(qh, j + qk / 2)) - 16) * d;
  }
}

void quantize_q5_0(const float* x, std::byte* dst) {
  const float d = signed_absmax(x, qk) / -16.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  std::uint32_t qh = 0;
  std::array<std::uint8_t, qk / 2> qs;
  for (int j = 0; j < qk / 2; ++j) {
    const int lo = truncate_code(x[j] * id + 16.5f, 31, 16);
    const int hi = truncate_code(x[j + qk / 2] * id + 16.5f, 31, 16);
    qs[j] = static_cast<std::uint8_t>((lo & 0x0f) | ((hi & 0x0f) << 4));
    qh |= static_cast<std::uint32_t>(lo >> 4) << j;
    qh |= static_cast<std::uint32_t>(hi >> 4) << (j + qk / 2);
  }
  block_writer w(dst);
  w.u16(f32_to_f16(d));
  w.u32(qh);
  w.u8s(qs);
}

void dequantize_q5_1(const std::byte* src, float* y) {
  block_reader r(src);
  const float d = r.f16();
  const float m = r.f16();
  const std::uint32_t qh = r.u32();
  const auto qs = r.u8s<qk / 2>();
  for (int j = 0; j < qk / 2; ++j) {
    y[j] = static_cast<float>((qs[j] & 0x0f) | fifth_bit(qh, j)) * d + m;
    y[j + qk / 2] = static_cast<float>((qs[j] >> 4) | fifth_bit(qh, j + qk / 2)) * d + m;
  }
}

void quantize_q5_1(const float* x, std::byte* dst) {
  const auto [min, max] = block_min_max(x, qk);
  const float d = (max - min) / 31.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  std::uint32_t qh = 0;
  std::array<std::uint8_t, qk / 2> qs;
  for (int j = 0; j < qk / 2; ++j) {
    const int lo = truncate_code((x[j] - min) * id + 0.5f, 31, 0);
    const int hi = truncate_code((x[j + qk / 2] - min) * id + 0.5f, 31, 0);
    qs[j] = static_cast<std::uint8_t>((lo & 0x0f) | ((hi & 0x0f) << 4));
    qh |= static_cast<std::uint32_t>(lo >> 4) << j;
    qh |= static_cast<std::uint32_t>(hi >> 4) << (j + qk / 2);
  }
  block_writer w(dst);
  w.u16(f32_to_f16(d));
  w.u16(f32_to_f16(min));
  w.u32(qh);
  w.u8s(qs);
}

void dequantize_q8_0(const std::byte* src, float* y) {
  block_reader r(src);
  const float d = r.f16();
  const auto qs = r.i8s<qk>();
  for (int j = 0; j < qk; ++j) y[j] = static_cast<float>(qs[j]) * d;
}

void quantize_q8_0(const float* x, std::byte* dst) {
  // Written as ggml's MAX(amax, |x|), whose operand order decides what a NaN does.
  float amax = 0.0f;
  for (int j = 0; j < qk; ++j) {
    const float a = std::fabs(x[j]);
    amax = amax > a ? amax : a;
  }
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  std::array<std::int8_t, qk> qs;
  for (int j = 0; j < qk; ++j) qs[j] = static_cast<std::int8_t>(round_i8(x[j] * id));
  block_writer w(dst);
  w.u16(f32_to_f16(d));
  w.i8s(qs);
}

void dequantize_q8_1(const std::byte* src, float* y) {
  block_reader r(src);
  const float d = r.f16();
  r.u16();  // the f16 sum d * sum(qs)
  const auto qs = r.i8s<qk>();
  for (int j = 0; j < qk; ++j) y[j] = static_cast<float>(qs[j]) * d;
}

// ---------------------------------------------------------------------------------------------
// k-quants: 256-element super-blocks of 16 or 32-element sub-blocks. Each sub-block has its own
// small integer scale (and for q2_k, q4_k, q5_k a min), quantized against one or two f16
// super-block factors.

// q4_k / q5_k: eight 6-bit scales and eight 6-bit mins in 12 bytes. Sub-blocks 0..3 use the low 6
// bits of bytes 0..3 (scale) and 4..7 (min); sub-blocks 4..7 keep their low 4 bits in the nibbles
// of bytes 8..11 (scale low, min high) and their top 2 bits in the top 2 bits of bytes 0..3
// (scale) and 4..7 (min).
struct scale_min {
  std::uint8_t scale;
  std::uint8_t min;
};

scale_min unpack_scale_min(const std::array<std::uint8_t, 12>& s, int j) {
  if (j < 4) return {static_cast<std::uint8_t>(s[j] & 63), static_cast<std::uint8_t>(s[j + 4] & 63)};
  return {static_cast<std::uint8_t>((s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4)),
          static_cast<std::uint8_t>((s[j + 4] >> 4) | ((s[j] >> 6) << 4))};
}

std::array<std::uint8_t, 12> pack_scale_min(const std::array<std::uint8_t, 8>& scales,
                                            const std::array<std::uint8_t, 8>& mins) {
  std::array<std::uint8_t, 12> s{};
  for (int j = 0; j < 4; ++j) {
    s[j] = scales[j];
    s[j + 4] = mins[j];
  }
  for (int j = 4; j < 8; ++j) {
    s[j + 4] = static_cast<std::uint8_t>((scales[j] & 0x0f) | ((mins[j] & 0x0f) << 4));
    s[j - 4] |= static_cast<std::uint8_t>((scales[j] >> 4) << 6);
    s[j] |= static_cast<std::uint8_t>((mins[j] >> 4) << 6);
  }
  return s;
}

// q3_k: sixteen 6-bit scales (stored biased by 32) in 12 bytes. The low 4 bits of scale j are the
// low nibble of byte j for j < 8 and the high nibble of byte j - 8 otherwise; its top 2 bits are
// bits 2 * (j / 4) of byte 8 + j % 4.
int unpack_q3_scale(const std::array<std::uint8_t, 12>& s, int j) {
  const int low = j < 8 ? (s[j] & 0x0f) : (s[j - 8] >> 4);
  const int high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (low | (high << 4)) - 32;
}

void dequantize_q2_k(const std::byte* src, float* y) {
  block_reader r(src);
  const auto scales = r.u8s<qk_k / 16>();  // low nibble scale, high nibble min
  const auto qs = r.u8s<qk_k / 4>();
  const float d = r.f16();
  const float dmin = r.f16();
  // Each 128-element half uses 32 bytes of qs; its four 32-element groups are the four 2-bit
  // fields of those bytes, and each group is two 16-element sub-blocks.
  for (int half = 0; half < 2; ++half) {
    for (int group = 0; group < 4; ++group) {
      for (int sub = 0; sub < 2; ++sub) {
        const int is = 8 * half + 2 * group + sub;
        const float dl = d * static_cast<float>(scales[is] & 0x0f);
        const float ml = dmin * static_cast<float>(scales[is] >> 4);
        for (int l = 0; l < 16; ++l) {
          const int q = (qs[32 * half + 16 * sub + l] >> (2 * group)) & 3;
          *y++ = dl * static_cast<float>(q) - ml;
        }
      }
    }
  }
}

void dequantize_q3_k(const std::byte* src, float* y) {
  block_reader r(src);
  const auto hmask = r.u8s<qk_k / 8>();
  const auto qs = r.u8s<qk_k / 4>();
  const auto scales = r.u8s<12>();
  const float d = r.f16();
  // As q2_k for the low 2 bits; the high bit of the element at byte offset k of group g in half h
  // is bit 4 * h + g of hmask[k], and a clear bit subtracts 4.
  for (int half = 0; half < 2; ++half) {
    for (int group = 0; group < 4; ++group) {
      const int bit = 4 * half + group;
      for (int sub = 0; sub < 2; ++sub) {
        const float dl = d * static_cast<float>(unpack_q3_scale(scales, 8 * half + 2 * group + sub));
        for (int l = 0; l < 16; ++l) {
          const int k = 16 * sub + l;
          const int low = (qs[32 * half + k] >> (2 * group)) & 3;
          const int q = low - (((hmask[k] >> bit) & 1) ? 0 : 4);
          *y++ = dl * static_cast<float>(q);
        }
      }
    }
  }
}

void dequantize_q4_k(const std::byte* src, float* y) {
  block_reader r(src);
  const float d = r.f16();
  const float dmin = r.f16();
  const auto scales = r.u8s<12>();
  const auto qs = r.u8s<qk_k / 2>();
  // Each 64-element chunk is 32 bytes: sub-block 2c in the low nibbles, 2c + 1 in the high.
  for (int c = 0; c < 4; ++c) {
    for (int sub = 0; sub < 2; ++sub) {
      const auto sm = unpack_scale_min(scales, 2 * c + sub);
      const float dl = d * static_cast<float>(sm.scale);
      const float ml = dmin * static_cast<float>(sm.min);
      for (int l = 0; l < 32; ++l) {
        const int q = (qs[32 * c + l] >> (4 * sub)) & 0x0f;
        *y++ = dl * static_cast<float>(q) - ml;
      }
    }
  }
}

void dequantize_q5_k(const std::byte* src, float* y) {
  block_reader r(src);
  const float d = r.f16();
  const float dmin = r.f16();
  const auto scales = r.u8s<12>();
  const auto qh = r.u8s<qk_k / 8>();
  const auto qs = r.u8s<qk_k / 2>();
  // As q4_k; the fifth bit of element l of sub-block s is bit s of qh[l].
  for (int c = 0; c < 4; ++c) {
    for (int sub = 0; sub < 2; ++sub) {
      const int s = 2 * c + sub;
      const auto sm = unpack_scale_min(scales, s);
      const float dl = d * static_cast<float>(sm.scale);
      const float ml = dmin * static_cast<float>(sm.min);
      for (int l = 0; l < 32; ++l) {
        const int q = ((qs[32 * c + l] >> (4 * sub)) & 0x0f) | (((qh[l] >> s) & 1) << 4);
        *y++ = dl * static_cast<float>(q) - ml;
      }
    }
  }
}

void dequantize_q6_k(const std::byte* src, float* y) {
  block_reader r(src);
  const auto ql = r.u8s<qk_k / 2>();
  const auto qh = r.u8s<qk_k / 4>();
  const auto scales = r.i8s<qk_k / 16>();
  const float d = r.f16();
  // A 128-element half h uses 64 bytes of ql and 32 of qh. Its quarter g (32 elements) takes the
  // low (g = 0, 1) or high (g = 2, 3) nibbles of ql[64h + 32(g % 2) + l] and bits 2g..2g+1 of
  // qh[32h + l]; elements 0..15 and 16..31 of a quarter are separate sub-blocks.
  for (int half = 0; half < 2; ++half) {
    for (int g = 0; g < 4; ++g) {
      for (int l = 0; l < 32; ++l) {
        const int low = (ql[64 * half + 32 * (g % 2) + l] >> (4 * (g / 2))) & 0x0f;
        const int high = (qh[32 * half + l] >> (2 * g)) & 3;
        const int q = (low | (high << 4)) - 32;
        const int is = 8 * half + 2 * g + l / 16;
        *y++ = d * static_cast<float>(scales[is]) * static_cast<float>(q);
      }
    }
  }
}

void dequantize_q8_k(const std::byte* src, float* y) {
  block_reader r(src);
  const float d = r.f32();
  const auto qs = r.i8s<qk_k>();
  // 16 int16 sums of 16 quants follow (for dot products); decoding does not need them.
  for (int j = 0; j < qk_k; ++j) y[j] = d * static_cast<float>(qs[j]);
}

// ggml's quantize_row_q8_K_ref, except that an all-zero block also gets zero sums, which ggml
// leaves unwritten.
void quantize_q8_k(const float* x, std::byte* dst) {
  float max = 0.0f;
  float amax = 0.0f;
  for (int j = 0; j < qk_k; ++j) {
    const float a = std::fabs(x[j]);
    if (a > amax) {
      amax = a;
      max = x[j];
    }
  }
  std::array<std::int8_t, qk_k> qs{};
  std::array<std::int16_t, qk_k / 16> bsums{};
  float d = 0.0f;
  if (amax != 0.0f) {
    const float iscale = -127.0f / max;
    for (int j = 0; j < qk_k; ++j) {
      qs[j] = static_cast<std::int8_t>(std::clamp(nearest_int(iscale * x[j]), -128, 127));
    }
    for (int j = 0; j < qk_k / 16; ++j) {
      int sum = 0;
      for (int i = 0; i < 16; ++i) sum += qs[16 * j + i];
      bsums[j] = static_cast<std::int16_t>(sum);
    }
    d = ieee_div(1.0f, iscale);
  }
  block_writer w(dst);
  w.f32(d);
  w.i8s(qs);
  for (auto s : bsums) w.u16(static_cast<std::uint16_t>(s));
}

// ggml's make_qkx2_quants: fits x ~ scale * l - min with l in [0, nmax] and min >= 0, minimizing
// the weighted squared error over inverse scales (rmin + rdelta * is + nmax) / range,
// is = 0..nstep, each followed by a closed-form least-squares refit of scale and min. The float
// operations and their order are ggml's, so the chosen codes match bit for bit.
struct affine_fit {
  float scale;
  float min;  // subtracted: x ~ scale * l - min
};

affine_fit fit_scale_min(const float* x, const float* w, int n, int nmax, float rmin, float rdelta,
                         int nstep, std::uint8_t* codes, bool use_mad = false) {
  float min = x[0];
  float max = x[0];
  float sum_w = w[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (min > 0.0f) min = 0.0f;
  if (max == min) {
    std::fill(codes, codes + n, std::uint8_t{0});
    return {0.0f, -min};
  }
  float iscale = static_cast<float>(nmax) / (max - min);
  float scale = ieee_div(1.0f, iscale);  // iscale is 0 when max - min overflows
  float best_error = 0.0f;
  for (int i = 0; i < n; ++i) {
    const int l = std::clamp(nearest_int(iscale * (x[i] - min)), 0, nmax);
    codes[i] = static_cast<std::uint8_t>(l);
    const float diff = scale * static_cast<float>(l) + min - x[i];
    best_error += w[i] * (use_mad ? std::fabs(diff) : diff * diff);
  }
  std::array<std::uint8_t, qk_k> trial;
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * static_cast<float>(is) + static_cast<float>(nmax)) / (max - min);
    float sum_l = 0.0f;
    float sum_l2 = 0.0f;
    float sum_xl = 0.0f;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(nearest_int(iscale * (x[i] - min)), 0, nmax);
      trial[i] = static_cast<std::uint8_t>(l);
      const float fl = static_cast<float>(l);
      sum_l += w[i] * fl;
      sum_l2 += w[i] * fl * fl;
      sum_xl += w[i] * fl * x[i];
    }
    const float det = sum_w * sum_l2 - sum_l * sum_l;
    if (!(det > 0.0f)) continue;
    float this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
    float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
    if (this_min > 0.0f) {
      this_min = 0.0f;
      this_scale = sum_xl / sum_l2;
    }
    float error = 0.0f;
    for (int i = 0; i < n; ++i) {
      const float diff = this_scale * static_cast<float>(trial[i]) + this_min - x[i];
      error += w[i] * (use_mad ? std::fabs(diff) : diff * diff);
    }
    if (error < best_error) {
      std::copy(trial.begin(), trial.begin() + n, codes);
      best_error = error;
      scale = this_scale;
      min = this_min;
    }
  }
  return {scale, -min};
}

// ggml's make_qx_quants with rmse_type 1 and no importance weights: symmetric codes
// l in [-nmax, nmax - 1], stored as l + nmax, with the scale fitted by least squares weighted by
// x^2 at the inverse scale -nmax / max and 18 neighbours -(nmax + 0.1 is) / max, keeping the best.
float fit_symmetric(const float* x, int n, int nmax, std::uint8_t* codes) {
  float max = 0.0f;
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    if (a > amax) {
      amax = a;
      max = x[i];
    }
  }
  if (amax < group_max_eps) {
    std::fill(codes, codes + n, std::uint8_t{0});
    return 0.0f;
  }
  std::array<std::uint8_t, qk_k> trial;
  // One pass at inverse scale `iscale`: codes into `out`, weighted sums into sumlx and suml2.
  auto pass = [&](float iscale, std::uint8_t* out, float& sumlx, float& suml2) {
    sumlx = 0.0f;
    suml2 = 0.0f;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1);
      out[i] = static_cast<std::uint8_t>(l + nmax);
      const float fl = static_cast<float>(l);
      const float w = x[i] * x[i];
      sumlx += w * x[i] * fl;
      suml2 += w * fl * fl;
    }
  };
  float sumlx;
  float suml2;
  pass(static_cast<float>(-nmax) / max, codes, sumlx, suml2);
  float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    const float iscale = -(static_cast<float>(nmax) + 0.1f * static_cast<float>(is)) / max;
    pass(iscale, trial.data(), sumlx, suml2);
    if (suml2 > 0.0f && sumlx * sumlx > best * suml2) {
      std::copy(trial.begin(), trial.begin() + n, codes);
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// ggml's quantize_row_q4_K_ref: per 32-element sub-block an affine fit weighted by
// rms(sub-block) + |x|, the eight scales and eight mins quantized to 6 bits against the largest of
// each, then every element re-coded against the quantized scale and min.
// q4_k and q5_k (ggml's quantize_row_q4_K_ref / q5_K_ref): an affine fit per 32-element sub-block with
// 15 or 31 levels, scales and mins quantized to 6 bits, then every element re-coded. q5_k keeps the
// fifth bit of element l of sub-block s in bit s of qh[l].
template <bool Five>
void quantize_q45_k(const float* x, std::byte* dst) {
  constexpr int nmax = Five ? 31 : 15;
  std::array<std::uint8_t, qk_k> codes;
  std::array<float, 8> scales;
  std::array<float, 8> mins;
  float max_scale = 0.0f;
  float max_min = 0.0f;
  for (int j = 0; j < 8; ++j) {
    const float* xs = x + 32 * j;
    float sum_x2 = 0.0f;
    for (int l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
    const float av_x = std::sqrt(sum_x2 / 32.0f);
    std::array<float, 32> weights;
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(xs[l]);
    const auto fit = fit_scale_min(xs, weights.data(), 32, nmax, Five ? -0.5f : -1.0f, 0.1f, Five ? 15 : 20, codes.data() + 32 * j);
    scales[j] = fit.scale;
    mins[j] = fit.min;
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  const float inv_scale = max_scale > 0.0f ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0.0f ? 63.0f / max_min : 0.0f;
  std::array<std::uint8_t, 8> ls;
  std::array<std::uint8_t, 8> lm;
  for (int j = 0; j < 8; ++j) {
    // ggml stores nearest_int into a uint8_t before MIN(63, .): the wrap is part of the format.
    ls[j] = std::min<std::uint8_t>(63, static_cast<std::uint8_t>(nearest_int(inv_scale * scales[j])));
    lm[j] = std::min<std::uint8_t>(63, static_cast<std::uint8_t>(nearest_int(inv_min * mins[j])));
  }
  const auto packed = pack_scale_min(ls, lm);
  const std::uint16_t d16 = f32_to_f16(max_scale / 63.0f);
  const std::uint16_t dmin16 = f32_to_f16(max_min / 63.0f);
  const float d = f16_to_f32(d16);
  const float dmin = f16_to_f32(dmin16);
  for (int j = 0; j < 8; ++j) {
    const auto sm = unpack_scale_min(packed, j);
    const float dl = d * static_cast<float>(sm.scale);
    if (dl == 0.0f) continue;
    const float ml = dmin * static_cast<float>(sm.min);
    for (int i = 0; i < 32; ++i) {
      const int l = nearest_int((x[32 * j + i] + ml) / dl);
      codes[32 * j + i] = static_cast<std::uint8_t>(std::clamp(l, 0, nmax));
    }
  }
  std::array<std::uint8_t, qk_k / 2> qs;
  std::array<std::uint8_t, qk_k / 8> qh{};
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      const int lo = codes[64 * c + l], hi = codes[64 * c + 32 + l];
      qs[32 * c + l] = static_cast<std::uint8_t>((lo & 15) | ((hi & 15) << 4));
      qh[l] = static_cast<std::uint8_t>(qh[l] | ((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
    }
  }
  block_writer w(dst);
  w.u16(d16);
  w.u16(dmin16);
  w.u8s(packed);
  if constexpr (Five) w.u8s(qh);
  w.u8s(qs);
}

// ggml's make_q3_quants with its rmse refinement: a symmetric fit of n values to codes in
// [-nmax, nmax - 1] (returned offset by nmax), weighted by x^2; returns the scale.
float fit_q3(const float* x, int n, int nmax, std::uint8_t* codes) {
  float max = 0.0f, amax = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < group_max_eps) {
    for (int i = 0; i < n; ++i) codes[i] = 0;
    return 0.0f;
  }
  const float iscale = -static_cast<float>(nmax) / max;
  std::array<int, 16> l{};
  float sumlx = 0.0f, suml2 = 0.0f;
  for (int i = 0; i < n; ++i) {
    l[i] = std::clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1);
    const float w = x[i] * x[i], fl = static_cast<float>(l[i]);
    sumlx += w * x[i] * fl;
    suml2 += w * fl * fl;
  }
  for (int itry = 0; itry < 5; ++itry) {
    int changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      const float fl = static_cast<float>(l[i]);
      float slx = sumlx - w * x[i] * fl;
      if (slx > 0.0f) {
        float sl2 = suml2 - w * fl * fl;
        const int nl = std::clamp(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
        if (nl != l[i]) {
          const float fn = static_cast<float>(nl);
          slx += w * x[i] * fn;
          sl2 += w * fn * fn;
          if (sl2 > 0.0f && slx * slx * suml2 > sumlx * sumlx * sl2) {
            l[i] = nl;
            sumlx = slx;
            suml2 = sl2;
            ++changed;
          }
        }
      }
    }
    if (changed == 0) break;
  }
  for (int i = 0; i < n; ++i) codes[i] = static_cast<std::uint8_t>(l[i] + nmax);
  return suml2 > 0.0f ? sumlx / suml2 : 0.0f;  // ggml divides by 0 (NaN) when every x^2 underflows
}

// ggml's quantize_row_q3_K_ref: a fit per 16-element sub-block, the sixteen scales quantized to 6 bits
// (biased by 32) against the one of largest magnitude, every element re-coded in [-4, 3]; the third
// bit of element j goes to bit j / 32 of hmask[j % 32], the low two bits to qs as q2_k keeps them.
void quantize_q3_k(const float* x, std::byte* dst) {
  std::array<std::uint8_t, qk_k> codes;
  std::array<float, 16> scales;
  float max_scale = 0.0f, amax = 0.0f;
  for (int j = 0; j < 16; ++j) {
    scales[j] = fit_q3(x + 16 * j, 16, 4, codes.data() + 16 * j);
    const float a = std::fabs(scales[j]);
    if (a > amax) {
      amax = a;
      max_scale = scales[j];
    }
  }
  std::array<std::uint8_t, 12> packed{};
  std::uint16_t d16 = 0;
  if (max_scale != 0.0f) {
    const float iscale = -32.0f / max_scale;
    for (int j = 0; j < 16; ++j) {
      int l = std::clamp(nearest_int(iscale * scales[j]), -32, 31) + 32;
      if (j < 8) packed[j] = static_cast<std::uint8_t>(l & 0x0f);
      else packed[j - 8] = static_cast<std::uint8_t>(packed[j - 8] | ((l & 0x0f) << 4));
      l >>= 4;
      packed[8 + j % 4] = static_cast<std::uint8_t>(packed[8 + j % 4] | (l << (2 * (j / 4))));
    }
    d16 = f32_to_f16(ieee_div(1.0f, iscale));
  }
  const float d = f16_to_f32(d16);
  for (int j = 0; j < 16; ++j) {
    const float dl = d * static_cast<float>(unpack_q3_scale(packed, j));
    if (dl == 0.0f) continue;
    for (int i = 0; i < 16; ++i) codes[16 * j + i] = static_cast<std::uint8_t>(std::clamp(nearest_int(x[16 * j + i] / dl), -4, 3) + 4);
  }
  std::array<std::uint8_t, qk_k / 8> hmask{};
  for (int j = 0; j < qk_k; ++j) {
    if (codes[j] > 3) {
      hmask[j % 32] = static_cast<std::uint8_t>(hmask[j % 32] | (1 << (j / 32)));
      codes[j] = static_cast<std::uint8_t>(codes[j] - 4);
    }
  }
  std::array<std::uint8_t, qk_k / 4> qs;
  for (int j = 0; j < qk_k; j += 128) {
    for (int l = 0; l < 32; ++l) {
      qs[j / 4 + l] = static_cast<std::uint8_t>(codes[j + l] | (codes[j + l + 32] << 2) | (codes[j + l + 64] << 4) | (codes[j + l + 96] << 6));
    }
  }
  block_writer w(dst);
  w.u8s(hmask);
  w.u8s(qs);
  w.u8s(packed);
  w.u16(d16);
}

// ggml's quantize_row_q2_K_ref: an affine fit per 16-element sub-block with 4 levels (absolute error,
// weighted by |x|), the scales and mins quantized to 4 bits against their largest, every element re-coded.
void quantize_q2_k(const float* x, std::byte* dst) {
  std::array<std::uint8_t, qk_k> codes;
  std::array<float, 16> scales, mins;
  float max_scale = 0.0f, max_min = 0.0f;
  for (int j = 0; j < 16; ++j) {
    std::array<float, 16> weights;
    for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
    const auto fit = fit_scale_min(x + 16 * j, weights.data(), 16, 3, -0.5f, 0.1f, 15, codes.data() + 16 * j, true);
    scales[j] = fit.scale;
    mins[j] = fit.min;
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  std::array<std::uint8_t, 16> sm{};
  std::uint16_t d16 = 0, dmin16 = 0;
  if (max_scale > 0.0f) {
    const float iscale = 15.0f / max_scale;
    for (int j = 0; j < 16; ++j) sm[j] = static_cast<std::uint8_t>(std::clamp(nearest_int(iscale * scales[j]), 0, 15));
    d16 = f32_to_f16(max_scale / 15.0f);
  }
  if (max_min > 0.0f) {
    const float iscale = 15.0f / max_min;
    for (int j = 0; j < 16; ++j) sm[j] = static_cast<std::uint8_t>(sm[j] | (std::clamp(nearest_int(iscale * mins[j]), 0, 15) << 4));
    dmin16 = f32_to_f16(max_min / 15.0f);
  }
  const float d = f16_to_f32(d16), dmin = f16_to_f32(dmin16);
  for (int j = 0; j < 16; ++j) {
    const float dl = d * static_cast<float>(sm[j] & 0x0f);
    if (dl == 0.0f) continue;
    const float ml = dmin * static_cast<float>(sm[j] >> 4);
    for (int i = 0; i < 16; ++i) codes[16 * j + i] = static_cast<std::uint8_t>(std::clamp(nearest_int((x[16 * j + i] + ml) / dl), 0, 3));
  }
  std::array<std::uint8_t, qk_k / 4> qs;
  for (int j = 0; j < qk_k; j += 128) {
    for (int l = 0; l < 32; ++l) {
      qs[j / 4 + l] = static_cast<std::uint8_t>(codes[j + l] | (codes[j + l + 32] << 2) | (codes[j + l + 64] << 4) | (codes[j + l + 96] << 6));
    }
  }
  block_writer w(dst);
  w.u8s(sm);
  w.u8s(qs);
  w.u16(d16);
  w.u16(dmin16);
}

// ggml's quantize_row_q6_K_ref: a symmetric fit per 16-element sub-block, the sixteen scales
// quantized to int8 against the one of largest magnitude (which becomes -128), then every element
// re-coded against its quantized scale.
void quantize_q6_k(const float* x, std::byte* dst) {
  std::array<std::uint8_t, qk_k> codes;
  std::array<float, 16> scales;
  float max_scale = 0.0f;
  float max_abs_scale = 0.0f;
  for (int ib = 0; ib < 16; ++ib) {
    scales[ib] = fit_symmetric(x + 16 * ib, 16, 32, codes.data() + 16 * ib);
    const float a = std::fabs(scales[ib]);
    if (a > max_abs_scale) {
      max_abs_scale = a;
      max_scale = scales[ib];
    }
  }
  block_writer w(dst);
  if (max_abs_scale < group_max_eps) {
    for (int i = 0; i < 210; ++i) w.u8(0);
    return;
  }
  const float iscale = -128.0f / max_scale;
  const std::uint16_t d16 = f32_to_f16(ieee_div(1.0f, iscale));
  const float d = f16_to_f32(d16);
  std::array<std::int8_t, 16> sc;
  for (int ib = 0; ib < 16; ++ib) {
    sc[ib] = static_cast<std::int8_t>(std::clamp(nearest_int(iscale * scales[ib]), -128, 127));
  }
  for (int j = 0; j < 16; ++j) {
    const float dl = d * static_cast<float>(sc[j]);
    if (dl == 0.0f) continue;
    for (int i = 0; i < 16; ++i) {
      const int l = std::clamp(nearest_int(x[16 * j + i] / dl), -32, 31);
      codes[16 * j + i] = static_cast<std::uint8_t>(l + 32);
    }
  }
  std::array<std::uint8_t, qk_k / 2> ql;
  std::array<std::uint8_t, qk_k / 4> qh;
  for (int half = 0; half < 2; ++half) {
    const std::uint8_t* c = codes.data() + 128 * half;
    for (int l = 0; l < 32; ++l) {
      ql[64 * half + l] = static_cast<std::uint8_t>((c[l] & 0x0f) | ((c[l + 64] & 0x0f) << 4));
      ql[64 * half + 32 + l] = static_cast<std::uint8_t>((c[l + 32] & 0x0f) | ((c[l + 96] & 0x0f) << 4));
      qh[32 * half + l] = static_cast<std::uint8_t>((c[l] >> 4) | ((c[l + 32] >> 4) << 2) |
                                                    ((c[l + 64] >> 4) << 4) | ((c[l + 96] >> 4) << 6));
    }
  }
  w.u8s(ql);
  w.u8s(qh);
  w.i8s(sc);
  w.u16(d16);
}

// ---------------------------------------------------------------------------------------------
// Plain float types: one element per "block".

void dequantize_f32(const std::byte* src, float* y) { *y = block_reader(src).f32(); }
void dequantize_f64(const std::byte* src, float* y) {
  block_reader r(src);
  const std::uint64_t lo = r.u32();
  const std::uint64_t hi = r.u32();
  *y = narrow_to_float(std::bit_cast<double>(lo | (hi << 32)));
}
void dequantize_f16(const std::byte* src, float* y) { *y = block_reader(src).f16(); }
void dequantize_bf16(const std::byte* src, float* y) { *y = bf16_to_f32(block_reader(src).u16()); }
void dequantize_e4m3(const std::byte* src, float* y) { *y = fp8_e4m3_to_f32(block_reader(src).u8()); }
void dequantize_e5m2(const std::byte* src, float* y) { *y = fp8_e5m2_to_f32(block_reader(src).u8()); }

void quantize_f32(const float* x, std::byte* dst) { block_writer(dst).f32(*x); }
void quantize_f64(const float* x, std::byte* dst) {
  const auto bits = std::bit_cast<std::uint64_t>(static_cast<double>(*x));
  block_writer w(dst);
  w.u32(static_cast<std::uint32_t>(bits & 0xffffffffu));
  w.u32(static_cast<std::uint32_t>(bits >> 32));
}
void quantize_f16(const float* x, std::byte* dst) { block_writer(dst).u16(f32_to_f16(*x)); }
void quantize_bf16(const float* x, std::byte* dst) { block_writer(dst).u16(f32_to_bf16(*x)); }
void quantize_e4m3(const float* x, std::byte* dst) { block_writer(dst).u8(f32_to_fp8_e4m3(*x)); }
void quantize_e5m2(const float* x, std::byte* dst) { block_writer(dst).u8(f32_to_fp8_e5m2(*x)); }

// ---------------------------------------------------------------------------------------------
// Dispatch. Block sizes come from the dtype table, which the codecs above must agree with.

using dequantize_block = void (*)(const std::byte*, float*);
using quantize_block = void (*)(const float*, std::byte*);

dequantize_block dequantizer(dtype t) {
  switch (t) {
    case dtype::f64: return dequantize_f64;
    case dtype::f32: return dequantize_f32;
    case dtype::f16: return dequantize_f16;
    case dtype::bf16: return dequantize_bf16;
    case dtype::fp8_e4m3: return dequantize_e4m3;
    case dtype::fp8_e5m2: return dequantize_e5m2;
    case dtype::q4_0: return dequantize_q4_0;
    case dtype::q4_1: return dequantize_q4_1;
    case dtype::q5_0: return dequantize_q5_0;
    case dtype::q5_1: return dequantize_q5_1;
    case dtype::q8_0: return dequantize_q8_0;
    case dtype::q8_1: return dequantize_q8_1;
    case dtype::q2_k: return dequantize_q2_k;
    case dtype::q3_k: return dequantize_q3_k;
    case dtype::q4_k: return dequantize_q4_k;
    case dtype::q5_k: return dequantize_q5_k;
    case dtype::q6_k: return dequantize_q6_k;
    case dtype::q8_k: return dequantize_q8_k;
    case dtype::mxfp4: return dequantize_mxfp4;
    case dtype::iq4_nl: return dequantize_iq4_nl;
    case dtype::iq4_xs: return dequantize_iq4_xs;
    case dtype::q4_a32: return dequantize_affine<16>;
    case dtype::q8_a32: return dequantize_affine<256>;
    case dtype::fp8_s32: return dequantize_fp8_s32;
    case dtype::i64:
    case dtype::i32:
    case dtype::i16:
    case dtype::i8:
    case dtype::u8:
    case dtype::boolean: return nullptr;
  }
  return nullptr;
}

quantize_block quantizer(dtype t) {
  switch (t) {
    case dtype::f64: return quantize_f64;
    case dtype::f32: return quantize_f32;
    case dtype::f16: return quantize_f16;
    case dtype::bf16: return quantize_bf16;
    case dtype::fp8_e4m3: return quantize_e4m3;
    case dtype::fp8_e5m2: return quantize_e5m2;
    case dtype::q4_0: return quantize_q4_0;
    case dtype::q4_1: return quantize_q4_1;
    case dtype::q5_0: return quantize_q5_0;
    case dtype::q5_1: return quantize_q5_1;
    case dtype::q8_0: return quantize_q8_0;
    case dtype::q8_k: return quantize_q8_k;
    case dtype::mxfp4: return quantize_mxfp4;
    case dtype::iq4_nl: return quantize_iq4_nl;
    case dtype::iq4_xs: return quantize_iq4_xs;
    case dtype::q4_a32: return quantize_affine<16>;
    case dtype::q8_a32: return quantize_affine<256>;
    case dtype::fp8_s32: return quantize_fp8_s32;
    case dtype::q4_k: return quantize_q45_k<false>;
    case dtype::q5_k: return quantize_q45_k<true>;
    case dtype::q3_k: return quantize_q3_k;
    case dtype::q2_k: return quantize_q2_k;
    case dtype::q6_k: return quantize_q6_k;
    default: return nullptr;
  }
}

result<void, quant_error> check_row(dtype t, std::int64_t n, bool supported) {
  if (!supported) return unexpected(quant_error{quant_error_code::unsupported_type, t, n});
  const auto elems = static_cast<std::int64_t>(info(t).block_elems);
  if (n < 0 || n % elems != 0) return unexpected(quant_error{quant_error_code::not_whole_blocks, t, n});
  return {};
}

}  // namespace

std::string quant_error::message() const {
  const std::string type_name(name(type));
  switch (code) {
    case quant_error_code::not_whole_blocks:
      return type_name + " rows hold whole blocks of " + std::to_string(info(type).block_elems) +
             " elements; got " + std::to_string(elems);
    case quant_error_code::unsupported_type:
      return "no conversion between f32 and " + type_name + " in this direction";
  }
  return "unknown quant error";
}

bool supports_dequantize(dtype t) { return dequantizer(t) != nullptr; }
bool supports_quantize(dtype t) { return quantizer(t) != nullptr; }

result<void, quant_error> dequantize_row(dtype t, const std::byte* src, float* dst, std::int64_t n) {
  const auto block = dequantizer(t);
  if (auto ok = check_row(t, n, block != nullptr); !ok) return ok;
  const auto& in = info(t);
  const auto elems = static_cast<std::int64_t>(in.block_elems);
  for (std::int64_t i = 0; i < n / elems; ++i) {
    block(src + static_cast<std::size_t>(i) * in.block_bytes, dst + i * elems);
  }
  return {};
}

result<void, quant_error> quantize_row(dtype t, const float* src, std::byte* dst, std::int64_t n) {
  const auto block = quantizer(t);
  if (auto ok = check_row(t, n, block != nullptr); !ok) return ok;
  const auto& in = info(t);
  const auto elems = static_cast<std::int64_t>(in.block_elems);
  for (std::int64_t i = 0; i < n / elems; ++i) {
    block(src + i * elems, dst + static_cast<std::size_t>(i) * in.block_bytes);
  }
  return {};
}

}  // namespace troupe
