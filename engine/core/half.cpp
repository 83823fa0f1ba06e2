#include "engine/core/half.hpp"

#include <bit>
#include <cmath>

namespace troupe {

float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = (h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1f;
  std::uint32_t mant = h & 0x3ffu;
  std::uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: value = mant * 2^-24
      const float v = std::ldexp(static_cast<float>(mant), -24);
      return sign ? -v : v;
    }
  } else {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(bits);
}

std::uint16_t f32_to_f16(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t exp = (x >> 23) & 0xff;
  std::uint32_t mant = x & 0x7fffffu;
  if (exp == 0xff) return sign | 0x7c00u | (mant ? 0x200u | (mant >> 13) : 0u);
  const int e = static_cast<int>(exp) - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00u;  // overflow to infinity
  if (e <= 0) {
    if (e < -10) return sign;  // underflows to zero (even after rounding)
    mant |= 0x800000u;
    const int shift = 14 - e;
    std::uint32_t half = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1);
    const std::uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return static_cast<std::uint16_t>(sign | half);
  }
  std::uint32_t half = (static_cast<std::uint32_t>(e) << 10) | (mant >> 13);
  const std::uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;  // may carry into the exponent: correct
  return static_cast<std::uint16_t>(sign | half);
}

float bf16_to_f32(std::uint16_t h) { return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16); }

std::uint16_t f32_to_bf16(float f) {
  std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>(x >> 16);
}

namespace {

// Decodes an fp8 value with `ebits` exponent bits and `mbits` mantissa bits and the given bias.
float fp8_decode(std::uint8_t v, int ebits, int mbits, int bias) {
  const bool neg = v & 0x80u;
  const int exp = (v >> mbits) & ((1 << ebits) - 1);
  const int mant = v & ((1 << mbits) - 1);
  float out;
  if (exp == 0)
    out = std::ldexp(static_cast<float>(mant), 1 - bias - mbits);
  else
    out = std::ldexp(static_cast<float>(mant + (1 << mbits)), exp - bias - mbits);
  return neg ? -out : out;
}

// Encodes by searching the nearest representable magnitude (ties to the even code). fp8 has 127
// magnitudes, so a direct search is exact and obviously correct.
std::uint8_t fp8_encode(float f, int ebits, int mbits, int bias, std::uint8_t max_code) {
  const std::uint8_t sign = std::signbit(f) ? 0x80u : 0u;
  const float a = std::fabs(f);
  std::uint8_t best = 0;
  float best_err = INFINITY;
  for (std::uint8_t c = 0; c <= max_code; ++c) {
    const float err = std::fabs(fp8_decode(c, ebits, mbits, bias) - a);
    if (err < best_err || (err == best_err && (c & 1u) == 0)) {
      best = c;
      best_err = err;
    }
  }
  return sign | best;
}

}  // namespace

float fp8_e4m3_to_f32(std::uint8_t v) {
  if ((v & 0x7fu) == 0x7fu) return NAN;
  return fp8_decode(v, 4, 3, 7);
}

std::uint8_t f32_to_fp8_e4m3(float f) {
  if (std::isnan(f)) return 0x7fu;
  return fp8_encode(f, 4, 3, 7, 0x7e);  // 0x7e = 448, the largest finite value
}

float fp8_e5m2_to_f32(std::uint8_t v) {
  const int exp = (v >> 2) & 0x1f;
  if (exp == 0x1f) {
    if (v & 0x3u) return NAN;
    return (v & 0x80u) ? -INFINITY : INFINITY;
  }
  return fp8_decode(v, 5, 2, 15);
}

std::uint8_t f32_to_fp8_e5m2(float f) {
  if (std::isnan(f)) return 0x7fu;
  if (std::isinf(f)) return f > 0 ? 0x7cu : 0xfcu;
  return fp8_encode(f, 5, 2, 15, 0x7b);  // 0x7b = 57344, the largest finite value
}

}  // namespace troupe
