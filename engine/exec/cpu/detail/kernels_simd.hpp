#pragma once
// The vector types the CPU kernels are written against: one struct of static functions per isa level,
// all with the same names, so a kernel is one template instantiated once per level. A level's struct
// exists only in translation units compiled for it (the *_avx2.cpp / *_avx512.cpp naming of
// CMakeLists.txt), which keeps its inline code out of the portable objects.
//
// Conventions every level keeps: `max(a, b)` and `min(a, b)` return b when either is NaN (the x86 rule,
// which the clamps of kernels_impl.hpp rely on to pass NaN through); masks come from comparisons and are
// consumed by `select(m, if_set, if_clear)`; `first(n)` is the mask of lanes [0, n) and `load_n` /
// `store_n` touch only those (n < width); `pow2i(n)` takes integral n in [-126, 127].
#include <cmath>
#include <cstdint>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "engine/core/half.hpp"

namespace troupe::exec::cpu::kernels_detail {

// Portable C++: one lane, the libm functions for the transcendental ones.
struct simd_scalar {
  using reg = float;
  using mask = bool;
  static constexpr int width = 1;
  static constexpr int acc_chunks = 8;  // independent accumulators in the P.V loop

  static reg zero() { return 0.0f; }
  static reg set1(float x) { return x; }
  static reg load(const float* p) { return *p; }
  static reg load_n(const float* p, std::int64_t n) { return n > 0 ? *p : 0.0f; }
  // Widening loads of a KV cache's stored elements (f16, bf16, int8 codes) and one f16 scalar.
  static reg load_f16(const std::uint16_t* p) { return f16_to_f32(*p); }
  static reg load_f16_n(const std::uint16_t* p, std::int64_t n) { return n > 0 ? f16_to_f32(*p) : 0.0f; }
  static reg load_bf16(const std::uint16_t* p) { return bf16_to_f32(*p); }
  static reg load_bf16_n(const std::uint16_t* p, std::int64_t n) { return n > 0 ? bf16_to_f32(*p) : 0.0f; }
  static reg load_i8(const std::int8_t* p) { return static_cast<float>(*p); }
  static float half(std::uint16_t h) { return f16_to_f32(h); }
  static void store_f16(std::uint16_t* p, reg v) { *p = f32_to_f16(v); }
  static void store(float* p, reg v) { *p = v; }
  static void store_n(float* p, reg v, std::int64_t n) {
    if (n > 0) *p = v;
  }
  static mask first(std::int64_t n) { return n > 0; }
  static reg add(reg a, reg b) { return a + b; }
  static reg sub(reg a, reg b) { return a - b; }
  static reg mul(reg a, reg b) { return a * b; }
  static reg div(reg a, reg b) { return a / b; }
  static reg fma(reg a, reg b, reg c) { return a * b + c; }
  static reg fnma(reg a, reg b, reg c) { return c - a * b; }
  static reg min(reg a, reg b) { return a < b ? a : b; }
  static reg max(reg a, reg b) { return a > b ? a : b; }
  static reg sqrt(reg a) { return sqrtf(a); }
  static reg abs(reg a) { return fabsf(a); }
  static reg neg(reg a) { return -a; }
  static reg copysign(reg mag, reg sgn) { return copysignf(mag, sgn); }
  static mask lt(reg a, reg b) { return a < b; }
  static mask eq(reg a, reg b) { return a == b; }
  static mask unordered(reg a, reg b) { return a != a || b != b; }
  static reg select(mask m, reg a, reg b) { return m ? a : b; }
  static float reduce_add(reg v) { return v; }
  static float reduce_max(reg v) { return v; }
  // Lane i of the result is the sum of the lanes of a[i], for the `width` inputs.
  static reg sum_lanes(const reg* a) { return a[0]; }
};

#if defined(__AVX2__)
// AVX2 + FMA: eight lanes. Masks are all-ones lanes of a float vector.
struct simd_avx2 {
  using reg = __m256;
  using mask = __m256;
  static constexpr int width = 8;
  static constexpr int acc_chunks = 8;  // two FMA pipes x four cycles of latency

  static reg zero() { return _mm256_setzero_ps(); }
  static reg set1(float x) { return _mm256_set1_ps(x); }
  static reg load(const float* p) { return _mm256_loadu_ps(p); }
  static __m256i tail(std::int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static reg load_n(const float* p, std::int64_t n) { return _mm256_maskload_ps(p, tail(n)); }
  static reg load_f16(const std::uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static __m128i load_u16_n(const std::uint16_t* p, std::int64_t n) {
    alignas(16) std::uint16_t b[8] = {};
    for (std::int64_t i = 0; i < n; ++i) b[i] = p[i];
    return _mm_load_si128(reinterpret_cast<const __m128i*>(b));
  }
  static reg load_f16_n(const std::uint16_t* p, std::int64_t n) { return _mm256_cvtph_ps(load_u16_n(p, n)); }
  static reg widen_bf16(__m128i h) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); }
  static reg load_bf16(const std::uint16_t* p) { return widen_bf16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static reg load_bf16_n(const std::uint16_t* p, std::int64_t n) { return widen_bf16(load_u16_n(p, n)); }
  static reg load_i8(const std::int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static float half(std::uint16_t h) { return _cvtsh_ss(h); }
  static void store_f16(std::uint16_t* p, reg v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static void store(float* p, reg v) { _mm256_storeu_ps(p, v); }
  static void store_n(float* p, reg v, std::int64_t n) { _mm256_maskstore_ps(p, tail(n), v); }
  static mask first(std::int64_t n) { return _mm256_castsi256_ps(tail(n)); }
  static reg add(reg a, reg b) { return _mm256_add_ps(a, b); }
  static reg sub(reg a, reg b) { return _mm256_sub_ps(a, b); }
  static reg mul(reg a, reg b) { return _mm256_mul_ps(a, b); }
  static reg div(reg a, reg b) { return _mm256_div_ps(a, b); }
  static reg fma(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
  static reg fnma(reg a, reg b, reg c) { return _mm256_fnmadd_ps(a, b, c); }
  static reg min(reg a, reg b) { return _mm256_min_ps(a, b); }
  static reg max(reg a, reg b) { return _mm256_max_ps(a, b); }
  static reg sqrt(reg a) { return _mm256_sqrt_ps(a); }
  static reg sign_bit() { return _mm256_set1_ps(-0.0f); }
  static reg abs(reg a) { return _mm256_andnot_ps(sign_bit(), a); }
  static reg neg(reg a) { return _mm256_xor_ps(sign_bit(), a); }
  static reg copysign(reg mag, reg sgn) {
    return _mm256_or_ps(_mm256_andnot_ps(sign_bit(), mag), _mm256_and_ps(sign_bit(), sgn));
  }
  static mask lt(reg a, reg b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
  static mask eq(reg a, reg b) { return _mm256_cmp_ps(a, b, _CMP_EQ_OQ); }
  static mask unordered(reg a, reg b) { return _mm256_cmp_ps(a, b, _CMP_UNORD_Q); }
  static reg select(mask m, reg a, reg b) { return _mm256_blendv_ps(b, a, m); }
  static reg round(reg a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static reg floor(reg a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); }
  static reg pow2i(reg n) {
    const __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    return _mm256_castsi256_ps(_mm256_slli_epi32(e, 23));
  }
  // For positive normal x: x = m * 2^e with m in [0.5, 1).
  static reg frexp(reg x, reg& e) {
    const __m256i bits = _mm256_castps_si256(x);
    e = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(bits, 23), _mm256_set1_epi32(126)));
    const __m256i m = _mm256_or_si256(_mm256_and_si256(bits, _mm256_set1_epi32(0x007fffff)), _mm256_set1_epi32(0x3f000000));
    return _mm256_castsi256_ps(m);
  }
  static float reduce_add(reg v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static float reduce_max(reg v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  // Eight dot-product accumulators to one vector of their sums: pairs, then quads within each 128-bit
  // half, then the halves (21 shuffles and adds for eight sums).
  static reg sum_lanes(const reg* a) {
    const reg b0 = _mm256_add_ps(_mm256_unpacklo_ps(a[0], a[1]), _mm256_unpackhi_ps(a[0], a[1]));
    const reg b1 = _mm256_add_ps(_mm256_unpacklo_ps(a[2], a[3]), _mm256_unpackhi_ps(a[2], a[3]));
    const reg b2 = _mm256_add_ps(_mm256_unpacklo_ps(a[4], a[5]), _mm256_unpackhi_ps(a[4], a[5]));
    const reg b3 = _mm256_add_ps(_mm256_unpacklo_ps(a[6], a[7]), _mm256_unpackhi_ps(a[6], a[7]));
    const reg c0 = _mm256_add_ps(_mm256_shuffle_ps(b0, b1, 0x44), _mm256_shuffle_ps(b0, b1, 0xEE));
    const reg c1 = _mm256_add_ps(_mm256_shuffle_ps(b2, b3, 0x44), _mm256_shuffle_ps(b2, b3, 0xEE));
    return _mm256_add_ps(_mm256_permute2f128_ps(c0, c1, 0x20), _mm256_permute2f128_ps(c0, c1, 0x31));
  }
  // sum_lanes over four accumulators (its a[0..3] or a[4..7]) to their four sums, summed in the order
  // sum_lanes sums them (pairs, quads within each half, then the halves), so each equals its lane of
  // sum_lanes bit for bit. Lets several queries share a block's key loads (kernels_impl.hpp
  // score_queries) with twelve accumulators, where eight keys a query would need 24.
  using quad = __m128;
  static quad sum_quad(reg a0, reg a1, reg a2, reg a3) {
    const reg b0 = _mm256_add_ps(_mm256_unpacklo_ps(a0, a1), _mm256_unpackhi_ps(a0, a1));
    const reg b1 = _mm256_add_ps(_mm256_unpacklo_ps(a2, a3), _mm256_unpackhi_ps(a2, a3));
    const reg c0 = _mm256_add_ps(_mm256_shuffle_ps(b0, b1, 0x44), _mm256_shuffle_ps(b0, b1, 0xEE));
    return _mm_add_ps(_mm256_castps256_ps128(c0), _mm256_extractf128_ps(c0, 1));
  }
  static void store_quad(float* p, quad v) { _mm_storeu_ps(p, v); }
  static reg swap_pairs(reg a) { return _mm256_permute_ps(a, 0xB1); }
};
#endif

#if defined(__AVX512F__)
// AVX-512 F/DQ: sixteen lanes and mask registers.
struct simd_avx512 {
  using reg = __m512;
  using mask = __mmask16;
  static constexpr int width = 16;
  static constexpr int acc_chunks = 4;  // one 512-bit FMA per cycle x four cycles of latency on Zen 4

  static reg zero() { return _mm512_setzero_ps(); }
  static reg set1(float x) { return _mm512_set1_ps(x); }
  static reg load(const float* p) { return _mm512_loadu_ps(p); }
  static mask tail(std::int64_t n) { return static_cast<mask>((1u << n) - 1u); }
  static reg load_n(const float* p, std::int64_t n) { return _mm512_maskz_loadu_ps(tail(n), p); }
  static reg load_f16(const std::uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static reg load_f16_n(const std::uint16_t* p, std::int64_t n) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(tail(n), p)); }
  static reg widen_bf16(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }
  static reg load_bf16(const std::uint16_t* p) { return widen_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static reg load_bf16_n(const std::uint16_t* p, std::int64_t n) { return widen_bf16(_mm256_maskz_loadu_epi16(tail(n), p)); }
  static reg load_i8(const std::int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static float half(std::uint16_t h) { return _cvtsh_ss(h); }
  static void store_f16(std::uint16_t* p, reg v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static void store(float* p, reg v) { _mm512_storeu_ps(p, v); }
  static void store_n(float* p, reg v, std::int64_t n) { _mm512_mask_storeu_ps(p, tail(n), v); }
  static mask first(std::int64_t n) { return tail(n); }
  static reg add(reg a, reg b) { return _mm512_add_ps(a, b); }
  static reg sub(reg a, reg b) { return _mm512_sub_ps(a, b); }
  static reg mul(reg a, reg b) { return _mm512_mul_ps(a, b); }
  static reg div(reg a, reg b) { return _mm512_div_ps(a, b); }
  static reg fma(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
  static reg fnma(reg a, reg b, reg c) { return _mm512_fnmadd_ps(a, b, c); }
  static reg min(reg a, reg b) { return _mm512_min_ps(a, b); }
  static reg max(reg a, reg b) { return _mm512_max_ps(a, b); }
  static reg sqrt(reg a) { return _mm512_sqrt_ps(a); }
  static reg abs(reg a) { return _mm512_abs_ps(a); }
  static reg neg(reg a) {
    return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(a), _mm512_set1_epi32(static_cast<int>(0x80000000u))));
  }
  static reg copysign(reg mag, reg sgn) {
    // Bitwise select on the sign bit: (sign mask & sgn) | (~sign mask & mag).
    return _mm512_castsi512_ps(_mm512_ternarylogic_epi32(_mm512_set1_epi32(static_cast<int>(0x80000000u)),
                                                         _mm512_castps_si512(sgn), _mm512_castps_si512(mag), 0xCA));
  }
  static mask lt(reg a, reg b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
  static mask eq(reg a, reg b) { return _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ); }
  static mask unordered(reg a, reg b) { return _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q); }
  static reg select(mask m, reg a, reg b) { return _mm512_mask_blend_ps(m, b, a); }
  static reg round(reg a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static reg floor(reg a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); }
  static reg pow2i(reg n) {
    const __m512i e = _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
    return _mm512_castsi512_ps(_mm512_slli_epi32(e, 23));
  }
  static reg frexp(reg x, reg& e) {
    const __m512i bits = _mm512_castps_si512(x);
    e = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_srli_epi32(bits, 23), _mm512_set1_epi32(126)));
    const __m512i m = _mm512_or_si512(_mm512_and_si512(bits, _mm512_set1_epi32(0x007fffff)), _mm512_set1_epi32(0x3f000000));
    return _mm512_castsi512_ps(m);
  }
  static float reduce_add(reg v) { return _mm512_reduce_add_ps(v); }
  static float reduce_max(reg v) { return _mm512_reduce_max_ps(v); }
  // Sixteen dot-product accumulators to one vector of their sums: pairs and quads within each 128-bit
  // lane, then two rounds across lanes (45 shuffles and adds for sixteen sums).
  static reg sum_lanes(const reg* a) {
    reg b[8];
    for (int i = 0; i < 8; ++i)
      b[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
    reg c[4];
    for (int i = 0; i < 4; ++i)
      c[i] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * i], b[2 * i + 1], 0x44), _mm512_shuffle_ps(b[2 * i], b[2 * i + 1], 0xEE));
    // c[i] holds, in 128-bit lane L, the partial sums over lane L of a[4i..4i+3].
    const reg e0 = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88), _mm512_shuffle_f32x4(c[0], c[1], 0xDD));
    const reg e1 = _mm512_add_ps(_mm512_shuffle_f32x4(c[2], c[3], 0x88), _mm512_shuffle_f32x4(c[2], c[3], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(e0, e1, 0x88), _mm512_shuffle_f32x4(e0, e1, 0xDD));
  }
  static reg swap_pairs(reg a) { return _mm512_permute_ps(a, 0xB1); }
};
#endif

}  // namespace troupe::exec::cpu::kernels_detail
